"""Placements under a workload whose response lengths grow: colocate vs disaggregated vs partial
vs runtime re-placement, measured on CPU "devices", then simulated and projected to 8-1024 devices.

Usage: ``python yatt/bench/placement.py [--quick] [--model smollm2] [--steps 45] [--shift 30]
[--short 4] [--long 96] [--prompts 1] [--samples 3] [--every 1] [--staleness 1]
[--cpu-mapping threads] [--lora-rank 0] [--task addition] [--tag NAME] [--repeats 1]
[--out-dir DIR] [--resim]``

Real part (Ray, 2 CPU devices, parallel controllers): each static plan and the adaptive controller
(starting colocated, re-planning every ``--every`` steps) run the same GRPO steps; the response
budget jumps from ``--short`` to ``--long`` tokens at step ``--shift`` (default: two thirds in).
Under ``--cpu-mapping threads`` a role on both cores is one worker with 2 intra-op threads (no
gradient all-reduce); ``ranks`` runs one data-parallel rank per core, as on GPUs (the planner then
models ranks: the decode floor does not divide, an update splits its rows). ``--lora-rank`` trains
LoRA adapters instead of the weights (all-reduce and weight sync move the adapters alone).
Disaggregated runs are async with bounded staleness ``--staleness`` (generation of step t+1
overlaps training of step t on the other core); partial colocation samples in sync (its sampler
core also trains). The model is SmolLM2-135M (``--quick``: a tiny random-init one). The script
runs itself again with the Ray CPU workers' malloc settings when it lacks them, so that its
calibration times the update its workers run. On a CPU its small-batch decode is
memory-bandwidth bound and a 135M-parameter update is partly so: neither runs twice as fast on 2
cores (the calibration measures both). The default workload was shaped for a flip: with 4-token
responses the step is nearly all update, which colocation runs on both cores; with 96-token
responses decoding on one core takes about as long as the update on the other, and overlapping
them wins. (Since the workers keep their freed memory, a one-core update no longer faults its
memory in each step, and on the 2-core host disaggregated wins the short steps too;
``placement_ceiling.py`` measures, before such a run, which workload shapes could flip on a
machine and by how much.) Sampling
ignores EOS (``rollout.ignore_eos``), so every plan decodes exactly the same budgets whatever the
policy learns. Runs are interleaved ``--repeats`` times and the
fastest of each plan is kept (the machine is shared). Reported: wall time, step time per phase,
idle fraction per device (from the recorded phase spans; moves count as idle), the share of the
CPU time the hypervisor gave to other guests during each run (steal: a gain between runs that
differ in it by 5 points or more is not counted), the re-placement decisions with their reasons,
a Gantt PNG. Simulated part: the phase costs measured in the
colocated run (per phase, as one-core work via the calibrated scaling fractions) drive the
discrete-event simulator; it is checked against the measured static runs at 2 devices, then
projects static-best vs re-placement to 8..1024 GPUs (weak scaling). Writes section "placement" of
``yatt_control.json`` and ``yatt_control_placement.md`` / ``yatt_control.png`` (the adaptive run's
timeline) / ``yatt_control_placement.png`` to ``--out-dir``; with ``--tag NAME``, section
"placement_NAME" and files named ``..._NAME`` (a second workload beside the default one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from placement_sim import (  # yatt/bench/placement_sim.py, next to this script
    anchor_projection,
    gpu_projection,
    projection_table,
    resimulate,
    sim_vs_measured,
    simulate_runs,
)

REPO = Path(__file__).resolve().parents[2]
REWARD = ("yatt.control.workload:char_mix_reward",)
PROJECT_DEVICES = (8, 32, 128, 512, 1024)
# compared runs whose stolen CPU shares differ by this many percentage points did not run on
# the same machine
STEAL_SPREAD_POINTS = 5
QUICK_PROJECT_DEVICES = (8, 32)
WARMUP_UPDATES = 2  # untimed updates at each width before the calibration times one


def _config(args: argparse.Namespace):
    from yatt.config import load_config
    from yatt.data import TASK_PROVIDES

    # the rule reward that can grade the task: a numeric answer, or reasoning_gym's checker
    rule = "math_answer" if "number" in TASK_PROVIDES[args.task] else "reasoning_gym"
    return load_config(
        None,
        [
            f"model.path={args.model}",
            f"data.task={args.task}",
            f"reward.fns=[{rule}]",
            "data.n_train=256",
            "data.n_heldout=0",
            "eval.n=0",
            "train.torch_threads=1",
            f"train.steps={args.steps}",
            f"algo.prompts_per_step={args.prompts}",
            f"rollout.n_samples={args.samples}",
            f"rollout.max_new_tokens={args.short}",
            "rollout.ignore_eos=true",  # every step decodes its budget: plans stay comparable
            # every row trains: which rows have zero advantage depends on the sampled rewards,
            # which differ between sync and async plans, and skipped rows would make the plans'
            # updates cost different amounts of work
            "algo.skip_zero_adv=false",
            "optim.lr=1e-4",
            *([f"model.lora_rank={args.lora_rank}"] if args.lora_rank else []),
        ],
    )


def _control(args: argparse.Namespace, placement: str, replace_every: int = 0):
    from yatt.control.config import ControlConfig

    schedule = (f"0:{args.short}", f"{args.shift + 1}:{args.long}")  # (logged steps from 1)
    return ControlConfig(
        mode="parallel",
        backend="ray",
        placement=placement,
        n_devices=2,
        device_kind="cpu",
        cpu_mapping=args.cpu_mapping,
        length_schedule=schedule,
        extra_rewards=REWARD,
        replace_every=replace_every,
        async_staleness=args.staleness,
    )


def timed_phases(worker, budget: int, prompts: int, seed: int) -> tuple[float, float]:
    """Seconds of sampling a batch of `prompts` groups with `budget` response tokens, and of
    one policy update on it."""
    from yatt.control.shards import ShardRequest, set_advantages

    rows = prompts * worker.config.rollout.n_samples
    indices = tuple(range(prompts))
    request = ShardRequest(0, seed, indices, indices, tuple(range(seed, seed + rows)), budget)
    start_s = time.perf_counter()
    shard = worker.generate(request, worker.weights_version)
    gen_s = time.perf_counter() - start_s
    shard.batch.rewards, _ = worker.score(shard)
    set_advantages(shard.batch, "grpo", True)
    start_s = time.perf_counter()
    worker.update(shard)
    return gen_s, time.perf_counter() - start_s


def calibrate(config, prompts: int, budget: int, tokens: int = 32) -> dict[str, float]:
    """Seconds of one decode step of the run's model on one pinned core (a step at batch b
    takes intercept + per_row * b, from batches 1 and `rows`), the Amdahl fractions of that
    step and of an update (`prompts` groups, `budget` response tokens) on a worker owning 2 cores
    (threads) vs 1, and the model's fp32 weight bytes. The median of three runs each: the
    machine is shared, and a slow run at one width misranks the plans (a best of two once
    measured an update on 2 cores 3.4x faster than on 1). The timed runs follow
    `WARMUP_UPDATES` untimed ones at each width: a worker's first updates allocate and first
    touch the optimizer's state and the gradients (on one core the first two took 4.5-5.0 s
    where the next took 1.1 s), which made an update look 5x faster on 2 cores."""
    import torch

    from yatt.control.config import ControlConfig
    from yatt.control.devices import Device
    from yatt.control.rank import RankWorker
    from yatt.control.replacement import amdahl_fraction
    from yatt.lora import trained_state

    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    control = ControlConfig(backend="ray", n_devices=1, device_kind="cpu", extra_rewards=REWARD)
    worker = RankWorker(config, control, Device("cpu", 0), ("policy", "sampler", "reward"), "c")
    engine = worker.rollout.engine
    prompt = worker.tokenizer("What is 12 + 30?", add_special_tokens=False)["input_ids"]
    params = dataclasses.replace(worker.rollout.params, max_new_tokens=tokens)

    def step_s(batch: int) -> float:
        start_s = time.perf_counter()
        completions = engine.generate([prompt] * batch, params, seeds=list(range(batch)))
        return (time.perf_counter() - start_s) / max(len(c.token_ids) for c in completions)

    def median3(measure) -> float:
        return statistics.median(measure(seed) for seed in range(3))

    def train_s() -> float:
        for seed in range(WARMUP_UPDATES):
            timed_phases(worker, budget, prompts, 100 + seed)
        return median3(lambda seed: timed_phases(worker, budget, prompts, seed)[1])

    rows = prompts * config.rollout.n_samples
    one = {"step1": median3(lambda _: step_s(1)), "step_rows": median3(lambda _: step_s(rows))}
    one["train"] = train_s()
    worker.reset(config, control, ("policy", "sampler", "reward"), "c", Device("cpu", 0, 2))
    engine = worker.rollout.engine
    two = {"step1": median3(lambda _: step_s(1)), "train": train_s()}
    os.sched_setaffinity(0, affinity)
    torch.set_num_threads(threads)
    per_row = max(one["step_rows"] - one["step1"], 0.0) / max(rows - 1, 1)
    return {
        "decode_step_s": one["step1"] - per_row,
        "decode_row_s": per_row,
        "gen_parallel": amdahl_fraction(one["step1"], two["step1"], 2),
        "train_parallel": amdahl_fraction(one["train"], two["train"], 2),
        "train_s_1": one["train"],
        "train_s_2": two["train"],
        "warmup_updates": WARMUP_UPDATES,
        # what a weight sync or a move's hand-over carries: the trained tensors (adapters
        # alone under LoRA)
        "param_bytes": 4.0 * sum(t.numel() for t in trained_state(worker.policy.model).values()),
    }


def _warmup_text(calib: dict) -> str:
    """How many untimed updates preceded the timed ones, where the run recorded it (runs
    before 95d4e26 timed from the first update)."""
    warmup = calib.get("warmup_updates")
    return f" (after {warmup} untimed ones at each width)" if warmup else ""


def planner_fractions(args: argparse.Namespace, calib: dict) -> dict[str, float]:
    """The Amdahl fractions the planner and the simulator take for a worker on several cores:
    the calibrated ones under ``threads``; under ``ranks`` each core is its own data-parallel
    rank, as a GPU is (the decode floor does not divide, an update splits its rows)."""
    if args.cpu_mapping == "threads":
        return {"gen_parallel": calib["gen_parallel"], "train_parallel": calib["train_parallel"]}
    return {"gen_parallel": 0.0, "train_parallel": 1.0}


def _fit(controller) -> tuple[Any, dict[int, float | None]]:
    """`controller.fit()`, and the share of the machine's CPU time that the hypervisor gave
    to other guests during each step (by logged step, from 1; `StealMeter`)."""
    from yatt.common.hostfacts import StealMeter

    meter, steal = StealMeter(), {}

    def progress(step: int, total: int, metrics: dict) -> None:
        steal[step] = meter.lap()

    return controller.fit(progress=progress), steal


def _summarise(label: str, run, shift: int, warmup: int, steal: dict[int, float | None]) -> dict:
    """A run's figures. The first `warmup` steps of every plan (process and allocator warm-up,
    the first weight push, an async pipeline filling) are left out of the compared time
    (`steady_s`: from the end of step `warmup - 1` to the end of the run, moves included) and
    of the short steps' mean; `wall_s` is the whole run. `steal`: each step's stolen share of
    the CPU time (`_fit`); `steal` in the figures is their mean over the compared steps,
    weighted by each step's window (None where the kernel does not count steal)."""
    from yatt.control.timeline import idle_fractions, spans_from_events

    spans = spans_from_events(run.events)
    busy = [s for s in spans if s.phase != "move"]
    steps = [h["timing_s/step"] for h in run.history]
    ends = [h["control/step_end_s"] for h in run.history]
    assert 1 <= warmup < shift, f"warm-up {warmup} steps with the jump at step {shift}"
    return {
        "label": label,
        "wall_s": run.wall_s,
        "steady_s": ends[-1] - ends[warmup - 1],
        "warmup": warmup,
        "total_step_s": sum(steps),
        "step_s_short": sum(steps[warmup:shift]) / (shift - warmup),
        "step_s_long": sum(steps[shift:]) / max(len(steps) - shift, 1),
        "idle": idle_fractions(busy, 2),
        "moves": sum(h.get("control/move_s", 0) > 0 for h in run.history),
        "move_wall_s": sum(h.get("control/move_s", 0.0) for h in run.history),
        "step_ends": [h["control/step_end_s"] for h in run.history],
        # each share covers its step's window (end to end: a move before the step included)
        "steal": _time_weighted(
            [(steal.get(i + 1), ends[i] - ends[i - 1]) for i in range(warmup, len(steps))]
        ),
        "steal_steps": [steal.get(i + 1) for i in range(len(steps))],
        "events": run.events,
        "score_last": run.history[-1]["critic/score/mean"],
        "sync_s": sum(h.get("timing_s/update_weights", 0.0) for h in run.history) / len(steps),
        "phase_s": _phase_means(run, shift),
        # responses may end before the budget (EOS); plans compared at different lengths
        # are not comparable, so the table shows them
        "tokens_short": _mean([h["response_length/mean"] for h in run.history[1:shift]]),
        "tokens_long": _mean([h["response_length/mean"] for h in run.history[shift:]]),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / max(len(values), 1)


def _time_weighted(pairs: list[tuple[float | None, float]]) -> float | None:
    """The mean of the values, weighted by their seconds; None when no value is known."""
    known = [(value, seconds) for value, seconds in pairs if value is not None]
    if not known:
        return None
    return sum(v * s for v, s in known) / max(sum(s for _, s in known), 1e-9)


def _phase_means(run, shift: int) -> dict[str, float]:
    """Mean seconds of one gen call and one update, over the short steps (after the first)
    and over the long ones: what the simulator's per-plan durations are checked against."""
    ends = [h["control/step_end_s"] for h in run.history]
    windows = {"short": (ends[0], ends[shift - 1]), "long": (ends[shift - 1], ends[-1])}
    calls = {(e[2], e[3], e[4]) for e in run.events}  # a multi-core worker's call once
    means = {}
    for phase, name in (("gen", "gen"), ("update_actor", "update")):
        for window, (start_s, end_s) in windows.items():
            seconds = [b - a for p, a, b in calls if p == phase and start_s <= a < end_s]
            means[f"{name}_{window}"] = sum(seconds) / len(seconds) if seconds else 0.0
    return means


def _run_static(args: argparse.Namespace, placement: str) -> dict:
    from yatt.control.parallel import ParallelController

    controller = ParallelController(_config(args), _control(args, placement))
    try:
        run, steal = _fit(controller)
    finally:
        controller.cluster.shutdown()
    return _summarise(controller.cluster.placement.label(), run, args.shift, args.warmup, steal)


def _run_adaptive(args: argparse.Namespace, calib: dict) -> tuple[dict, list]:
    from yatt.control.adaptive import AdaptiveController

    controller = AdaptiveController(
        _config(args), _control(args, "colocate", args.every), calib["decode_step_s"],
        **planner_fractions(args, calib),
    )  # fmt: skip
    try:
        run, steal = _fit(controller)
    finally:
        controller.close()
    summary = _summarise("runtime re-placement", run, args.shift, args.warmup, steal)
    summary["move_cost_s"] = controller.replanner.move_cost_s
    return summary, controller.decisions


def _run_plans(args: argparse.Namespace, calib: dict, console) -> tuple[dict, list]:
    """Every plan's run summary (the fastest of `args.repeats`, interleaved) and the
    re-placement decisions of the kept adaptive run."""
    runs: dict = {}
    decisions: list = []
    for repeat in range(args.repeats):
        for placement in ("colocate", "disaggregated", "partial", "adaptive"):
            console.print(f"run {repeat + 1}/{args.repeats}: {placement} ...")
            if placement == "adaptive":
                run, made = _run_adaptive(args, calib)
            else:
                run, made = _run_static(args, placement), decisions
            if placement not in runs or _steady_s(run) < _steady_s(runs[placement]):
                runs[placement] = run
                decisions = made
    return runs, decisions


def _markdown(
    args, runs: dict, decisions: list, sim: dict, calib: dict, host: dict | None = None
) -> str:
    lines = [*_setup_lines(args, calib, host), *_runs_table(runs, args.warmup)]
    lines += ["", "Re-placement decisions:", ""]
    lines += [f"- step {d.step}: {d.reason}" for d in decisions] or ["- none"]
    lines += [
        "",
        "Simulator at 2 devices, driven by the colocated run's measured phase costs (as "
        "one-core work through the calibrated scaling fractions) and the partial run's "
        "measured weight push:",
        "",
    ]
    lines += sim_vs_measured(runs, sim["sim_total_s_at_2"])
    lines += _projection_lines(args, sim)
    lines += ["", _reading(runs, args)]
    return "\n".join(lines) + "\n"


def _setup_lines(args, calib: dict, host: dict | None) -> list[str]:
    """The section's title and its paragraph on the workload, the plans and the calibration."""
    from yatt.common.hostfacts import describe

    mapping = (
        "a role on both cores is one worker with 2 intra-op threads"
        if args.cpu_mapping == "threads"
        else "one data-parallel rank per core"
    )
    adapters = f", LoRA rank {args.lora_rank}" if args.lora_rank else ""
    title = "## yatt: placements and runtime re-placement"
    if args.tag:
        title += f" (`--tag {args.tag}`: CPU mapping `{args.cpu_mapping}`{adapters})"
    return [
        title,
        "",
        f"GRPO on `{args.model}`{adapters}, {args.prompts} `{args.task}` prompts x "
        f"{args.samples} samples per step, {args.steps} steps; the response budget jumps from "
        f"{args.short} to {args.long} tokens at step {args.shift}. Ray, parallel controllers, "
        '2 CPU "devices" (cores), '
        f"CPU mapping `{args.cpu_mapping}` ({mapping}); disaggregated runs are async "
        f"(staleness {args.staleness}), partial ones sample in sync (their sampler core also "
        "trains). Calibration (median of 3): decode step on one core "
        f"{1000 * calib['decode_step_s']:.1f} ms + {1000 * calib['decode_row_s']:.2f} ms per "
        f"row; update of {args.prompts * args.samples} rows at the short budget "
        f"{calib['train_s_1']:.2f} s on 1 core, {calib['train_s_2']:.2f} s on 2 threads"
        f"{_warmup_text(calib)}; "
        f"Amdahl fractions on 2 cores: decode {calib['gen_parallel']:.2f}, update "
        f"{calib['train_parallel']:.2f}"
        + (
            "."
            if args.cpu_mapping == "threads"
            else " (threads; the planner models the ranks as data-parallel: decode floor "
            "0, update 1)."
        )
        + describe(host),
        "",
    ]


def _projection_lines(args, sim: dict) -> list[str]:
    """The simulated jump sweep at 2 devices and the projections to many devices: from the
    measured costs, from the H200 anchors and from yatt's own H200 costs (those present)."""
    lines: list[str] = []
    if sim.get("shift_sweep"):
        lines += [
            "",
            "Simulated at 2 devices from the same costs, with the jump at other steps (move: "
            f"{sim['move_wall_s']:.2f} s, the measured run's, plus the simulated pipeline "
            "refill):",
            "",
            "| lengths jump at step | best static plan | static s | re-placement s | gain |",
            "|---:|---|---:|---:|---:|",
        ]
        lines += [
            f"| {row['shift']} of {args.steps} | {row['best_static']} | {row['static_s']:.0f} "
            f"| {row['adaptive_s']:.0f} | {100 * row['gain']:+.0f}% |"
            for row in sim["shift_sweep"]
        ]
    lines += [
        "",
        "Projection (weak scaling of the measured costs, 100 steps, lengths jump after "
        f"{round(100 * args.shift / args.steps)}; best static plan chosen in hindsight):",
        "",
    ]
    lines += projection_table(sim["projection"])
    anchored = sim.get("anchored")
    if anchored:
        lines += [
            "",
            "Projection driven by the project's H200 anchors instead (Qwen2.5-0.5B shape, "
            "HF `generate` decode steps and HF training throughput from "
            f"`{Path(anchored['source']).name}`; 64 rows per device, responses 256 then "
            "1024 tokens, 30 s respawn per move):",
            "",
        ]
        lines += projection_table(anchored["rows"])
    measured = sim.get("gpu_measured")
    if measured:
        lines += [
            "",
            f"Projection driven by yatt's own costs measured on an {measured['device']} "
            f"(`{Path(measured['source']).name}`, commit {measured['commit']}, "
            "`yatt/bench/gpu.py`): Qwen2.5-0.5B shape, yatt's engine's decode steps at batch "
            "64 and 256 (CUDA-graph capture included), its training throughput with bf16 "
            "weights (yatt trains fp32 weights: on the fast side), and the measured round trip "
            "of AdamW's moments to pinned host memory as the colocated swap, scaled to fp32 "
            "moments; 64 rows per device, responses 256 then 1024 tokens, 30 s respawn per "
            "move:",
            "",
        ]
        lines += projection_table(measured["rows"])
    return lines


def _runs_table(runs: dict, warmup: int) -> list[str]:
    """Markdown: each measured run, compared after its warm-up steps."""
    lines = [
        f"Compared: seconds after {warmup} warm-up steps (every plan's first steps pay process "
        "and allocator warm-up, the first weight push and an empty pipeline), moves included; "
        "the whole run's wall time beside it.",
        "",
        "| plan | s after warm-up | wall s | step s (short, after warm-up) | step s (long) |"
        " response tokens (short/long) | idle dev0 | idle dev1 | moves | CPU stolen |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {run['label']} | {_steady_s(run):.1f} | {run['wall_s']:.1f} | "
        f"{run['step_s_short']:.2f} | {run['step_s_long']:.2f} | "
        f"{run.get('tokens_short', 0):.1f} / {run.get('tokens_long', 0):.1f} | "
        f"{100 * run['idle'][0]:.0f}% | {100 * run['idle'][1]:.0f}% | {run['moves']} | "
        f"{_percent(run.get('steal'))} |"
        for run in runs.values()
    ]
    lines += [
        "",
        "CPU stolen: the share of the machine's CPU time that its hypervisor gave to other "
        "guests during the compared steps (`steal` in /proc/stat, weighted by each step's "
        "window); a step run while it was high ran on a slower machine.",
    ]
    return lines


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _reading(runs: dict, args) -> str:
    """Conclusions computed from the measured runs."""
    static = {k: v for k, v in runs.items() if k != "adaptive"}
    best = min(static.values(), key=_steady_s)
    best_short = min(static.values(), key=lambda r: r["step_s_short"])
    best_long = min(static.values(), key=lambda r: r["step_s_long"])
    adaptive = runs["adaptive"]
    gain = _steady_s(best) / _steady_s(adaptive) - 1
    idle = sum(adaptive["idle"]) / len(adaptive["idle"])
    flips = best_short["label"] != best_long["label"]
    plan_steps = [(run["step_s_short"], run["step_s_long"]) for run in static.values()]
    ideal_s = best_short["step_s_short"] * (args.shift - args.warmup)
    ideal_s += best_long["step_s_long"] * (args.steps - args.shift)
    noise = (
        " It made no move, so it ran its starting plan throughout and the difference from "
        "that static run is run-to-run noise."
        if adaptive["moves"] == 0
        else ""
    )
    under = _under_the_ceiling(adaptive, best_short, best_long, ideal_s)
    beat_ceiling = bool(under)
    # a gain beyond what the choice of plan can give is not evidence for the target, nor is
    # one between runs of which the hypervisor took different shares of the CPU (the runs
    # compared: re-placement, the best static plan and the ceiling's per-length bests)
    points = round(100 * _steal_spread([adaptive, best, best_short, best_long]))
    verdict = "not met"
    if gain >= 0.15:
        verdict = "met"
        if beat_ceiling:
            verdict = "not shown: the gain exceeds the ceiling"
        elif points >= STEAL_SPREAD_POINTS:
            verdict = f"not shown: the compared runs' stolen CPU time differs by {points} points"
    return (
        f"Reading (measured, after {args.warmup} warm-up steps): best static plan "
        f"{best['label']} {_steady_s(best):.1f} s; runtime re-placement "
        f"{_steady_s(adaptive):.1f} s ({100 * gain:+.0f}%; target >= +15% {verdict}), its "
        f"mean idle fraction {100 * idle:.0f}% "
        f"(target <= 10% {'met' if idle <= 0.10 else 'not met'}), {adaptive['moves']} move(s). "
        f"Fastest static plan per step: {best_short['label']} with short responses, "
        f"{best_long['label']} with long ones"
        + (
            " - the best plan flips, which is what re-placement can exploit once the gain "
            "over the remaining steps exceeds a move's cost."
            if flips
            else " - no flip on this workload, so re-placement can at best tie the best "
            "static plan."
        )
        + noise
        + f" Ceiling: each step on the fastest static plan for its length, moves free and "
        f"instant, would take about {ideal_s:.0f} s ({100 * (_steady_s(best) / ideal_s - 1):+.0f}%"
        " over the best static plan)."
        + " Over any mix of these short and long steps, free moves would gain at most "
        f"{100 * (mix_ceiling(plan_steps) - 1):.0f}% over the best static plan for that mix."
        + under
        + _steal_note(static, best, adaptive)
    )


def _under_the_ceiling(adaptive: dict, best_short: dict, best_long: dict, ideal_s: float) -> str:
    """A note where the re-placement run beat the ceiling (`ideal_s`: each step on the fastest
    static plan for its length) with steps faster than the fastest static run's of that
    length; empty otherwise."""
    pairs = {
        "short": (adaptive["step_s_short"], best_short["step_s_short"]),
        "long": (adaptive["step_s_long"], best_long["step_s_long"]),
    }
    faster = [kind for kind, (mine, best_s) in pairs.items() if mine < best_s]
    if not (_steady_s(adaptive) < ideal_s and faster):
        return ""
    compared = ", ".join(
        f"{kind} {mine:.2f} vs {best_s:.2f} s" for kind, (mine, best_s) in pairs.items()
    )
    return (
        f" The re-placement run came in under that ceiling: its {' and '.join(faster)} steps "
        f"ran faster than the fastest static run's of that length ({compared}), so part of "
        "its measured gain does not come from the choice of plan (run-to-run variation, or "
        "worker processes in another state than the static runs' fresh ones); the ceiling "
        "bounds what the choice itself gives."
    )


def _steal_spread(runs: list[dict]) -> float:
    """How far apart the stolen CPU shares of `runs` lie (0 where fewer than two recorded one)."""
    shares = [run["steal"] for run in runs if run.get("steal") is not None]
    return max(shares) - min(shares) if len(shares) > 1 else 0.0


def _steal_note(static: dict, best: dict, adaptive: dict) -> str:
    """How much CPU time the hypervisor took during the compared runs, when they recorded it."""
    shares = [run.get("steal") for run in static.values()]
    if adaptive.get("steal") is None or None in shares:
        return ""  # a run stored before steal was recorded, or a kernel that does not count it
    return (
        f" The hypervisor took {_percent(adaptive['steal'])} of the machine's CPU time during "
        f"the re-placement run's compared steps and {_percent(best['steal'])} during "
        f"{best['label']}'s ({_percent(min(shares))} to {_percent(max(shares))} over the "
        "static runs)."
    )


def _steady_s(run: dict) -> float:
    """The compared seconds of a run (runs stored before warm-up was left out: the wall)."""
    return run.get("steady_s", run["wall_s"])


def mix_ceiling(pairs: list[tuple[float, float]]) -> float:
    """The most a free, instant re-placement could gain over the best static plan for any mix
    of short and long steps, from each plan's (short step s, long step s): max over the
    short-step fraction w of min_plan(w * short + (1 - w) * long) / (w * min short + (1 - w) *
    min long)."""
    pairs = list(pairs)
    best_short, best_long = min(a for a, _ in pairs), min(b for _, b in pairs)
    ratios = []
    for percent in range(101):
        w = percent / 100
        static_s = min(w * a + (1 - w) * b for a, b in pairs)
        ratios.append(static_s / (w * best_short + (1 - w) * best_long))
    return max(ratios)


def missing_worker_malloc(environ) -> dict[str, str]:
    """The Ray CPU workers' malloc settings (`CPU_WORKER_MALLOC`) that `environ` lacks. The
    calibration times an update in this process for the workers it stands for, which keep
    their freed memory: without the same settings it measures a slower one-core update (each
    step faulting its memory in again) and the planner mispredicts plans that train on one
    core. glibc reads them at process start, so the script runs itself again with them."""
    from yatt.control.workers import CPU_WORKER_MALLOC

    return {k: v for k, v in CPU_WORKER_MALLOC.items() if environ.get(k) != v}


def run_as_the_workers(argv: list[str] | None) -> None:
    """Run this script again with `missing_worker_malloc`'s settings when it was started as
    a script (`argv` None) without them; a `main(argv)` call goes on as it is."""
    missing = missing_worker_malloc(os.environ)
    if argv is None and missing:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **missing})


