"""Next-token log-probabilities of a causal LM over given token ids (policy, reference, old).

One forward pass yields logits (B, T, V); the log-softmax is taken chunk by chunk over the
sequence (logsumexp + gather in float32), so at most one (B, chunk, V) float32 temporary exists
beside the model's own logits instead of full (B, T, V) log-softmax copies.
"""

import torch
from torch import Tensor, nn

__all__ = ["group_prefixes", "position_ids_from_mask", "token_logprobs"]


def group_prefixes(
    input_ids: Tensor, attention_mask: Tensor, prompt_width: int, group_ids: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Each group's prompt once: ids and mask (G, P) of the first row of each distinct group id
    (prompts left-padded to `prompt_width` P), and each row's group index (B,), for a forward
    that runs a prompt once and repeats its KV cache for the group's rows."""
    groups, inverse = torch.unique(group_ids, return_inverse=True)  # (G,), (B,)
    device = group_ids.device
    first_row = torch.full((len(groups),), input_ids.shape[0], dtype=torch.long, device=device)
    rows = torch.arange(len(inverse), device=device)
    first_row = first_row.scatter_reduce(0, inverse, rows, reduce="amin")
    prefix_ids = input_ids[first_row, :prompt_width]  # (G, P)
    assert torch.equal(prefix_ids[inverse], input_ids[:, :prompt_width]), "a group mixes prompts"
    return prefix_ids, attention_mask[first_row, :prompt_width], inverse


# The fewest tokens all of a batch's prompts must share before their start runs once for the
# batch (a chat template's system turn is ~30 tokens of SmolLM2's prompts).
COMMON_PREFIX_MIN = 8


def common_prefix_length(prompts: list[list[int]]) -> int:
    """How many first tokens every prompt shares, leaving each at least one of its own (its
    last token's logits predict what follows it)."""
    shortest = min(len(prompt) for prompt in prompts)
    first = prompts[0]
    length = 0
    while length < shortest - 1 and all(prompt[length] == first[length] for prompt in prompts):
        length += 1
    return length


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions counting only attended tokens (left padding gets 0) -> (B, T) long.

    Matches HF `generate`, so log-probs agree with those seen while sampling left-padded prompts.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int = 256,
) -> Tensor:
    """Log-prob of each next token: out[b, t] = log p(input_ids[b, t+1] | input_ids[b, :t+1]).

    Args:
        model: a HF-style causal LM returning `.logits` (B, T, V).
        input_ids, attention_mask: (B, T) prompt + response ids and their mask (any padding side).
        response_mask: optional (B, T-1) mask aligned with the output; positions outside it are 0.
        temperature: logits are divided by it (use the sampling temperature for PPO ratios).
        chunk_size: sequence positions per log-softmax chunk.
    Returns:
        (B, T-1) float32 log-probs; differentiable when called with grad enabled.
    """
    assert input_ids.shape == attention_mask.shape, f"{input_ids.shape} != {attention_mask.shape}"
    assert input_ids.shape[1] >= 2, f"need at least 2 tokens, got {input_ids.shape[1]}"
    assert temperature > 0, f"temperature must be > 0, got {temperature}"
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    logits = output.logits  # (B, T, V)
    targets = input_ids[:, 1:]  # (B, T-1)
    pieces = []
    for start in range(0, targets.shape[1], chunk_size):
        stop = min(start + chunk_size, targets.shape[1])
        chunk = logits[:, start:stop].float()  # (B, c, V)
        if temperature != 1.0:
            chunk = chunk / temperature
        picked = chunk.gather(-1, targets[:, start:stop, None]).squeeze(-1)  # (B, c)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    logp = torch.cat(pieces, dim=1)  # (B, T-1)
    if response_mask is not None:
        assert response_mask.shape == logp.shape, f"{response_mask.shape} != {logp.shape}"
        logp = logp * response_mask.to(logp.dtype)
    return logp
