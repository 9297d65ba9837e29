"""Discrete-event simulation of RL steps on N devices, driven by measured phase costs.

Each step becomes a small task graph (gen, reward, train, sync, swap) whose tasks occupy device
sets for durations taken from `PhaseCosts` (work divided by the devices a task gets). Devices
serve tasks first-come-first-served in graph order; a task starts when its dependencies have
finished and all its devices are free. The result is a per-device timeline (spans), step
times and idle fractions — the same quantities a real run reports — for any device count.

`project_costs` scales costs measured on a few devices to N devices under weak scaling (the
global batch grows with N): per-device work stays, weight sync and gradient all-reduce follow
ring/tree formulas, and a move costs a fixed re-roling time (`respawn_s`: a GPU worker
rebuilding its role's engine and model) plus a weight and optimizer-state hand-over.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from yatt.control.placement import Placement
from yatt.control.replacement import Decision, PhaseCosts, Replanner, predict_step_s
from yatt.control.timeline import Span, idle_fractions

__all__ = [
    "SimResult",
    "Task",
    "best_static",
    "project_costs",
    "run_tasks",
    "simulate",
    "step_tasks",
]


@dataclass(frozen=True)
class Task:
    """`duration_s` on every device of `devices`, after every task named in `deps`."""

    key: str
    phase: str
    devices: tuple[int, ...]
    duration_s: float
    deps: tuple[str, ...] = ()


def run_tasks(
    tasks: list[Task],
    device_free_s: dict[int, float] | None = None,
    done: dict[str, float] | None = None,
) -> tuple[list[Span], dict[str, float]]:
    """Schedule `tasks` in order (FIFO per device); returns spans and each task's end time."""
    free = dict(device_free_s or {})
    finished = dict(done or {})
    spans = []
    for task in tasks:
        assert task.devices, f"task {task.key} has no devices"
        missing = [d for d in task.deps if d not in finished]
        assert not missing, f"task {task.key} depends on unscheduled {missing}"
        ready_s = max([finished[d] for d in task.deps] + [free.get(d, 0.0) for d in task.devices])
        end_s = ready_s + task.duration_s
        for device in task.devices:
            free[device] = end_s
            spans.append(Span(device, task.phase, task.phase, ready_s, end_s))
        finished[task.key] = end_s
    return spans, finished


def step_tasks(step: int, plan: Placement, costs: PhaseCosts, after: str = "",
               overlap: bool = True) -> list[Task]:  # fmt: skip
    """The task graph of one step. `after`: a task every task of this step waits for (a move).

    With `overlap` (async, staleness 1), the disaggregated plan samples one version behind: gen
    of step t waits for the weight sync of step t-2 (the one pushed after the update before
    last), so it overlaps training of t-1; without, it waits for step t-1's sync (on-policy:
    the phases run in series, as `predict_step_s(..., overlap=False)` models them).
    """
    n, k = plan.n_devices, plan.n_sampler
    dev = {role: plan.devices[role] for role in plan.devices}
    base = (after,) if after else ()
    prev_sync = (f"sync{step - 1}",) if step > 0 else ()
    if plan.kind == "colocate":
        return [
            Task(f"gen{step}", "gen", dev["sampler"], costs.gen_on(n) + costs.swap_s,
                 base + (f"train{step - 1}",) * (step > 0)),
            Task(f"reward{step}", "reward", dev["reward"], costs.reward_s / n, (f"gen{step}",)),
            Task(f"train{step}", "train", dev["policy"], costs.train_on(n) + costs.swap_s,
                 (f"reward{step}",)),
            Task(f"sync{step}", "sync", dev["policy"], 0.0, (f"train{step}",)),
        ]  # fmt: skip
    if plan.kind == "disaggregated":
        lag = 2 if overlap else 1
        stale = (f"sync{step - lag}",) if step >= lag else ()
        return [
            Task(f"gen{step}", "gen", dev["sampler"], costs.gen_on(k, reward=True),
                 base + stale),
            Task(f"reward{step}", "reward", dev["sampler"], 0.0, (f"gen{step}",)),
            Task(f"train{step}", "train", dev["policy"], costs.train_on(n - k),
                 (f"reward{step}",) + (f"train{step - 1}",) * (step > 0)),
            Task(f"sync{step}", "sync", dev["policy"], costs.sync_s, (f"train{step}",)),
        ]  # fmt: skip
    assert plan.kind == "partial", f"no task graph for placement kind {plan.kind!r}"
    return [
        Task(f"gen{step}", "gen", dev["sampler"], costs.gen_on(k), base + prev_sync),
        Task(f"reward{step}", "reward", dev["reward"], costs.reward_s / (n - k), (f"gen{step}",)),
        Task(f"train{step}", "train", dev["policy"], costs.train_on(n) + 2 * costs.swap_s,
             (f"gen{step}", f"reward{step}")),
        Task(f"sync{step}", "sync", dev["sampler"], costs.sync_s, (f"train{step}",)),
    ]  # fmt: skip


