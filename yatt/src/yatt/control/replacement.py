"""Runtime re-placement: a cost model fed by measured phase times picks the device split.

Phase costs are kept as *work* (device-seconds per step: a phase that ran 2 s on 3 devices is 6
device-seconds), which is what the spans of a timeline add up to, whatever the placement was.
Work divides evenly over the devices a phase gets, except generation's latency floor `floor`:
decoding the longest response takes one model call per token whatever the batch, so sampling on
k devices takes floor + gen / k. A step is predicted as:

    colocate(n):          floor_n + (gen + reward) / n + train_n + 2 swap     (phases in series)
    disaggregated(k, n):  max(floor_k + (gen + reward) / k, train_(n-k) + sync)   (async, k >= 1)
                          floor_k + (gen + reward) / k + train_(n-k) + sync        (synchronous)
    partial(k, n):        floor_k + gen / k + reward / (n - k) + train_n + sync + 2 swap

where floor_k = floor / speedup(gen_parallel, k) and train_k = train / speedup(train_parallel,
k), with Amdahl's speedup(p, k) = 1 / (1 - p + p / k). Data-parallel ranks (GPUs, or one
process per core) split rows, not the decode of one row: gen_parallel = 0, train_parallel = 1.
A worker that owns k CPU cores runs intra-op threads instead; memory-bound decode and
training then scale by measured fractions below 1 (see `amdahl_fraction`), which is what makes
colocation lose to overlap on a CPU once responses grow.

Short responses make the floor small and colocation wins (no device waits); long responses make
it large, and overlapping it with training on other devices wins. (A group's controller scores
its shard after sampling it, so partial colocation runs gen and reward one after the other.)

The model is a prior. A plan that ran recently has a *measured* step time (the floor of a
CPU's memory-bound decode, contention and overheads included), and the `Replanner` uses it
instead of the model's guess. Plans not measured in the current regime get the model's guess
times the calibration of the measured ones (measured / modelled), so a model that is off by
a common factor (a slower machine, a mis-estimated decode floor) still ranks them fairly.

Every `every_steps` steps the `Replanner` compares the predicted step time of the current plan
with the best candidate; it moves when the time saved over the steps left (costs measured now
are assumed to hold that long; a later shift is met by a later decision) exceeds the measured
cost of moving (re-roling the workers and handing over weights and optimizer state).
Each decision is logged with its numbers. Costs and step times are smoothed over steps (an
exponential average), except across a jump of `REGIME_SHIFT` or more: the newest step then
replaces the average, so a jump in the response budget is met at the next decision, not after
the average has caught up with it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from yatt.control.placement import Placement, candidate_placements
from yatt.errors import ConfigError

__all__ = [
    "Decision",
    "PhaseCosts",
    "Replanner",
    "amdahl_fraction",
    "costs_from_spans",
    "predict_step_s",
    "speedup",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PhaseCosts:
    """Per-step work in device-seconds (gen, reward, train) and fixed seconds (gen_floor: the
    sequential decode of the longest response; sync: weight push; swap: offload/onload), and
    the Amdahl fractions of the floor and of training over one worker's devices."""

    gen_s: float
    reward_s: float
    train_s: float
    sync_s: float = 0.0
    swap_s: float = 0.0
    gen_floor_s: float = 0.0
    gen_parallel: float = 0.0
    train_parallel: float = 1.0

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            assert value >= 0 and math.isfinite(value), f"{item.name}={value}"
        assert self.gen_parallel <= 1, f"gen_parallel={self.gen_parallel}"
        assert self.train_parallel <= 1, f"train_parallel={self.train_parallel}"

    def gen_on(self, devices: int, reward: bool = False) -> float:
        """Seconds to sample one step on `devices` (and score it there, with `reward`)."""
        work_s = self.gen_s + (self.reward_s if reward else 0.0)
        return self.gen_floor_s / speedup(self.gen_parallel, devices) + work_s / devices

    def train_on(self, devices: int) -> float:
        """Seconds of one update on `devices`."""
        return self.train_s / speedup(self.train_parallel, devices)

    def jumped_from(self, before: PhaseCosts) -> bool:
        """Whether the decode floor (the decode steps the gen calls ran, or the budget where a
        step holds none) or the training work is `REGIME_SHIFT` times or more above or below
        `before`'s: the regime changed (the responses grew or shrank), and an average across
        the jump lags. (The gen work beyond the floor is left out: an async step may hold no
        gen call, or one that began in an earlier step.)"""
        return any(_jumped(getattr(before, name), getattr(self, name))
                   for name in ("gen_floor_s", "train_s"))  # fmt: skip

    def blend(self, other: PhaseCosts, weight: float) -> PhaseCosts:
        """Exponential moving average: (1 - weight) * self + weight * other."""
        return PhaseCosts(**{
            item.name: (1 - weight) * getattr(self, item.name) + weight * getattr(other, item.name)
            for item in dataclasses.fields(self)
        })  # fmt: skip


REGIME_SHIFT = 2.0


