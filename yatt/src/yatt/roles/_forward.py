"""Response-only forward passes shared by the policy, reference and critic roles.

Rows are `[left-padded prompt P][right-padded response R]` (see yatt.batch). Only the R+1 last
positions go through the LM head (`logits_to_keep`): the prompt's logits are never needed, and the
head is about a fifth of SmolLM2-135M's per-token compute.
"""

import torch
from torch import Tensor

from yatt.algos.logprobs import (
    COMMON_PREFIX_MIN,
    common_prefix_length,
    group_prefixes,
    position_ids_from_mask,
)
from yatt.models import forward_after_common_start, forward_on_prefix_cache


def trim_columns(
    input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor, prompt_width: int
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Drop prompt columns that are padding in every row and response columns past the longest
    response. Returns the trimmed (input_ids, attention_mask, response_mask, prompt_width)."""
    prompt_used = attention_mask[:, :prompt_width].bool().any(dim=0)  # (P,)
    first = int(prompt_used.nonzero()[0]) if bool(prompt_used.any()) else prompt_width - 1
    response_len = max(int(response_mask.sum(dim=1).max()), 1)
    end = prompt_width + response_len
    return (
        input_ids[:, first:end],
        attention_mask[:, first:end],
        response_mask[:, :response_len],
        prompt_width - first,
    )


def checkpoint_layers(model: torch.nn.Module) -> None:
    """Gradient checkpointing for `model` (an HF model): in a training forward with gradients,
    each decoder layer keeps only its input, and the backward pass runs the layer again to get
    the rest. Non-reentrant, so it works where no input needs a gradient (frozen embeddings
    under LoRA). HF drops a KV cache passed to a checkpointed layer, so a caller runs whole
    rows (`response_logits`), not `shared_prefix_logits` or `common_prefix_logits`, in such a
    forward."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def response_logits(model, input_ids: Tensor, attention_mask: Tensor, prompt_width: int) -> Tensor:
    """Logits (B, R, V) predicting each response token (column P+t is predicted at P+t-1)."""
    response_width = input_ids.shape[1] - prompt_width
    assert response_width >= 1, f"no response columns (width {input_ids.shape[1]})"
    assert prompt_width >= 1, "a response needs at least one prompt token before it"
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=response_width + 1,
        use_cache=False,
    )
    logits = output.logits[:, :-1]  # (B, R, V)
    assert logits.shape[1] == response_width, f"{tuple(logits.shape)} vs R={response_width}"
    return logits


def shared_prefix_logits(
    model, input_ids: Tensor, attention_mask: Tensor, prompt_width: int, group_ids: Tensor
) -> Tensor:
    """Like `response_logits`, but each distinct prompt (one per group id) goes through the
    model once and its KV cache is repeated for the group's rows; gradients flow through the
    shared prompt pass, so loss and gradient equal the row-by-row ones (up to rounding)."""
    response_width = input_ids.shape[1] - prompt_width
    assert response_width >= 1 and prompt_width >= 1, f"P={prompt_width} R={response_width}"
    prefix_ids, prefix_mask, inverse = group_prefixes(
        input_ids, attention_mask, prompt_width, group_ids
    )
    output = model(input_ids=prefix_ids, attention_mask=prefix_mask,
                   position_ids=position_ids_from_mask(prefix_mask), use_cache=True,
                   logits_to_keep=1)  # fmt: skip
    first_logits = output.logits[inverse]  # (b, 1, V): predicts response token 0
    if response_width == 1:
        return first_logits
    full_mask = attention_mask[:, : prompt_width + response_width - 1]
    output = forward_on_prefix_cache(model, output, inverse, input_ids[:, prompt_width:-1],
                                     full_mask)  # fmt: skip
    logits = torch.cat([first_logits, output.logits], dim=1)  # (b, R, V)
    assert logits.shape[1] == response_width, f"{tuple(logits.shape)} vs R={response_width}"
    return logits


def response_token_logprobs(
    model, prompts: list[list[int]], responses: list[list[int]], groups: Tensor | None = None,
    *, common_start: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Log-prob (B, R) of each response token after its prompt, from token lists, and the
    response mask (B, R), in one pass over the rows (padded as `yatt.batch` pads them); rows
    of one of `groups` (B,), which share their prompt, run it once (`shared_prefix_logits`).
    With `common_start`, where every prompt begins with the same `COMMON_PREFIX_MIN` tokens or
    more (a chat template's system turn), that beginning runs once for the whole batch
    (`common_prefix_logits`)."""
    from yatt.batch import RolloutBatch

    if common_start:
        common = common_prefix_length(prompts)
        if common >= COMMON_PREFIX_MIN:
            rows = torch.arange(len(prompts)) if groups is None else groups
            return common_prefix_logits(model, prompts, responses, rows, common)
    batch = RolloutBatch.from_token_lists(prompts, responses)
    ids, attention, mask, prompt_width = trim_columns(
        batch.input_ids, batch.attention_mask, batch.response_mask, batch.prompt_width
    )
    if groups is None:
        logits = response_logits(model, ids, attention, prompt_width)
    else:
        logits = shared_prefix_logits(model, ids, attention, prompt_width, groups)
    logp, _ = token_logprobs_and_entropy(logits, ids[:, prompt_width:], 1.0, False)
    return logp, mask


def common_prefix_logits(
    model, prompts: list[list[int]], responses: list[list[int]], groups: Tensor, common: int
) -> tuple[Tensor, Tensor]:
    """`response_token_logprobs` in three passes that share work through KV caches: the
    prompts' `common` first tokens once, each group's rest of its prompt once (left-padded, on
    that cache), then the responses (right-padded, each on its group's cache). Gradients flow
    through every cache, so log-probs and gradients equal the whole rows' (up to rounding)."""
    _, inverse = torch.unique(groups, return_inverse=True)
    first_row: dict[int, int] = {}  # group index -> its first row
    for row, group in enumerate(inverse.tolist()):
        first_row.setdefault(group, row)
    prefixes = [prompts[first_row[group]] for group in range(len(first_row))]
    output, rest_mask = forward_after_common_start(model, prefixes, common, 0,
                                                   logits_to_keep=1)  # fmt: skip
    first_logits = output.logits[inverse]  # (B, 1, V): predicts each response's first token
    width = max(max(len(response) for response in responses), 1)
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width)
    for row, response in enumerate(responses):
        ids[row, : len(response)] = torch.tensor(response, dtype=torch.long)
        mask[row, : len(response)] = 1
    logits = first_logits
    if width > 1:
        full_mask = torch.cat([rest_mask[inverse], mask[:, :-1].long()], dim=1)
        output = forward_on_prefix_cache(model, output, inverse, ids[:, :-1], full_mask)
        logits = torch.cat([first_logits, output.logits], dim=1)  # (B, R, V)
    logp, _ = token_logprobs_and_entropy(logits, ids, 1.0, False)
    return logp, mask


def token_logprobs_and_entropy(
    logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of `targets` (B, R) under softmax(logits / temperature), and the entropy (B, R)
    (detached; None unless asked)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, R)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = log_norm - (probs * logits).sum(-1)
    return logp, entropy


def chunks(rows: list[int], size: int) -> list[list[int]]:
    """`rows` split into consecutive lists of at most `size`."""
    assert size >= 1, f"chunk size {size}"
    return [rows[i : i + size] for i in range(0, len(rows), size)]
