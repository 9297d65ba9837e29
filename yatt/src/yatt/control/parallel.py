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
import zlib
from typing import Any

import torch

from yatt.control.async_rollout import (
    QueueState,
    RolloutStats,
    StepDispatch,
    make_group_rollout,
    reward_means,
)
from yatt.control.cluster import Cluster, build_cluster
from yatt.control.config import ControlConfig
from yatt.control.controller import Controller, closing_on_error
from yatt.control.rank import RankWorker, effective_staleness, sample_version
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
from yatt.control.workers import Future, call_now

__all__ = ["ParallelController", "ParallelRank"]

logger = logging.getLogger(__name__)


class ParallelRank(RankWorker):
    """A policy rank that is also the controller of its data-parallel group."""

    def connect(self, sampler: Any, reward_service: Any, owns_sampler: bool,
                sampler_shared: bool = False) -> None:  # fmt: skip
        """Parallel mode: the sampler and reward handles this group calls (None = self),
        whether other groups call that sampler too, and this group's prompt queue and rollout
        (async_rollout.py)."""
        super().connect(sampler, reward_service, owns_sampler)
        self.sampler_shared = sampler_shared
        self._push: Future | None = None  # the weight push still in flight
        self.group = make_group_rollout(self.config, self.control, self.world, self.rank,
                                        self.first_step, self.staleness)  # fmt: skip
        self._inflight: dict[int, StepDispatch] = {}

    @property
    def staleness(self) -> int:
        return effective_staleness(self.control) if self.sampler is not None else 0

    def _call(self, handle: Any, method: str, *args: Any) -> Any:
        return getattr(self, method)(*args) if handle is None else handle.call(method, *args)

    def _submit_gen(self, request: ShardRequest, version: int) -> Future:
        if self.sampler is None:
            return call_now(self.generate, request, version)
        return self.sampler.submit("generate", request, version)

    def _score(self, shard: Shard) -> tuple[torch.Tensor, dict[str, float]]:
        return self._call(self.reward_service, "score", shard)

    def _dispatch(self, steps: range) -> None:
        for ahead in steps:
            if ahead not in self._inflight:
                version = sample_version(ahead, self.staleness, self.first_step)
                self._inflight[ahead] = self.group.dispatch(ahead, version, self._submit_gen)

    def _shard(self, step: int, last_step: int) -> tuple[Shard, RolloutStats]:
        """The samples of `step`, collected and scored; then steps step+1..step+k are
        dispatched, so their generation overlaps this step's training. (Dispatching them
        first would queue this step's scoring, and refills, behind their generation on a
        sampler worker that is also the reward service: generation and training in series.)"""
        self._dispatch(range(step, step + 1))
        dispatch = self._inflight.pop(step)
        collected = self.group.collect(dispatch, self._submit_gen, self._score, time.perf_counter)
        self._dispatch(range(step + 1, min(step + self.staleness, last_step) + 1))
        assert len(self._inflight) <= self.staleness, f"{len(self._inflight)} in flight"
        return collected

    def queue_draws(self) -> int:
        """Global prompt draws this group's queue has consumed (for a re-placement)."""
        return self.group.queue.draws

    def handover(self, draws: int) -> list[int]:
        """Re-placement: cancel the steps in flight; this group's prompts still due, in order
        (see GroupRollout.handover)."""
        self._await_push()  # the move re-roles the sampler: the push must have landed
        dispatches = [self._inflight.pop(step) for step in sorted(self._inflight)]
        return self.group.handover(dispatches, draws)

    def queue_state(self) -> QueueState:
        """This group's data position, the steps in flight left running (a checkpoint)."""
        return self.group.queue_state([self._inflight[step] for step in sorted(self._inflight)])

    def resume_queue(self, draws: int, pending: list[int]) -> None:
        """Re-placement or resume: sample `pending` first, then fresh draws from global draw
        `draws`."""
        assert not self._inflight, f"{len(self._inflight)} steps in flight at a resume"
        self.group.resume(draws, pending)

    def run_step(self, step: int, last_step: int) -> dict[str, float]:
        """One step of this group; every rank returns the same globally reduced metrics."""
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[f"timing_s/{name}"] = now - clock
            clock = now

        shard, stats = self._shard(step, last_step)
        lap("gen")
        timings["timing_s/gen"] -= stats.score_s
        timings["timing_s/reward"] = stats.score_s
        set_advantages(shard.batch, self.config.algo.estimator, self.config.algo.norm_std)
        lap("adv")
        actor = self.update(shard)
        lap("update_actor")
        self._sync_weights(step)
        lap("update_weights")
        metrics = reward_means(self._reduce(batch_sums(shard), stats.metrics(), actor))
        extremes = batch_extremes(shard)
        if self.collective is not None:
            extremes = self.collective.max_tensor(extremes)
        metrics.update(extremes_to_metrics(extremes))
        lap("reduce")
        metrics["control/staleness"] = float(stats.staleness)
        return {**metrics, **timings}

    def _sync_weights(self, step: int) -> None:
        """Push version step+1 to the sampler this group owns. A sampler no other group calls
        gets it without a wait: one caller's calls run in order, so the push lands before this
        group's next request, and the trainer goes on while the sampler finishes the step it
        is generating (async) and receives the weights. A shared sampler is waited on, and the
        barrier makes every push land before any group asks for the version."""
        if self.sampler is not None and self.owns_sampler:
            self._await_push()
            self._push = self.sampler.submit("load_weights", step + 1, self.weights(packed=True))
            if self.sampler_shared:
                self._await_push()
        if self.collective is not None and self.sampler_shared:
            self.collective.barrier()

    def _await_push(self) -> None:
        if self._push is not None:
            self._push.result()
            self._push = None

    def _reduce(self, sums: torch.Tensor, counts: dict[str, float],
                actor: dict[str, float]) -> dict[str, float]:  # fmt: skip
        """Global metrics: batch sums, rollout counts and update terms add up over ranks."""
        count_keys, keys = sorted(counts), sorted(actor)
        # Every rank must sum the same keys in the same order: a signature of the keys rides
        # along in the same all-reduce, and sums to world x its own only if all ranks agree.
        signature = float(zlib.crc32("\n".join(count_keys + keys).encode()))
        extra = [counts[k] for k in count_keys] + [actor[k] for k in keys] + [signature]
        vector = torch.cat([sums, torch.tensor(extra, dtype=torch.float64)])
        if self.collective is not None:
            vector = self.collective.sum_tensor(vector)
        assert float(vector[-1]) == self.world * signature, f"ranks differ in metrics: {keys}"
        vector = vector[:-1]
        n_sums, n_counts = sums.numel(), len(count_keys)
        metrics = sums_to_metrics(vector[:n_sums])
        metrics.update({k: float(v) for k, v in zip(count_keys, vector[n_sums:])})
        tail = vector[n_sums + n_counts :].tolist()
        metrics.update(reduce_actor_metrics(dict(zip(keys, tail, strict=True))))
        return metrics


