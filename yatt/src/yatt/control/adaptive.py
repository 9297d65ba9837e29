"""Runtime re-placement in a real run: parallel controllers whose device split changes mid-run.

Every step after the first, the phase spans the workers recorded become measured costs
(replacement.py) for the `Replanner`, and the step's wall time becomes the measured step time
of the plan it ran on.
When it decides to move, the worker processes take on their roles in the new plan (no process
is restarted; see build_cluster: policy ranks that stay ranks keep their state, idle spare
processes stand by), and a kept rank hands its weights (and optimizer state, to ranks that are
new) to the others at the current step. Prompt bookkeeping carries over: the old groups cancel
their in-flight steps and hand over every prompt they took but neither trained nor dropped (in
flight, reclaimed after over-dispatch aborts) plus their slices of the global draws up to the
furthest group's; old group g's prompts go to the front of new group g mod n's queue, which
then draws on from there. No prompt is lost or sampled twice (tested); with the same number of
groups, or when no group holds a prompt (synchronous, no over-dispatch), the prompt order
continues exactly as in an unmoved run. The measured move time becomes the planner's new move
cost, plus the first step's excess over the step time the decision predicted for the new plan
(an async plan starts with an empty pipeline: its first step samples and trains in series). The
timeline keeps every plan's spans plus the moves.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from yatt.config import Config
from yatt.control.async_rollout import QueueState, deal_prompts
from yatt.control.cluster import build_cluster, plans_that_fit
from yatt.control.config import ControlConfig, max_new_tokens_at
from yatt.control.controller import Controller, RunResult, closing_on_error
from yatt.control.parallel import ParallelController, ParallelRank
from yatt.control.placement import Placement
from yatt.control.replacement import Decision, Replanner, amdahl_fraction, costs_from_spans
from yatt.control.segments import merge_stats
from yatt.control.timeline import Span

__all__ = ["AdaptiveController"]

logger = logging.getLogger(__name__)


class AdaptiveController(Controller):
    """Parallel controllers under runtime re-placement every `control.replace_every` steps.
    The `Controller` methods (`save_policy`, `weights`, `close`, ...) act on the cluster of
    the plan of the moment.

    `decode_step_s`: seconds of one decode step at batch 1 on one device (the generation floor
    per token); a gen call's floor is that times the decode steps it ran (the step's response
    budget where a call's steps are unknown). `gen_parallel`, `train_parallel`: the Amdahl
    fractions of that floor and of an update over one worker's devices (see replacement.py).
    Each None (as `yatt train` passes) is measured before the run:
    - where a worker owns one device (GPUs, `control.cpu_mapping=ranks`), a sampler worker of
      the first plan times a decode step on its device (`RankWorker.decode_step_s`); the
      fractions are data-parallel ranks' (the floor does not divide, an update's rows do);
    - where a worker owns several CPU cores (`control.cpu_mapping=threads`, Ray, two or more
      devices), the first plan's sampler times a decode step and its first policy rank an
      update's passes over a micro-batch on one core and with a thread on each of the run's
      cores
      (`RankWorker.decode_scaling`, `update_scaling`): the one-core step is the floor, and the
      fractions come from the ratios (memory-bound work scales below linear on a CPU).
    yatt/bench/placement.py's `calibrate` measures them with whole updates and passes them in.
    """

    mode = "adaptive"

    def __init__(self, config: Config, control: ControlConfig, decode_step_s: float | None = None,
                 gen_parallel: float | None = None, train_parallel: float | None = None
                 ) -> None:  # fmt: skip
        assert control.replace_every > 0, "runtime re-placement needs control.replace_every > 0"
        super().__init__(config, control, build_cluster(config, control, ParallelRank))
        with closing_on_error(self.cluster, owned=True):
            self._set_up(config, control, decode_step_s, gen_parallel, train_parallel)

    def _set_up(self, config: Config, control: ControlConfig, decode_step_s: float | None,
                gen_parallel: float | None, train_parallel: float | None) -> None:  # fmt: skip
        given = {"decode_step_s": decode_step_s, "gen_parallel": gen_parallel,
                 "train_parallel": train_parallel}  # fmt: skip
        missing = {key for key, value in given.items() if value is None}
        if missing:
            given |= self._measure_scaling(config, control, missing)
        self.decode_step_s = given.pop("decode_step_s")
        self.parallel = given
        self.plan: Placement = self.cluster.placement
        self.controller = ParallelController(config, control, self.cluster)
        overlap = control.async_staleness > 0
        candidates, unfit = plans_that_fit(config, control, self.cluster.devices)
        if unfit:
            logger.info(
                "re-placement: algo.prompts_per_step=%d does not divide over the policy ranks "
                "of %s (or the backend runs one rank only); they are not candidates",
                config.algo.prompts_per_step,
                ", ".join(plan.label() for plan in unfit),
            )
        self.replanner = Replanner(
            self.plan.n_devices,
            control.replace_every,
            self._handover_s(),
            candidates=candidates,
            overlap=overlap,
        )
        self.sync_s = self._push_s()
        self.decisions: list[Decision] = []
        self._last_move: tuple[Decision | None, float | None] = (None, None)
        self._spans: list[tuple] = []  # timeline.Span's fields
        self._workers: dict[str, dict[str, float]] = {}

    def _measure_scaling(self, config: Config, control: ControlConfig, missing: set[str]
                         ) -> dict[str, float]:  # fmt: skip
        """The `missing` ones of the decode floor per token on one device and the Amdahl
        fractions, measured on the first plan's workers (see the class docstring)."""
        sampler, rank = self.cluster.sampler_for(0), self.cluster.ranks.handles[0]
        n = len(self.cluster.devices)
        threads = control.cpu_mapping == "threads" and self.cluster.devices[0].kind == "cpu"
        if not (threads and control.backend == "ray" and n >= 2 and not control.oversubscribe):
            if threads:
                why = (
                    "in-process workers are not pinned to cores" if control.backend != "ray"
                    else "one device has no wider width to compare" if n < 2
                    else "oversubscribed devices share cores"
                )  # fmt: skip
                logger.info(
                    "re-placement: no thread scaling measured (%s); an update is taken to "
                    "divide over a worker's devices, the decode floor not", why,
                )  # fmt: skip
            measured = {"gen_parallel": 0.0, "train_parallel": 1.0}
            if "decode_step_s" in missing:
                measured["decode_step_s"] = sampler.call("decode_step_s")
                logger.info("re-placement: decode step at batch 1 measured at %.1f ms",
                            1000 * measured["decode_step_s"])  # fmt: skip
            return {key: measured[key] for key in missing}
        measured = {}
        if missing & {"decode_step_s", "gen_parallel"}:
            one_s, many_s = sampler.call("decode_scaling", n)
            measured["decode_step_s"] = one_s
            measured["gen_parallel"] = amdahl_fraction(one_s, many_s, n)
            logger.info("re-placement: a decode step at batch 1 took %.1f ms on 1 core, %.1f ms "
                        "with %d threads: Amdahl fraction %.2f", 1000 * one_s, 1000 * many_s, n,
                        measured["gen_parallel"])  # fmt: skip
        if "train_parallel" in missing:
            budget = max_new_tokens_at(control, 0, config.rollout.max_new_tokens)
            # an update runs its micro-batches one after another, so one micro-batch (at most)
            # scales as the whole update does
            rows = (
                config.algo.prompts_per_step // len(self.cluster.ranks) * config.rollout.n_samples
            )
            rows = min(rows, config.algo.micro_batch_size)
            one_s, many_s = rank.call("update_scaling", n, rows, budget)
            measured["train_parallel"] = amdahl_fraction(one_s, many_s, n)
            logger.info(
                "re-placement: an update's passes over a micro-batch (%d rows of %d tokens) took "
                "%.2f s on 1 core, %.2f s with %d threads: Amdahl fraction %.2f",
                rows, budget, one_s, many_s, n, measured["train_parallel"],
            )  # fmt: skip
        return {key: measured[key] for key in missing}

    def _drain(self) -> list[tuple[int, str, str, float, float]]:
        events = []
        for handle in self.cluster.all_handles():
            events += handle.call("drain_events")
        self._spans += events
        return events

    def _handover_s(self) -> float:
        """The first estimate of a move's cost, until one is measured: a move's bulk is the
        state hand-over (weights and optimizer state out of a kept rank, then into each other
        worker), so one export is timed and counted once per worker. No process starts in a
        move (spares stand by), so start-up time is not part of it."""
        return self._first_rank_call_s("export_state", True) * len(self.cluster.all_handles())

    def _push_s(self) -> float:
        """A weight push's cost, which every plan whose sampler is not the trainer pays each
        step (a colocated run never pushes, so the planner could not measure it there): one
        export of the trained tensors, packed as a push packs them, timed to the driver."""
        return self._first_rank_call_s("weights", True)

    def _first_rank_call_s(self, method: str, *args: Any) -> float:
        """Seconds of one call of `method` on the first policy rank, its result at the driver."""
        start_s = time.perf_counter()
        self.cluster.ranks.handles[0].call(method, *args)
        return time.perf_counter() - start_s

    def _move(self, step: int, plan: Placement) -> float:
        """Re-place the workers onto `plan` at `step`; returns the seconds it took."""
        start_s = time.time()
        draws = max(self.cluster.ranks.call_all("queue_draws"))
        pending = self.cluster.ranks.call_all("handover", draws)
        self._drain()
        self._keep_worker_stats()
        old_ranks = self.cluster.ranks.handles
        kind_split = 0 if plan.kind == "colocate" else plan.n_sampler
        self.control = dataclasses.replace(self.control, placement=plan.kind, n_sampler=kind_split)
        self.cluster = build_cluster(self.config, self.control, ParallelRank, self.cluster)
        # Ranks that were ranks kept their policy (build_cluster re-roles them first), so
        # the state comes from one of them; optimizer state only for ranks that are new.
        ranks = self.cluster.ranks.handles
        kept = [h for h in ranks if h in old_ranks]
        assert kept, f"no policy rank of {self.plan.label()} stayed one in {plan.label()}"
        state = kept[0].submit("export_state", len(kept) < len(ranks))  # passed by reference
        for future in [h.submit("import_state", {} if h in kept else state, step)
                       for h in self.cluster.all_handles()]:  # fmt: skip
            future.result()
        self.controller = ParallelController(self.config, self.control, self.cluster)
        self.controller.resume_queues(draws, deal_prompts(pending, len(self.cluster.ranks)), step)
        self.plan = plan
        end_s = time.time()
        self._spans += [(d, "driver", "move", start_s, end_s) for d in range(plan.n_devices)]
        return end_s - start_s

    def _before_step(self, step: int, total: int, result: RunResult) -> None:
        """`Controller.fit`'s loop, deciding before each step whether to move (held-out
        evaluations and checkpoints run on the ranks of the plan of the moment, outside the
        step times the planner sees: their spans are drained here, for the timeline alone). A
        resumed run starts on `control.placement` and the planner measures afresh."""
        self._drain()
        decision = self.replanner.decide(step, self.plan, total - step)
        move_s = None
        if decision is not None and decision.switch:
            move_s = self._move(step, self.replanner.plan_for(decision))
        if decision is not None:
            self.decisions.append(decision)
            result.decisions.append(decision.record())
        self._last_move = (decision, move_s)
        self.controller.last_step = total - 1  # (a move makes a new ParallelController)

    def _after_step(self, step: int, start_step: int, metrics: dict[str, float]) -> None:
        decision, move_s = self._last_move
        metrics["control/move_s"] = move_s or 0.0
        metrics["control/plan"] = float(self.replanner.candidates.index(self.plan))
        spans = [Span(*event) for event in self._drain()]  # on the timeline either way
        if step == start_step:
            return  # a run's first step warms the processes up: no evidence for the planner
        budget = max_new_tokens_at(self.control, step, self.config.rollout.max_new_tokens)
        if move_s:  # the step after a move refills the pipeline: its excess is move cost
            assert decision is not None, f"step {step}: a move without a decision"
            move_s += max(metrics["timing_s/step"] - decision.predicted_best_s, 0.0)
        # a disaggregated step swaps nothing: the last measured swap carries on (an average
        # decaying to 0 would make the time-shared plans look cheaper than they are)
        known = self.replanner.costs
        swap_s = known.swap_s if self.plan.kind == "disaggregated" and known else 0.0
        costs = costs_from_spans(spans, 1, gen_floor_s=self.decode_step_s * budget,
                                 sync_s=self.sync_s, swap_s=swap_s,
                                 decode_step_s=self.decode_step_s, **self.parallel)  # fmt: skip
        self.replanner.observe(costs, move_s)
        if not move_s:  # a step that refills the pipeline after a move is not typical either
            self.replanner.observe_step(step, self.plan, metrics["timing_s/step"])

    def _collect(self, result: RunResult) -> None:
        """Every plan's workers' stats (labelled by plan) and every span of the run."""
        self._drain()
        self._keep_worker_stats()
        result.workers, result.events = self._workers, self._spans

    def _keep_worker_stats(self) -> None:
        """The current plan's workers' stats, labelled by plan (a plan run again later adds
        its second stretch: each move starts a new collective, whose all-reduce seconds start
        at 0)."""
        handles = self.cluster.all_handles()
        for handle, stats in zip(handles, [h.submit("stats") for h in handles], strict=True):
            into = self._workers.setdefault(f"{self.plan.label()}/{handle.name}", {})
            merge_stats(into, stats.result())

    def step(self, step: int) -> dict[str, float]:
        """One step on the plan of the moment (`fit` decides the moves between steps)."""
        return self.controller.step(step)

    def queue_states(self) -> list[QueueState]:
        return self.controller.queue_states()

    def resume_queues(self, draws: int, shares: list[list[int]], step: int) -> None:
        self.controller.resume_queues(draws, shares, step)
