"""The per-step data plan both controllers share, so their results match for the same seed.

Every process can rebuild the same plan: the prompt order is a seeded permutation, the sample
seeds and group ids are pure functions of (run seed, step, group, slot) (async_rollout.py).
Data-parallel group r owns the r-th contiguous slice of each draw of prompts (its shard). A
`Shard` is what flows from a sampler to a trainer: the RolloutBatch plus optional per-sample
features (the payload standing in for images or long traces, which is what makes a single
controller the bottleneck).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from yatt.algos.advantages import compute_advantages
from yatt.batch import RolloutBatch
from yatt.config import GROUP_ESTIMATORS

__all__ = [
    "Shard",
    "ShardRequest",
    "actor_terms",
    "batch_extremes",
    "batch_sums",
    "extremes_to_metrics",
    "make_features",
    "reduce_actor_metrics",
    "set_advantages",
    "sums_to_metrics",
]

_SUM_KEYS = ("rows", "score", "score_sq", "reward", "response_tokens", "tokens",
             "feature_bytes", "clipped", "advantage", "advantage_abs")  # fmt: skip


# How a policy rank's update metrics add up to the global batch's. Each rank's loss is already
# divided by the global normaliser, so the losses (and the feature checksum) sum; token and row
# means weigh each rank's by its tokens or rows (PolicyRole.metric_weights); the rest (grad
# norm after the all-reduce, learning rate, timings) are alike on every rank: their mean.
_ACTOR_SUMS = ("actor/pg_loss", "batch/feature_checksum")
_ACTOR_WEIGHTS = {"actor/clipfrac": "tokens", "actor/ppo_kl": "tokens", "actor/kl": "tokens",
                  "actor/clipfrac_lower": "tokens",
                  "actor/tis_mean": "trained_tokens", "actor/tis_capped_frac": "trained_tokens",
                  "actor/trained_rows_frac": "rows"}  # fmt: skip
_WEIGHT = "#weight"


def actor_terms(metrics: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
    """A rank's update `metrics` as terms that add up over ranks (each mean carries its weight
    as `<key>#weight`); `reduce_actor_metrics` of the terms' sums gives the global metrics."""
    terms = {}
    for key, value in metrics.items():
        if key in _ACTOR_SUMS:
            terms[key] = value
            continue
        weight = weights[_ACTOR_WEIGHTS[key]] if key in _ACTOR_WEIGHTS else 1.0
        terms[key], terms[key + _WEIGHT] = value * weight, weight
    return terms


def reduce_actor_metrics(summed: dict[str, float]) -> dict[str, float]:
    """The global update metrics from every rank's `actor_terms`, summed key by key (every
    rank reports the same keys; a mean over nothing, e.g. no trained row anywhere, is 0)."""
    return {
        key: value / summed[key + _WEIGHT] if summed.get(key + _WEIGHT) else value
        for key, value in summed.items()
        if not key.endswith(_WEIGHT)
    }


@dataclass(frozen=True)
class ShardRequest:
    """What data-parallel group `rank` samples at `step`: prompts, group ids, one seed per row,
    the response budget (0 = the sampler's configured one), and whether the sampler records
    the behaviour log-probs (async runs: the update's importance-sampling denominator)."""

    rank: int
    step: int
    prompt_indices: tuple[int, ...]
    group_ids: tuple[int, ...]
    seeds: tuple[int, ...]
    max_new_tokens: int = 0
    behaviour_logp: bool = False


@dataclass
class Shard:
    """One group's samples: `batch` (B rows) and `features` (B, payload_bytes) uint8; `gen_s`:
    the seconds the sampler spent generating them."""

    rank: int
    step: int
    batch: RolloutBatch
    features: Tensor
    gen_s: float = 0.0


def make_features(seeds: tuple[int, ...], payload_bytes: int) -> Tensor:
    """(B, payload_bytes) uint8 features, row i filled from seeds[i] (cheap and reproducible)."""
    features = torch.empty((len(seeds), payload_bytes), dtype=torch.uint8)
    for row, seed in enumerate(seeds):
        features[row].fill_(seed % 251)
    return features


def set_advantages(batch: RolloutBatch, estimator: str, norm_std: bool) -> None:
    """Fill batch.advantages (B, R) from batch.rewards with a group-local estimator."""
    # A shard holds whole groups, so these group-local advantages equal the global batch's;
    # config validation refuses the other estimators before any worker starts.
    assert estimator in GROUP_ESTIMATORS, f"{estimator!r} is not one of {GROUP_ESTIMATORS}"
    assert batch.rewards is not None, "advantages need rewards"
    advantages, _ = compute_advantages(
        estimator, rewards=batch.rewards, group_ids=batch.group_ids, norm_std=norm_std
    )
    batch.advantages = advantages.expand_as(batch.response_mask) * batch.response_mask


def _scores(batch: RolloutBatch) -> Tensor:
    """(B,) the scores before penalties (the rewards where no penalty applies)."""
    assert batch.rewards is not None, "metrics need rewards"
    return (batch.rewards if batch.scores is None else batch.scores).double()


def batch_sums(shard: Shard) -> Tensor:
    """(len(_SUM_KEYS),) float64 sums over the shard's rows; they add up across shards."""
    batch = shard.batch
    scores, rewards = _scores(batch), batch.rewards.double()  # type: ignore[union-attr]
    mask = batch.response_mask.double()
    advantages = torch.zeros_like(mask) if batch.advantages is None else batch.advantages.double()
    return torch.tensor([
        float(batch.size), float(scores.sum()), float((scores * scores).sum()),
        float(rewards.sum()), float(mask.sum()), float(batch.attention_mask.sum()),
        float(shard.features.numel()),
        float(sum(reason == "length" for reason in batch.finish_reasons)),
        float((advantages * mask).sum()), float((advantages.abs() * mask).sum()),
    ], dtype=torch.float64)  # fmt: skip


def batch_extremes(shard: Shard) -> Tensor:
    """(2,) float64 [max score, -min score] of the shard: their maximum over shards gives the
    global batch's (`extremes_to_metrics`)."""
    scores = _scores(shard.batch)
    return torch.stack([scores.max(), -scores.min()])


def extremes_to_metrics(extremes: Tensor) -> dict[str, float]:
    """`critic/score/max` and `/min` from the maximum of every shard's `batch_extremes`."""
    return {"critic/score/max": float(extremes[0]), "critic/score/min": -float(extremes[1])}


def sums_to_metrics(sums: Tensor) -> dict[str, float]:
    """Step metrics (the field's names) from summed `batch_sums` of every shard."""
    values = dict(zip(_SUM_KEYS, sums.tolist()))
    rows = max(values["rows"], 1.0)
    mean = values["score"] / rows
    tokens = max(values["response_tokens"], 1.0)
    return {
        "critic/score/mean": mean,
        "critic/score/std": max(values["score_sq"] / rows - mean * mean, 0.0) ** 0.5,
        "critic/rewards/mean": values["reward"] / rows,
        "critic/advantages/mean": values["advantage"] / tokens,
        "critic/advantages/abs_mean": values["advantage_abs"] / tokens,
        "response_length/mean": values["response_tokens"] / rows,
        "response_length/clip_ratio": values["clipped"] / rows,
        "batch/rows": values["rows"],
        "batch/tokens": values["tokens"],
        "batch/feature_bytes": values["feature_bytes"],
    }