class ParallelController(Controller):
    """Starts one ParallelRank per policy device and drives them step by step."""

    mode = "parallel"

    def __init__(self, config, control: ControlConfig, cluster: Cluster | None = None) -> None:
        owned = cluster is None
        cluster = cluster or build_cluster(config, control, ParallelRank)
        super().__init__(config, control, cluster)
        with closing_on_error(cluster, owned):
            self._connect(cluster)
        self.last_step = config.train.steps - 1

    def _connect(self, cluster: Cluster) -> None:
        """Each rank's sampler and reward service (disaggregated and partial placements)."""
        n_ranks = len(cluster.ranks)
        connections = []
        for rank in range(n_ranks):
            if cluster.samplers is None:
                connections.append((None, None, False, False))
            else:
                connections.append(
                    (
                        cluster.sampler_for(rank),
                        cluster.reward_for(rank),
                        cluster.owns_sampler(rank),
                        n_ranks > len(cluster.samplers),
                    )
                )
        cluster.ranks.call_each("connect", connections)

    def fit(self, steps: int | None = None, progress: Any = None, start_step: int = 0):
        self.last_step = (steps or self.config.train.steps) - 1
        return super().fit(steps, progress, start_step)

    def step(self, step: int) -> dict[str, float]:
        results = self.cluster.ranks.call_all("run_step", step, self.last_step)
        return results[0]

    def queue_states(self) -> list[QueueState]:
        return [tuple(state) for state in self.cluster.ranks.call_all("queue_state")]

    def resume_queues(self, draws: int, shares: list[list[int]], step: int) -> None:
        # each rank's first step came with its weights (`RankWorker.restore`, `import_state`)
        self.cluster.ranks.call_each("resume_queue", [(draws, share) for share in shares])
