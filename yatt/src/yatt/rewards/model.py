"""Bradley–Terry reward model: train a ScalarHeadModel on (chosen, rejected) text pairs and use
it to score completions (a batch scorer for CombinedReward).

Each text is tokenised, cut to its last `max_length` tokens and ended with EOS, so the score is
always read at an EOS token. Loss: -log sigmoid(s_chosen - s_rejected) (Ouyang et al. 2022).
"""

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rich.progress import Progress
from torch import Tensor

from yatt.algos.logprobs import COMMON_PREFIX_MIN, common_prefix_length
from yatt.algos.losses import bradley_terry_loss
from yatt.errors import ConfigError, ModelError
from yatt.heads import ScalarHeadModel

__all__ = ["RewardModelScorer", "encode_texts", "score_texts", "train_reward_model"]

logger = logging.getLogger(__name__)


def encode_texts(
    tokenizer: Any, texts: Sequence[str], max_length: int, device
) -> tuple[Tensor, Tensor]:
    """Right-padded ids and mask (N, L) of texts, each cut to its last max_length-1 tokens + EOS."""
    return _padded(_token_rows(tokenizer, texts, max_length), tokenizer, device)


def _token_rows(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of texts, each cut to its last max_length-1 tokens + EOS."""
    if max_length < 2:
        raise ConfigError(f"reward model max_length must be >= 2, got {max_length}")
    if tokenizer.eos_token_id is None:  # the score is read at the EOS each text ends with
        name = getattr(tokenizer, "name_or_path", "?")
        raise ModelError(f"reward model tokenizer {name!r} has no EOS token to score at")
    rows = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][-(max_length - 1) :]
        rows.append([*ids, tokenizer.eos_token_id])
    return rows


def _pad_id(tokenizer: Any) -> int:
    """The tokenizer's padding id, or its EOS where it has none."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _padded(
    rows: list[list[int]], tokenizer: Any, device, left: bool = False
) -> tuple[Tensor, Tensor]:
    """Ids and mask (N, L) of token rows, padded on the right (or `left`)."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), _pad_id(tokenizer), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        columns = slice(width - len(row), width) if left else slice(0, len(row))
        input_ids[index, columns] = torch.tensor(row, dtype=torch.long)
        mask[index, columns] = 1
    return input_ids.to(device), mask.to(device)


def _device(model: ScalarHeadModel) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def score_texts(
    model: ScalarHeadModel, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 16,
    max_length: int = 512, groups: Sequence[Any] | None = None,
) -> Tensor:  # fmt: skip
    """Reward-model scores (N,) float32 of full texts (prompt + completion), in eval mode;
    texts of one of `groups` (e.g. their prompt) share the pass over their common prefix
    (`grouped_scores`)."""
    was_training = model.training
    model.eval()
    scores = []
    for start in range(0, len(texts), batch_size):
        chunk = slice(start, start + batch_size)
        rows = _token_rows(tokenizer, texts[chunk], max_length)
        if groups is None:
            chunk_scores = model.sequence_scores(*_padded(rows, tokenizer, _device(model)))
        else:
            chunk_scores = grouped_scores(model, tokenizer, rows, groups[chunk])
        scores.append(chunk_scores.float().cpu())
    model.train(was_training)
    return torch.cat(scores) if scores else torch.zeros(0)


def _pair_step(model, tokenizer, batch, max_length) -> tuple[Tensor, float]:
    """BT loss and accuracy of one batch of (chosen, rejected) pairs."""
    texts = [chosen for chosen, _ in batch] + [rejected for _, rejected in batch]
    scores = pair_scores(model, tokenizer, _token_rows(tokenizer, texts, max_length))
    chosen, rejected = scores[: len(batch)], scores[len(batch) :]
    accuracy = float((chosen > rejected).float().mean())
    return bradley_terry_loss(chosen, rejected), accuracy


def pair_scores(model: ScalarHeadModel, tokenizer: Any, rows: list[list[int]]) -> Tensor:
    """Scores (2N,) of N chosen token rows then their N rejected ones, each pair's common
    prefix (its prompt) run once (`grouped_scores`)."""
    n = len(rows) // 2
    return grouped_scores(model, tokenizer, rows, [index % n for index in range(len(rows))])


def grouped_scores(
    model: ScalarHeadModel, tokenizer: Any, rows: list[list[int]], groups: Sequence[Any]
) -> Tensor:
    """Scores (B,) of token rows, rows of one group (`groups[b]`, e.g. their prompt) sharing
    one pass over their common token prefix (`shared_prefix_scores`: a prompt is most of a
    short response's tokens), and the start all the groups' prefixes share run once where it
    is `COMMON_PREFIX_MIN` tokens or more (`common_prefix_scores`); where a group shares no
    token, the rows run whole (`sequence_scores`). Equal up to rounding."""
    members: dict[Any, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    group_of = [0] * len(rows)
    shared = []  # each suffix keeps one token at least (the EOS every row ends with)
    for position, indices in enumerate(members.values()):
        shared.append(common_prefix_length([rows[index] for index in indices]))
        for index in indices:
            group_of[index] = position
    device = _device(model)
    if not shared or min(shared) < 1:
        return model.sequence_scores(*_padded(rows, tokenizer, device))
    prefixes = [rows[indices[0]][:width] for indices, width in zip(members.values(), shared)]
    suffixes = [row[shared[group_of[index]] :] for index, row in enumerate(rows)]
    suffix_ids, suffix_mask = _padded(suffixes, tokenizer, device)
    of = torch.tensor(group_of, device=device)
    start = common_prefix_length(prefixes) if len(prefixes) > 1 else 0
    if start >= COMMON_PREFIX_MIN:  # every prompt begins alike (a chat template's system turn)
        return model.common_prefix_scores(prefixes, start, _pad_id(tokenizer), suffix_ids,
                                          suffix_mask, of)  # fmt: skip
    prefix_ids, prefix_mask = _padded(prefixes, tokenizer, device, left=True)
    return model.shared_prefix_scores(prefix_ids, prefix_mask, suffix_ids, suffix_mask, of)


def _check_pairs(pairs: Sequence[tuple[str, str]]) -> None:
    if not pairs:
        raise ConfigError("train_reward_model needs at least one (chosen, rejected) pair")
    for index, pair in enumerate(pairs):
        if len(pair) != 2 or not all(isinstance(text, str) for text in pair):
            raise ConfigError(
                f"preference pair {index} must be (chosen: str, rejected: str), got {pair!r}"
            )


def train_reward_model(
    model: ScalarHeadModel,
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    *,
    epochs: int = 1,
    steps: int | None = None,
    batch_size: int = 8,
    lr: float = 1e-4,
    weight_decay: float = 0.0,
    max_length: int = 512,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    show_progress: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Train `model` in place with the Bradley–Terry loss; returns per-step {"loss", "accuracy",
    "step_s"} (`on_step(step, them)` gets each as it ends, steps counted from 1).

    pairs: (chosen_text, rejected_text), each a full prompt + completion. `steps` optimizer
    steps of `batch_size` pairs (default: `epochs` passes over the pairs), each pass in an
    order shuffled by `seed`; AdamW with gradient clipping. Raises ConfigError for empty or
    malformed pairs.
    """
    _check_pairs(pairs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    per_pass = (len(pairs) + batch_size - 1) // batch_size
    n_steps = epochs * per_pass if steps is None else steps
    history: list[dict[str, float]] = []
    model.train()
    with Progress(disable=not show_progress) as progress:
        task = progress.add_task("reward model", total=n_steps)
        while len(history) < n_steps:
            order = torch.randperm(len(pairs), generator=generator).tolist()
            for start in range(0, len(pairs), batch_size):
                start_s = time.perf_counter()
                batch = [pairs[index] for index in order[start : start + batch_size]]
                loss, accuracy = _pair_step(model, tokenizer, batch, max_length)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                optimizer.step()
                metrics = {"loss": loss.item(), "accuracy": accuracy,
                           "step_s": time.perf_counter() - start_s}  # fmt: skip
                history.append(metrics)
                progress.update(task, advance=1, description=f"rm loss {loss.item():.3f}")
                if on_step is not None:
                    on_step(len(history), metrics)
                if len(history) == n_steps:
                    break
            logger.info("reward model: %d steps, last loss %.4f", len(history), history[-1]["loss"])
    model.eval()
    return history


class RewardModelScorer:
    """Batch scorer for CombinedReward: the BT model's score of prompt + completion."""

    name = "reward_model"

    def __init__(self, model: ScalarHeadModel, tokenizer: Any, *, batch_size: int = 16,
                 max_length: int = 512) -> None:  # fmt: skip
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_length = batch_size, max_length

    def score_batch(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[dict]
    ) -> list[float]:
        """Scores (one float per row) of prompt + completion texts, the rows of one prompt
        sharing the pass over it; rows are unused."""
        texts = [prompt + completion for prompt, completion in zip(prompts, completions)]
        scores = score_texts(
            self.model,
            self.tokenizer,
            texts,
            batch_size=self.batch_size,
            max_length=self.max_length,
            groups=list(prompts),
        )
        return scores.tolist()