def _jumped(before: float, now: float) -> bool:
    """Whether `now` is at least `REGIME_SHIFT` times above or below `before` (two zeros: no)."""
    low, high = sorted((before, now))
    return high > 0 and high >= REGIME_SHIFT * low


def speedup(parallel: float, devices: int) -> float:
    """Amdahl's speedup on `devices` of work whose fraction `parallel` divides among them."""
    assert devices >= 1, f"devices={devices}"
    return 1.0 / (1.0 - parallel + parallel / devices)


def amdahl_fraction(one_s: float, many_s: float, devices: int) -> float:
    """The parallel fraction p with one_s / many_s = speedup(p, devices), clipped to [0, 1]
    (a measurement may show no gain, or a little more than linear)."""
    assert one_s > 0 and many_s > 0 and devices > 1, f"{one_s}, {many_s}, {devices}"
    fraction = (1.0 - many_s / one_s) / (1.0 - 1.0 / devices)
    return min(max(fraction, 0.0), 1.0)


def predict_step_s(costs: PhaseCosts, placement: Placement, overlap: bool = True) -> float:
    """Predicted seconds per step of `placement` (see the module docstring); `overlap`: the
    run is async (bounded staleness >= 1), so disjoint sampler and trainer devices overlap."""
    n = placement.n_devices
    if placement.kind == "colocate":
        return costs.gen_on(n, reward=True) + costs.train_on(n) + 2 * costs.swap_s
    k = placement.n_sampler
    if placement.kind == "disaggregated":
        rollout_s = costs.gen_on(k, reward=True)
        train_s = costs.train_on(n - k) + costs.sync_s
        return max(rollout_s, train_s) if overlap else rollout_s + train_s
    assert placement.kind == "partial", f"no cost model for placement kind {placement.kind!r}"
    rollout_s = costs.gen_on(k) + costs.reward_s / (n - k)
    return rollout_s + costs.train_on(n) + costs.sync_s + 2 * costs.swap_s


def costs_from_spans(spans: Iterable, steps: int, gen_floor_s: float = 0.0, sync_s: float = 0.0,
                     swap_s: float = 0.0, gen_parallel: float = 0.0, train_parallel: float = 1.0,
                     decode_step_s: float = 0.0) -> PhaseCosts:  # fmt: skip
    """Per-step costs from timeline spans (any placement) as one-device work. A multi-core
    worker records one span per core with the same times (its width); its update counts
    duration x speedup(train_parallel, width), its sampling the duration beyond the sped-up
    floor, on every core. Each gen call's floor is taken out of the gen work: `decode_step_s`
    times the decode steps the call ran (`Span.tokens`) where both are known, else
    `gen_floor_s`; the costs' floor is the mean over the calls. (An async run's spans of a step
    hold the sampling of a later step, whose budget may differ: a floor from the step's own
    budget would count a longer decode as work that divides over devices.)"""
    assert steps > 0, f"steps={steps}"
    widths: dict[tuple, int] = {}
    for span in spans:
        key = (span.role, span.phase, span.start_s, span.end_s, span.tokens)
        widths[key] = widths.get(key, 0) + 1
    work = {"gen": 0.0, "reward": 0.0, "update_actor": 0.0}
    floors: list[float] = []
    for (_, phase, start_s, end_s, tokens), width in widths.items():
        seconds = end_s - start_s
        if phase == "gen":
            call_floor_s = decode_step_s * tokens if decode_step_s and tokens else gen_floor_s
            floors.append(call_floor_s)
            sped_up_floor_s = call_floor_s / speedup(gen_parallel, width)
            work["gen"] += max(seconds - sped_up_floor_s, 0.0) * width
        elif phase == "behaviour_logp":  # sampler-side work
            work["gen"] += seconds * width
        elif phase == "update_actor":
            work[phase] += seconds * speedup(train_parallel, width)
        elif phase in work:
            work[phase] += seconds * width
    swaps = [span for span in spans if span.phase == "swap"]
    if swaps and not swap_s:  # measured offload/onload: seconds per step on each device
        n_swapping = len({span.device for span in swaps})
        swap_s = sum(span.end_s - span.start_s for span in swaps) / (steps * n_swapping * 2)
    floor_s = sum(floors) / len(floors) if floors else gen_floor_s
    return PhaseCosts(work["gen"] / steps, work["reward"] / steps, work["update_actor"] / steps,
                      sync_s, swap_s, floor_s, gen_parallel, train_parallel)  # fmt: skip


@dataclass(frozen=True)
class Decision:
    """One re-placement decision and why it was taken."""

    step: int
    current: str
    chosen: str
    switch: bool
    predicted_current_s: float
    predicted_best_s: float
    move_cost_s: float
    reason: str

    def record(self) -> dict[str, Any]:
        """The decision as `control.json` keeps it: `step`, the logged step it came before
        (`self.step` counts the steps done), the plans `from` and `to`, whether it moved."""
        return {"step": self.step + 1, "from": self.current, "to": self.chosen,
                "switch": self.switch, "reason": self.reason}  # fmt: skip


