"""Parallel controllers (WeChat-YATT): one controller per data-parallel group of the policy.

Each policy rank plans its own shard of every step, asks its sampler and reward service for
samples and scores, computes advantages, trains, and pushes weights to the sampler it owns. No
process holds the global batch; the only global operations are collectives (gradient all-reduce,
loss normaliser, metric reduction). The driver only says "run step t" and receives the reduced
metrics (a few hundred bytes).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from yatt.control.cluster import Cluster, build_cluster
from yatt.control.config import ControlConfig, max_new_tokens_at
from yatt.control.controller import Controller
from yatt.control.rank import RankWorker, effective_staleness, sample_version
from yatt.control.shards import (
    Shard,
    ShardRequest,
    batch_sums,
    plan_shards,
    set_advantages,
    sums_to_metrics,
)

__all__ = ["ParallelController", "ParallelRank"]

logger = logging.getLogger(__name__)


class ParallelRank(RankWorker):
    """A policy rank that is also the controller of its data-parallel group."""

    def _request(self, step: int) -> ShardRequest:
        """This group's shard of `step` (plans steps in order: the prompt order is shared)."""
        assert step >= self._plan_step - 1, f"step {step} was planned and consumed already"
        while step not in self._planned:
            indices = self.prompt_sampler.take(self.config.algo.prompts_per_step)
            budget = max_new_tokens_at(self.control, self._plan_step, 0)
            plan = plan_shards(
                indices,
                self._plan_step,
                self.world,
                self.config.rollout.n_samples,
                self.config.train.seed,
                budget,
            )
            self._planned[self._plan_step] = plan[self.rank]
            self._plan_step += 1
        return self._planned.pop(step)

    def _call(self, handle: Any, method: str, *args: Any) -> Any:
        return getattr(self, method)(*args) if handle is None else handle.call(method, *args)

    def _shard(self, step: int, last_step: int) -> Shard:
        """The samples of `step`: prefetched one step ahead when the sampler runs elsewhere."""
        staleness = effective_staleness(self.control) if self.sampler is not None else 0
        if self._pending is not None:
            shard, self._pending = self._pending.result(), None
        else:
            version = sample_version(step, staleness, self.first_step)
            shard = self._call(self.sampler, "generate", self._request(step), version)
        assert shard.step == step, f"got samples of step {shard.step} at step {step}"
        if staleness and step < last_step:
            version = sample_version(step + 1, staleness, self.first_step)
            self._pending = self.sampler.submit("generate", self._request(step + 1), version)
        return shard

    def run_step(self, step: int, last_step: int) -> dict[str, float]:
        """One step of this group; every rank returns the same globally reduced metrics."""
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[f"timing_s/{name}"] = now - clock
            clock = now

        shard = self._shard(step, last_step)
        lap("gen")
        shard.batch.rewards = self._call(self.reward_service, "score", shard)
        lap("reward")
        set_advantages(shard.batch, self.config.algo.name, self.config.algo.norm_std)
        lap("adv")
        actor = self.update(shard)
        lap("update_actor")
        self._sync_weights(step)
        lap("update_weights")
        metrics = self._reduce(batch_sums(shard), actor)
        lap("reduce")
        return {**metrics, **timings}

    def _sync_weights(self, step: int) -> None:
        if self.sampler is not None and self.owns_sampler:
            self.sampler.call("load_weights", step + 1, self.weights())
        if self.collective is not None:
            self.collective.barrier()  # every sampler holds version step+1 before anyone asks

    def _reduce(self, sums: torch.Tensor, actor: dict[str, float]) -> dict[str, float]:
        keys = sorted(actor)
        vector = torch.cat([sums, torch.tensor([actor[k] for k in keys], dtype=torch.float64)])
        if self.collective is not None:
            vector = self.collective.sum_tensor(vector)
        n_sums = sums.numel()
        metrics = sums_to_metrics(vector[:n_sums])
        metrics.update({k: float(v) / self.world for k, v in zip(keys, vector[n_sums:])})
        return metrics


class ParallelController(Controller):
    """Starts one ParallelRank per policy device and drives them step by step."""

    mode = "parallel"

    def __init__(self, config, control: ControlConfig, cluster: Cluster | None = None) -> None:
        cluster = cluster or build_cluster(config, control, ParallelRank)
        super().__init__(config, control, cluster)
        n_ranks = len(cluster.ranks)
        connections = []
        for rank in range(n_ranks):
            if cluster.samplers is None:
                connections.append((None, None, False))
            else:
                connections.append(
                    (
                        cluster.sampler_for(rank),
                        cluster.reward_for(rank),
                        cluster.owns_sampler(rank),
                    )
                )
        cluster.ranks.call_each("connect", connections)
        self._last_step = config.train.steps - 1

    def fit(self, steps: int | None = None, progress: Any = None):
        self._last_step = (steps or self.config.train.steps) - 1
        return super().fit(steps, progress)

    def step(self, step: int) -> dict[str, float]:
        results = self.cluster.ranks.call_all("run_step", step, self._last_step)
        return results[0]
