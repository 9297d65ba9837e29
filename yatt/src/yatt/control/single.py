"""Single controller (verl's HybridFlow driver): one process moves all the data.

The driver plans the step, collects every shard from the samplers, concatenates them into the
global batch (with every sample's features), scores and computes advantages on it, splits it
back and sends each policy rank its shard, then relays weights from rank 0 to the samplers. The
arithmetic is the parallel controller's (same shards, same samplers, same versions), so both
modes give the same weights for the same seed; what differs is where data and memory go.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from yatt.batch import RolloutBatch
from yatt.config import Config
from yatt.control.cluster import Cluster, build_cluster
from yatt.control.config import ControlConfig, make_reward_role, max_new_tokens_at
from yatt.control.controller import Controller
from yatt.control.rank import effective_staleness, sample_version
from yatt.control.shards import (
    Shard,
    ShardRequest,
    batch_sums,
    plan_shards,
    set_advantages,
    sums_to_metrics,
)
from yatt.control.workers import Future

__all__ = ["SingleController"]

logger = logging.getLogger(__name__)


class SingleController(Controller):
    """Drives samplers, reward and policy ranks from this process, holding the global batch."""

    mode = "single"

    def __init__(self, config: Config, control: ControlConfig, cluster: Cluster | None = None):
        from yatt.builders import build_data
        from yatt.trainer import PromptSampler

        super().__init__(config, control, cluster or build_cluster(config, control))
        train_set, _ = build_data(config.data)
        self.prompt_sampler = PromptSampler(len(train_set), config.data.seed + config.train.seed)
        self.reward = make_reward_role(config, control)
        self.n_ranks = len(self.cluster.ranks)
        separate = self.cluster.samplers is not None
        self.staleness = effective_staleness(control) if separate else 0
        self._planned: dict[int, list[ShardRequest]] = {}
        self._plan_step = 0
        self._pending: list[Future] | None = None
        self._last_step = config.train.steps - 1

    def fit(self, steps: int | None = None, progress: Any = None):
        self._last_step = (steps or self.config.train.steps) - 1
        return super().fit(steps, progress)

    def _requests(self, step: int) -> list[ShardRequest]:
        while step not in self._planned:
            indices = self.prompt_sampler.take(self.config.algo.prompts_per_step)
            self._planned[self._plan_step] = plan_shards(
                indices, self._plan_step, self.n_ranks, self.config.rollout.n_samples,
                self.config.train.seed, max_new_tokens_at(self.control, self._plan_step, 0),
            )  # fmt: skip
            self._plan_step += 1
        return self._planned.pop(step)

    def _submit_gen(self, step: int) -> list[Future]:
        version = sample_version(step, self.staleness)
        return [self.cluster.sampler_for(r.rank).submit("generate", r, version)
                for r in self._requests(step)]  # fmt: skip

    def _gather(self, step: int) -> list[Shard]:
        futures, self._pending = self._pending or self._submit_gen(step), None
        shards = [f.result() for f in futures]
        if self.staleness and step < self._last_step:
            self._pending = self._submit_gen(step + 1)
        return shards

    def step(self, step: int) -> dict[str, float]:
        timings: dict[str, float] = {}
        with _lap(timings, "gen"):
            shards = self._gather(step)
        with _lap(timings, "reward"):
            whole = RolloutBatch.concat([s.batch for s in shards])
            features = torch.cat([s.features for s in shards])  # the global payload, held here
            whole.rewards, _ = self.reward.score(whole)
        with _lap(timings, "adv"):
            set_advantages(whole, self.config.algo.name, self.config.algo.norm_std)
            parts = _split(whole, features, shards)
        with _lap(timings, "update_actor"):
            actor = self.cluster.ranks.call_each("update", [(p,) for p in parts])
        with _lap(timings, "update_weights"):
            self._sync_weights(step)
        metrics = sums_to_metrics(batch_sums(Shard(-1, step, whole, features)))
        metrics.update({k: sum(a[k] for a in actor) / len(actor) for k in sorted(actor[0])})
        return {**metrics, **timings}

    def _sync_weights(self, step: int) -> None:
        if self.cluster.samplers is None:
            return  # colocated samplers share the policy's module
        state = self.cluster.ranks.handles[0].call("weights")
        self.cluster.samplers.call_all("load_weights", step + 1, state)


def _split(whole: RolloutBatch, features: torch.Tensor, shards: list[Shard]) -> list[Shard]:
    """Per-rank shards again: the original batches with rewards and advantages filled in."""
    parts, first = [], 0
    for shard in shards:
        rows = slice(first, first + shard.batch.size)
        batch = shard.batch
        assert whole.rewards is not None and whole.advantages is not None
        batch.rewards = whole.rewards[rows].clone()
        batch.advantages = whole.advantages[rows, : batch.response_width].clone()
        parts.append(Shard(shard.rank, shard.step, batch, features[rows].clone()))
        first += shard.batch.size
    return parts


class _lap:
    """`with _lap(timings, name):` adds the block's wall seconds to timings["timing_s/name"]."""

    def __init__(self, timings: dict[str, float], name: str) -> None:
        self.timings, self.key = timings, f"timing_s/{name}"

    def __enter__(self) -> None:
        import time

        self.start_s = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        import time

        self.timings[self.key] = (
            self.timings.get(self.key, 0.0) + time.perf_counter() - self.start_s
        )
