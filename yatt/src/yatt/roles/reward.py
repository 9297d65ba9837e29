"""Reward role: rule functions (and optionally a Bradley–Terry model) combined with weights.

Scores are sequence-level floats (B,); shaping that depends on lengths (DAPO's overlong penalty)
is applied after scoring, by the trainer or by each controller group for its shard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from yatt.batch import RolloutBatch
from yatt.config import RewardConfig
from yatt.roles.base import Role

__all__ = ["RewardRole"]


class RewardRole(Role):
    """`score(batch)` -> (rewards (B,), metrics) from a CombinedReward."""

    name = "reward"

    def __init__(self, config: RewardConfig, extra: list[tuple[Any, float]] = (),
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        """Rule functions `config.fns` with `config.weights`, a Bradley–Terry model from
        `config.model_path` (weight `model_weight`, on `device`: the role's own) if set, and
        any `extra` (scorer, weight) pairs such as a generative judge."""
        from yatt.rewards import CombinedReward

        parts: list[tuple[Any, float]] = list(zip(config.fns, config.weights)) + list(extra)
        if config.model_path:
            scorer = _reward_model_scorer(config.model_path, device)
            parts.append((scorer, config.model_weight))
        self.combined = CombinedReward(parts)

    def score(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, float]]:
        assert len(batch.completions) == batch.size, "batch has no completion texts"
        rows = [dict(row) for row in batch.rows] if batch.rows else [{}] * batch.size
        scores = self.combined(batch.prompts, batch.completions, rows)
        assert len(scores) == batch.size, f"{len(scores)} scores for {batch.size} rows"
        metrics = dict(getattr(self.combined, "last_metrics", {}) or {})
        return torch.tensor(scores, dtype=torch.float32), metrics

    def summable_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """`score`'s metrics as every rank of a distributed run reports them: the `reward/*`
        means, and each declared scorer count (`CombinedReward.counted_metrics`), 0 where a
        call left it out, so that every call gives the same keys."""
        names = [f"reward/{part[0]}/mean" for part in self.combined.parts]
        means = {key: float(metrics[key]) for key in [*names, "reward/total/mean"]}
        counted = self.combined.counted_metrics
        return means | {name: float(metrics.get(name, 0.0)) for name in counted}


def _reward_model_scorer(path: str, device: torch.device | str) -> Any:
    """A CombinedReward batch scorer around a saved Bradley–Terry ScalarHeadModel folder."""
    from yatt.heads import ScalarHeadModel
    from yatt.models import load_tokenizer
    from yatt.rewards.model import RewardModelScorer

    model = ScalarHeadModel.from_pretrained(path, trained_head="reward.model_path")
    model = model.to(device).eval()
    return RewardModelScorer(model, load_tokenizer(path))