class Replanner:
    """Chooses among the candidate plans every `every_steps` steps from smoothed phase costs."""

    def __init__(
        self,
        n_devices: int,
        every_steps: int,
        move_cost_s: float,
        smoothing: float = 0.5,
        candidates: list[Placement] | None = None,
        overlap: bool = True,
    ) -> None:
        if every_steps < 1:
            raise ConfigError(f"re-placement interval {every_steps} must be >= 1 step")
        if not 0 < smoothing <= 1:
            raise ConfigError(f"smoothing {smoothing} must be in (0, 1]")
        self.candidates = candidates or candidate_placements(n_devices)
        self.every_steps = every_steps
        self.move_cost_s = move_cost_s
        self.smoothing = smoothing
        self.overlap = overlap
        self.costs: PhaseCosts | None = None
        self.decisions: list[Decision] = []
        # plan label -> (plan, step last measured, smoothed s/step)
        self.measured: dict[str, tuple[Placement, int, float]] = {}

    def observe(self, costs: PhaseCosts, move_cost_s: float | None = None) -> None:
        """Feed one step's measured costs (and a measured move, when one just happened). Costs
        are smoothed over steps, except across a jump (`PhaseCosts.jumped_from`): then the
        new step's costs replace the average at once."""
        if self.costs is None or costs.jumped_from(self.costs):
            self.costs = costs
        else:
            self.costs = self.costs.blend(costs, self.smoothing)
        if move_cost_s is not None:
            self.move_cost_s = move_cost_s

    def observe_step(self, step: int, plan: Placement, step_s: float) -> None:
        """Feed the measured wall time of `step`, run on `plan` (smoothed as `observe` smooths
        costs: a step `REGIME_SHIFT` times slower or faster than the average starts it anew)."""
        assert step_s >= 0 and math.isfinite(step_s), f"step_s={step_s}"
        last = self.measured.get(plan.label())
        fresh = last is not None and step - last[1] <= self.every_steps
        if fresh and _jumped(last[2], step_s):  # the regime changed: the others' times too
            self.measured = {}
            fresh = False
        smoothed = (1 - self.smoothing) * last[2] + self.smoothing * step_s if fresh else step_s
        self.measured[plan.label()] = (plan, step, smoothed)

    def _fresh(self, step: int) -> dict[str, tuple[Placement, float]]:
        # (+ 1: the plan a move left was last measured the step before the decision, so at
        # the next decision it is `every_steps` + 1 steps old, and still comparable)
        return {label: (plan, s) for label, (plan, at, s) in self.measured.items()
                if step - at <= self.every_steps + 1}  # fmt: skip

    def predict(self, plan: Placement, step: int) -> float:
        """Seconds per step of `plan`: measured since the last decision but one (and since
        the last regime change), else the cost model's prediction times the measured plans'
        mean calibration."""
        assert self.costs is not None, "predict before any observed costs"
        fresh = self._fresh(step)
        if plan.label() in fresh:
            return fresh[plan.label()][1]
        ratios = [
            measured_s / modelled_s
            for other, measured_s in fresh.values()
            if (modelled_s := predict_step_s(self.costs, other, self.overlap)) > 0
        ]
        calibration = sum(ratios) / len(ratios) if ratios else 1.0
        return predict_step_s(self.costs, plan, self.overlap) * calibration

    def decide(self, step: int, current: Placement, steps_left: int) -> Decision | None:
        """At decision steps, the plan to run next (logged); None between decision steps and
        while the current plan has no measured step (right after a move: no flapping on the
        model's guess alone)."""
        others = [plan for plan in self.candidates if plan != current]
        if step == 0 or step % self.every_steps or self.costs is None or steps_left <= 0:
            return None
        if not others or (self.measured and current.label() not in self._fresh(step)):
            return None  # nothing to choose, or the current plan has no measured step yet
        now_s = self.predict(current, step)
        best = min(others, key=lambda p: self.predict(p, step))
        best_s = self.predict(best, step)
        gain_s = (now_s - best_s) * steps_left
        switch = gain_s > self.move_cost_s
        verdict = "move to" if switch else "keep; best alternative"
        reason = (
            f"{verdict} {best.label()}: {now_s:.3f} -> {best_s:.3f} s/step over "
            f"{steps_left} steps left saves {gain_s:.2f} s vs move cost {self.move_cost_s:.2f} s "
            f"(gen floor {self.costs.gen_floor_s:.2f} s, work gen {self.costs.gen_s:.2f}, "
            f"reward {self.costs.reward_s:.2f}, train {self.costs.train_s:.2f} device-s, "
            f"push {self.costs.sync_s:.2f} s)"
        )
        decision = Decision(step, current.label(), (best if switch else current).label(), switch,
                            now_s, best_s, self.move_cost_s, reason)  # fmt: skip
        self.decisions.append(decision)
        logger.info("re-placement before step %d (%s): %s", step + 1, current.label(), reason)
        return decision

    def plan_for(self, decision: Decision) -> Placement:
        """The Placement a decision chose."""
        return next(p for p in self.candidates if p.label() == decision.chosen)
