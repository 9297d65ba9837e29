"""Single controller (verl's HybridFlow driver): one process moves all the data.

The driver plans the step, collects every shard from the samplers and scores it (rule rewards
on the driver; a reward model or a batch scorer such as an LLM judge on the reward workers, each
shard sent there and back; over-dispatch, aborts and DAPO refills run here, per data-parallel
group, as in async_rollout.py),
concatenates them into the global batch (with every sample's features), computes advantages
on it, splits it back and sends each policy rank its shard, then relays weights from rank 0 to
the samplers. The arithmetic is the parallel controller's (same shards, same samplers, same
versions), so both modes give the same weights for the same seed; what differs is where data
and memory go.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from yatt.batch import RolloutBatch
from yatt.config import Config
from yatt.control.async_rollout import (
    QueueState,
    RolloutStats,
    StepDispatch,
    make_group_rollout,
    reward_means,
)
from yatt.control.cluster import Cluster, build_cluster
from yatt.control.config import ControlConfig, driver_scores, make_reward_role
from yatt.control.controller import Controller, closing_on_error
from yatt.control.rank import effective_staleness, sample_version
from yatt.control.shards import (
    Shard,
    ShardRequest,
    batch_extremes,
    batch_sums,
    extremes_to_metrics,
    reduce_actor_metrics,
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
        super().__init__(config, control, cluster or build_cluster(config, control))
        with closing_on_error(self.cluster, owned=cluster is None):
            scores = driver_scores(config, control)
            self.reward = make_reward_role(config, control) if scores else None
            self.n_ranks = len(self.cluster.ranks)
            separate = self.cluster.samplers is not None
            self.staleness = effective_staleness(control) if separate else 0
            self.groups = [
                make_group_rollout(config, control, self.n_ranks, rank, 0, self.staleness)
                for rank in range(self.n_ranks)
            ]
        self._inflight: dict[int, list[StepDispatch]] = {}
        self.last_step = config.train.steps - 1
        self.first_step = 0  # the step a resumed run starts from (its weights' version)

    def fit(self, steps: int | None = None, progress: Any = None, start_step: int = 0):
        self.last_step = (steps or self.config.train.steps) - 1
        return super().fit(steps, progress, start_step)

    def _submit_gen(self, request: ShardRequest, version: int) -> Future:
        return self.cluster.sampler_for(request.rank).submit("generate", request, version)

    def _score(self, shard: Shard) -> tuple[torch.Tensor, dict[str, float]]:
        if self.reward is None:  # a reward model, on its workers' devices
            return self.cluster.reward_for(shard.rank).call("score", shard)
        rewards, metrics = self.reward.score(shard.batch)  # on the driver, as verl's manager
        return rewards, self.reward.summable_metrics(metrics)

    def _dispatch(self, steps: range) -> None:
        for ahead in steps:
            if ahead not in self._inflight:
                version = sample_version(ahead, self.staleness, self.first_step)
                self._inflight[ahead] = [g.dispatch(ahead, version, self._submit_gen)
                                         for g in self.groups]  # fmt: skip

    def _gather(self, step: int) -> tuple[list[Shard], list[RolloutStats]]:
        """Every group's shard of `step`; then steps step+1..step+k are dispatched (in the
        parallel controllers' order, so both modes draw the same prompts)."""
        self._dispatch(range(step, step + 1))
        collected = [
            group.collect(dispatch, self._submit_gen, self._score, time.perf_counter)
            for group, dispatch in zip(self.groups, self._inflight.pop(step))
        ]
        self._dispatch(range(step + 1, min(step + self.staleness, self.last_step) + 1))
        assert len(self._inflight) <= self.staleness, f"{len(self._inflight)} in flight"
        return [shard for shard, _ in collected], [stats for _, stats in collected]

    def queue_states(self) -> list[QueueState]:
        steps = sorted(self._inflight)
        return [group.queue_state([self._inflight[step][rank] for step in steps])
                for rank, group in enumerate(self.groups)]  # fmt: skip

    def resume_queues(self, draws: int, shares: list[list[int]], step: int) -> None:
        assert not self._inflight, f"{len(self._inflight)} steps in flight at a resume"
        self.first_step = step
        for group, share in zip(self.groups, shares, strict=True):
            group.resume(draws, share)

    def step(self, step: int) -> dict[str, float]:
        timings: dict[str, float] = {}
        with _lap(timings, "gen"):
            shards, stats = self._gather(step)
        score_s = sum(s.score_s for s in stats)
        timings["timing_s/gen"] -= score_s
        timings["timing_s/reward"] = score_s
        with _lap(timings, "adv"):
            whole = RolloutBatch.concat([s.batch for s in shards])
            features = torch.cat([s.features for s in shards])  # the global payload, held here
            set_advantages(whole, self.config.algo.estimator, self.config.algo.norm_std)
            parts = _split(whole, features, shards)
        with _lap(timings, "update_actor"):
            actor = self.cluster.ranks.call_each("update", [(p,) for p in parts])
        with _lap(timings, "update_weights"):
            self._sync_weights(step)
        global_shard = Shard(-1, step, whole, features)
        metrics = sums_to_metrics(batch_sums(global_shard))
        metrics.update(extremes_to_metrics(batch_extremes(global_shard)))
        counts = [s.metrics() for s in stats]
        metrics.update(reward_means({key: sum(c[key] for c in counts) for key in counts[0]}))
        metrics.update(reduce_actor_metrics({k: sum(a[k] for a in actor) for k in actor[0]}))
        metrics["control/staleness"] = float(stats[0].staleness)
        return {**metrics, **timings}

    def _sync_weights(self, step: int) -> None:
        if self.cluster.samplers is None:
            return  # colocated samplers share the policy's module
        state = self.cluster.ranks.handles[0].call("weights", True)
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
        self.start_s = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.key] = (
            self.timings.get(self.key, 0.0) + time.perf_counter() - self.start_s
        )