def _suffix(args: argparse.Namespace) -> str:
    """What ``--tag`` appends to the JSON section's and the files' names."""
    return f"_{args.tag}" if args.tag else ""


def _plots(runs: dict, out_dir: Path, suffix: str) -> None:
    from yatt.control.timeline import plot_timeline, spans_from_events

    adaptive = runs["adaptive"]
    plot_timeline(
        spans_from_events(adaptive["events"]),
        2,
        out_dir / f"yatt_control{suffix}.png",
        "runtime re-placement on 2 CPU devices (per-device phases)",
    )
    plot_timeline(
        spans_from_events(runs["colocate"]["events"]),
        2,
        out_dir / f"yatt_control_placement{suffix}.png",
        "colocate on 2 CPU devices",
    )


def _resim(args: argparse.Namespace, out_dir: Path) -> int:
    """Re-run the simulations from the costs stored by the last measured run (no Ray)."""
    from types import SimpleNamespace

    json_path = out_dir / "yatt_control.json"
    try:
        data = json.loads(json_path.read_text())
        stored = data["placement" + _suffix(args)]
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"placement.py: --resim needs a measured run's section in {json_path} "
              f"({type(error).__name__}: {error})", file=sys.stderr)  # fmt: skip
        return 2
    keys = ("steps", "short", "long", "every", "prompts", "samples", "model", "staleness")
    for key in (*keys, "cpu_mapping"):
        setattr(args, key, stored["args"][key])
    args.lora_rank = stored["args"].get("lora_rank", 0)
    args.shift = stored["args"].get("shift", args.steps // 2)
    args.task = stored["args"].get("task", "addition")  # runs stored before: the default
    args.warmup = stored["args"].get("warmup", 0)  # runs stored before: whole walls
    sim = stored["sim"]
    resimulate(args, sim, stored["runs"]["adaptive"]["move_cost_s"])
    decisions = [SimpleNamespace(**d) for d in stored["decisions"]]
    calib, host = stored["calibration"], stored.get("host")
    text = _markdown(args, stored["runs"], decisions, sim, calib, host)
    (out_dir / f"yatt_control_placement{_suffix(args)}.md").write_text(text)
    json_path.write_text(json.dumps(data, indent=1, default=str))
    print(text)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default="smollm2", help="model.path (quick: tiny)")
    parser.add_argument("--steps", type=int, default=45)
    parser.add_argument("--shift", type=int, default=0, help="step the budget jumps (0: 2/3)")
    parser.add_argument("--short", type=int, default=4)
    parser.add_argument("--long", type=int, default=96)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the comparison")
    parser.add_argument("--cpu-mapping", default="threads", choices=("ranks", "threads"))
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters (0: full)")
    parser.add_argument("--task", default="addition", help="data.task: the prompts")
    parser.add_argument(
        "--tag", default="", help="name suffix of the JSON section and files (a second workload)"
    )
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument(
        "--anchors", type=Path, default=REPO.parent / "shared/anchors/h200_hf_baseline.json"
    )
    parser.add_argument(
        "--gpu-costs",
        type=Path,
        default=REPO / "docs/bench/yatt_gpu.json",
        help="yatt/bench/gpu.py's H200 figures, for a projection from yatt's own costs",
    )
    parser.add_argument(
        "--resim",
        action="store_true",
        help="recompute the simulated sections from the stored measurements",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.tag and not args.tag.isalnum():
        parser.error(f"--tag {args.tag!r} must be letters and digits (it names files)")
    if args.lora_rank < 0:
        parser.error(f"--lora-rank {args.lora_rank} must be >= 0 (0: full fine-tuning)")
    args.project = PROJECT_DEVICES
    if args.resim:
        return _resim(args, args.out_dir or REPO / "docs/bench")
    if args.quick:
        args.model, args.steps, args.long, args.repeats, args.shift = "tiny", 8, 16, 1, 5
        args.warmup = 2
        args.project = QUICK_PROJECT_DEVICES
    args.shift = args.shift or 2 * args.steps // 3
    if not 1 < args.shift < args.steps:
        parser.error(f"--shift {args.shift} must leave short and long steps in 1..{args.steps}")
    if not 1 <= args.warmup < args.shift:
        parser.error(f"--warmup {args.warmup} must be in 1..{args.shift - 1} (before the jump)")
    run_as_the_workers(argv)
    out_dir = args.out_dir or (Path(tempfile.mkdtemp()) if args.quick else REPO / "docs/bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING)
    import ray

    from yatt.common.hostfacts import host_facts
    from yatt.control.workers import init_ray
    from yatt.report import wide_console

    console = wide_console()  # 160 columns off a terminal (logs)
    # Ray lowers its workers' priority (nice 15) below the driver's; on a shared machine that
    # starves the plans' workers behind any other load. Benchmark them at normal priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    calib = calibrate(_config(args), args.prompts, args.short)
    init_ray(2)
    runs, decisions = _run_plans(args, calib, console)
    fractions = planner_fractions(args, calib)
    sim = simulate_runs(args, runs, calib, fractions, runs["adaptive"]["move_cost_s"])
    sim["anchored"] = anchor_projection(args, args.anchors)
    sim["gpu_measured"] = gpu_projection(args, args.gpu_costs)
    ray.shutdown()
    host = host_facts()
    suffix = _suffix(args)
    _plots(runs, out_dir, suffix)
    section = out_dir / f"yatt_control_placement{suffix}.md"
    section.write_text(_markdown(args, runs, decisions, sim, calib, host))
    record = {
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "events"} for k, v in runs.items()},
        "decisions": [d.__dict__ for d in decisions],
        "sim": sim,
        "calibration": calib,
        "host": host,
        "args": vars(args) | {"out_dir": str(out_dir)},
    }
    _store_section(out_dir / "yatt_control.json", "placement" + suffix, record)
    console.print(section.read_text())
    return 0


def _store_section(json_path: Path, key: str, record: dict) -> None:
    """Put `record` under `key` in the JSON file `json_path` (the controllers bench writes its
    sections there too), keeping the other sections."""
    data = json.loads(json_path.read_text()) if json_path.is_file() else {}
    data[key] = record
    json_path.write_text(json.dumps(data, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