@dataclass
class SimResult:
    """A simulated run: total and per-step seconds, idle fraction per device, decisions."""

    total_s: float
    step_s: list[float]
    idle: list[float]
    spans: list[Span]
    plans: list[str]
    decisions: list[Decision] = field(default_factory=list)

    @property
    def mean_idle(self) -> float:
        return sum(self.idle) / len(self.idle)


def simulate(costs_per_step: list[PhaseCosts], plan: Placement,
             replanner: Replanner | None = None, overlap: bool = True) -> SimResult:  # fmt: skip
    """Run every step's graph on `plan`; with a `replanner`, it may move between steps (all
    devices stop for the move, which costs `replanner.move_cost_s`). The replanner only sees
    the costs of steps already simulated (as a real run would). `overlap`: the run is async
    (a replanner's own setting wins), as `step_tasks` says."""
    if replanner is not None:
        overlap = replanner.overlap
    spans: list[Span] = []
    free: dict[int, float] = {}
    done: dict[str, float] = {}
    ends, plans, after = [], [], ""
    for step, costs in enumerate(costs_per_step):
        if replanner is not None:
            decision = replanner.decide(step, plan, len(costs_per_step) - step)
            if decision is not None and decision.switch:
                plan, after = replanner.plan_for(decision), f"move{step}"
                move = Task(after, "move", tuple(range(plan.n_devices)), replanner.move_cost_s,
                            tuple(done))  # fmt: skip
                new_spans, done = run_tasks([move], free, done)
                spans += new_spans
                free = dict.fromkeys(range(plan.n_devices), done[after])
                done = {after: done[after]}  # the new plan starts from a clean pipeline
        graph = step_tasks(step, plan, costs, after if f"sync{step - 1}" not in done else "",
                           overlap)  # fmt: skip
        graph = [_drop_missing_deps(t, done, graph) for t in graph]
        new_spans, done = run_tasks(graph, free, done)
        spans += new_spans
        for span in new_spans:
            free[span.device] = max(free.get(span.device, 0.0), span.end_s)
        ends.append(done[f"sync{step}"])
        plans.append(plan.label())
        if replanner is not None:
            replanner.observe(costs)
    step_s = [b - a for a, b in zip([0.0, *ends[:-1]], ends)]
    n = max(1, max(s.device for s in spans) + 1)
    busy = [s for s in spans if s.phase != "move" and s.end_s > s.start_s]
    return SimResult(ends[-1], step_s, idle_fractions(busy, n, (0.0, ends[-1])), spans, plans,
                     list(replanner.decisions) if replanner else [])  # fmt: skip


def _drop_missing_deps(task: Task, done: dict[str, float], graph: list[Task]) -> Task:
    """Deps on tasks of steps before a move are satisfied by the move itself."""
    keys = set(done) | {t.key for t in graph}
    deps = tuple(d for d in task.deps if d in keys)
    return task if deps == task.deps else Task(task.key, task.phase, task.devices,
                                               task.duration_s, deps)  # fmt: skip


def project_costs(costs: PhaseCosts, measured_devices: int, n_devices: int, *,
                  param_bytes: float, link_gbps: float = 100.0, latency_s: float = 20e-6,
                  respawn_s: float = 30.0) -> tuple[PhaseCosts, float]:  # fmt: skip
    """Costs at `n_devices` under weak scaling, and the move cost there.

    Work (device-seconds) grows with the global batch, i.e. by n_devices / measured_devices.
    Weight sync: a pipelined broadcast, param_bytes / bandwidth + log2(n) latencies. A move:
    `respawn_s` + a weight and optimizer-state hand-over (3x the weights). The devices there
    are GPUs with one data-parallel rank each, so the measured CPU threads' scaling fractions do
    not carry over (the projected costs keep the defaults: the floor does not divide).
    """
    scale = n_devices / measured_devices
    bytes_per_s = link_gbps * 1e9 / 8
    sync_s = param_bytes / bytes_per_s + math.log2(max(n_devices, 2)) * latency_s
    move_s = respawn_s + 3 * param_bytes / bytes_per_s
    projected = PhaseCosts(costs.gen_s * scale, costs.reward_s * scale, costs.train_s * scale,
                           sync_s, costs.swap_s, costs.gen_floor_s)  # fmt: skip
    return projected, move_s


def best_static(costs_per_step: list[PhaseCosts], candidates: list[Placement]
                ) -> tuple[Placement, SimResult]:  # fmt: skip
    """The candidate with the least simulated total time over the whole run (hindsight), among
    the few best-predicted plans for the mean costs and for each distinct step cost."""
    shortlist: dict[str, Placement] = {}
    for costs in [_mean_costs(costs_per_step), *dict.fromkeys(costs_per_step)]:
        for plan in sorted(candidates, key=lambda p: predict_step_s(costs, p))[:4]:
            shortlist[plan.label()] = plan
    results = [(p, simulate(costs_per_step, p)) for p in shortlist.values()]
    return min(results, key=lambda pr: pr[1].total_s)


def _mean_costs(costs: list[PhaseCosts]) -> PhaseCosts:
    fields = dataclasses.fields(PhaseCosts)
    return PhaseCosts(**{f.name: sum(getattr(c, f.name) for c in costs) / len(costs)
                         for f in fields})  # fmt: skip
