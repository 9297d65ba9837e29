"""The placement benchmark's simulated part: phase costs taken from a measured run's spans
drive the discrete-event simulator (``yatt.control.sim``), which is checked against the measured
static plans at 2 devices, sweeps the step the response lengths jump at, and projects the best
static plan against runtime re-placement to more devices, from the measured costs (weak scaling)
or from the project's H200 anchors. Used by ``placement.py`` beside it (no Ray here).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


def measured_costs(run: dict, start: int, end: int, floor_s: float, fractions: dict[str, float]):
    """PhaseCosts per step from the spans of steps [start, end) of a run (`floor_s`: the
    decode floor of one of its steps; `fractions`: ``placement.planner_fractions``)."""
    from yatt.control.replacement import costs_from_spans
    from yatt.control.timeline import Span

    ends = run["step_ends"]
    window = (ends[start - 1] if start else 0.0, ends[end - 1])
    spans = [Span(*e) for e in run["events"] if window[0] <= e[3] < window[1]]
    return costs_from_spans(spans, end - start, gen_floor_s=floor_s, **fractions)


def sim_at_two(args, short, long) -> dict[str, float]:
    """Simulated wall seconds of every plan on 2 devices over the run's length schedule."""
    from yatt.control.placement import candidate_placements
    from yatt.control.sim import simulate

    schedule = [short] * args.shift + [long] * (args.steps - args.shift)
    return {p.label(): simulate(schedule, p).total_s for p in candidate_placements(2)}


def shift_sweep(args, short, long, move_s: float) -> list[dict]:
    """Simulated at 2 devices: the best static plan vs re-placement (starting colocated,
    re-planning every `args.every` steps) as the step the lengths jump at moves through the
    run. Re-placement can only gain where the best plan flips inside the run, and gains most
    where no static plan is right for most of it."""
    from yatt.control.placement import candidate_placements, make_placement
    from yatt.control.replacement import Replanner
    from yatt.control.sim import simulate

    rows = []
    for percent in range(10, 100, 10):
        shift = max(1, round(args.steps * percent / 100))
        schedule = [short] * shift + [long] * (args.steps - shift)
        static = {p.label(): simulate(schedule, p).total_s for p in candidate_placements(2)}
        best = min(static, key=static.__getitem__)
        replanner = Replanner(2, args.every, move_s)
        adaptive = simulate(schedule, make_placement("colocate", 2), replanner).total_s
        rows.append({"shift": shift, "best_static": best, "static_s": static[best],
                     "adaptive_s": adaptive, "gain": static[best] / adaptive - 1})  # fmt: skip
    return rows


def simulate_runs(
    args, runs: dict, calib: dict, fractions: dict[str, float], move_s: float
) -> dict:
    """Sim at 2 devices (vs measured) and projections to `args.project` (`fractions`: the
    planner's Amdahl fractions, ``placement.planner_fractions``)."""
    half = args.shift
    colocate = runs["colocate"]
    step_s = calib["decode_step_s"]
    # (steady steps only: the first `warmup` ones, left out of every comparison, pay process
    # and allocator warm-up and the first weight push)
    short = measured_costs(colocate, args.warmup, half, step_s * args.short, fractions)
    long = measured_costs(colocate, half, args.steps, step_s * args.long, fractions)
    # the push as the synchronous partial run times it (its sampler is idle then; an async
    # disaggregated push also waits for the sampler's generation in flight)
    sync_s = runs["partial"]["sync_s"]
    short, long = (dataclasses.replace(c, sync_s=sync_s) for c in (short, long))
    out = {
        "costs_short": dataclasses.asdict(short),
        "costs_long": dataclasses.asdict(long),
        "sim_total_s_at_2": sim_at_two(args, short, long),
        "projection": [],
    }
    out["param_bytes"] = calib["param_bytes"]
    adaptive = runs["adaptive"]
    # the simulator refills an async pipeline itself: it takes the move's own wall time, not
    # the learned move cost (which adds the refill)
    move_wall_s = adaptive["move_wall_s"] / adaptive["moves"] if adaptive["moves"] else move_s
    out["move_wall_s"] = move_wall_s
    out["shift_sweep"] = shift_sweep(args, short, long, move_wall_s)
    out["projection"] = project(short, long, 2, move_s, args, param_bytes=calib["param_bytes"])
    return out


def project(
    short, long, measured_devices: int, move_s: float, args, *, param_bytes: float
) -> list[dict]:
    """Static-best (hindsight) vs re-placement at `args.project` devices: 100 steps, the
    lengths shifting at the measured run's fraction of steps, re-planning every `args.every`
    steps."""
    from yatt.control.placement import candidate_placements, make_placement
    from yatt.control.replacement import Replanner
    from yatt.control.sim import best_static, project_costs, simulate

    rows = []
    for n in args.project:
        scaled = [
            project_costs(c, measured_devices, n, param_bytes=param_bytes, respawn_s=move_s)
            for c in (short, long)
        ]
        n_short = round(100 * args.shift / args.steps)
        steps = [scaled[0][0]] * n_short + [scaled[1][0]] * (100 - n_short)
        plan, static = best_static(steps, candidate_placements(n))
        replanner = Replanner(n, args.every, scaled[0][1])
        adaptive = simulate(steps, make_placement("colocate", n), replanner)
        rows.append(
            {
                "devices": n,
                "best_static": plan.label(),
                "static_s": static.total_s,
                "static_idle": static.mean_idle,
                "adaptive_s": adaptive.total_s,
                "adaptive_idle": adaptive.mean_idle,
                "moves": sum(d.switch for d in adaptive.decisions),
                "plans": sorted(set(adaptive.plans)),
                "speedup": static.total_s / adaptive.total_s,
            }
        )
    return rows


def h200_costs(step64_s: float, step256_s: float, train_tps: float, swap_s: float,
               short: int, long: int, rows: int = 64, prompt: int = 128):  # fmt: skip
    """Per-device PhaseCosts of a Qwen2.5-0.5B-shaped model on one H200 (short and long
    responses): a decode step takes a + c * batch (from the step times at batch 64 and 256);
    training costs tokens / (tokens/s); colocation swaps `swap_s` each way."""
    from yatt.control.replacement import PhaseCosts

    per_row = (step256_s - step64_s) / 192
    intercept = step64_s - 64 * per_row

    def costs(length: int) -> PhaseCosts:
        return PhaseCosts(
            gen_s=length * per_row * rows,
            reward_s=0.0,
            train_s=rows * (prompt + length) / train_tps,
            swap_s=swap_s,
            gen_floor_s=length * intercept,
        )

    return costs(short), costs(long)


def anchored_costs(anchor: dict, short: int, long: int):
    """`h200_costs` from the project's plain-HF anchors (HF `generate` at batch 64 and 256,
    HF training tokens/s); the swap assumed: weights and AdamW state (16 bytes/parameter) over
    ~25 GB/s each way. Returns (short, long, parameter bytes)."""
    key = "qwen2.5-0.5b/"
    steps = (anchor[key + f"hf_generate_bs{b}_s"] / 256 for b in (64, 256))
    swap_s = 16 * anchor[key + "params"] / 25e9
    costs = h200_costs(*steps, anchor[key + "train_tok_per_s"], swap_s, short, long)
    return (*costs, 2 * anchor[key + "params"])


def gpu_measured_costs(gpu: dict, short: int, long: int):
    """`h200_costs` from yatt's own figures on an H200 (`yatt/bench/gpu.py`'s JSON): its
    engine's decode steps at batch 64 and 256, its training tokens/s (bf16 weights there; yatt
    trains fp32 weights, so this is on the fast side), and the measured time to park AdamW's
    moments in pinned host memory and bring them back (what a colocated policy rank swaps; the
    sampler shares its weights), scaled from gpu.py's bf16 moments to the fp32 ones (8 bytes a
    parameter) yatt's policy keeps. Returns (short, long, parameter bytes)."""
    key = "qwen2.5-0.5b/"
    new_tokens = gpu["plan"]["new_tokens"]
    steps = (gpu[key + f"gen_bs{b}"]["yatt_s"] / new_tokens for b in (64, 256))
    train = gpu[key + "train"]
    fp32_moments = 8 * train["params"] / train["swap_bytes"]
    swap_s = (train["offload_s"] + train["onload_s"]) / 2 * fp32_moments
    costs = h200_costs(*steps, train["tok_per_s"], swap_s, short, long)
    return (*costs, 2 * train["params"])


def anchor_projection(args, path: Path) -> dict | None:
    """The projection from the plain-HF anchors at `path` (None where the file is absent)."""
    if not path.is_file():
        return None
    short, long, param_bytes = anchored_costs(json.loads(path.read_text()), 256, 1024)
    return _h200_projection(args, path, short, long, param_bytes)


def gpu_projection(args, path: Path) -> dict | None:
    """The projection from yatt's measured H200 figures at `path` (None where absent, or
    where that run lacks the swap or a batch size it needs)."""
    if not path.is_file():
        return None
    gpu = json.loads(path.read_text())
    key = "qwen2.5-0.5b/"
    needed = (key + "gen_bs64", key + "gen_bs256")
    if "swap_bytes" not in gpu.get(key + "train", {}) or not all(k in gpu for k in needed):
        return None  # a run before the swap was timed, or without both batch sizes
    short, long, param_bytes = gpu_measured_costs(gpu, 256, 1024)
    out = _h200_projection(args, path, short, long, param_bytes)
    return out | {"device": gpu["host"]["device"], "commit": gpu["host"]["git_commit"]}


def _h200_projection(args, path: Path, short, long, param_bytes: float) -> dict:
    return {
        "source": str(path),
        "short_tokens": 256,
        "long_tokens": 1024,
        "costs_short": dataclasses.asdict(short),
        "costs_long": dataclasses.asdict(long),
        "rows": project(short, long, 1, 30.0, args, param_bytes=param_bytes),
    }


def projection_table(rows: list[dict]) -> list[str]:
    """Markdown: the best static plan vs re-placement at each projected device count."""
    lines = [
        "| devices | best static plan | static s | idle | re-placement s | idle | moves |"
        " speed-up |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row['devices']} | {row['best_static']} | {row['static_s']:.0f} | "
        f"{100 * row['static_idle']:.0f}% | {row['adaptive_s']:.0f} | "
        f"{100 * row['adaptive_idle']:.0f}% | {row['moves']} | {row['speedup']:.2f}x |"
        for row in rows
    ]
    return lines


def sim_vs_measured(runs: dict, simulated: dict[str, float]) -> list[str]:
    """Markdown: each static plan's measured and simulated seconds, and whether the simulator
    ranks the plans as measured."""
    static = [run for key, run in runs.items() if key != "adaptive"]
    lines = ["| plan | measured s | simulated s |", "|---|---:|---:|"]
    lines += [
        f"| {run['label']} | {run['wall_s']:.1f} | {simulated[run['label']]:.1f} |"
        for run in static
    ]
    measured_order = [r["label"] for r in sorted(static, key=lambda r: r["wall_s"])]
    simulated_order = sorted(measured_order, key=lambda label: simulated[label])
    agree = "agrees" if measured_order == simulated_order else "does NOT agree"
    others = [f"{k} {v:.1f} s" for k, v in simulated.items() if k not in measured_order]
    lines += [
        "",
        f"The simulator's ranking ({' < '.join(simulated_order)}) {agree} with the measured "
        f"one ({' < '.join(measured_order)})."
        + (f" Other splits, simulated: {', '.join(others)}." if others else ""),
    ]
    return lines


def resimulate(args, sim: dict, move_s: float) -> None:
    """Run the simulations of ``sim`` (a stored run's) again from its stored phase costs."""
    from yatt.control.replacement import PhaseCosts

    short, long = (PhaseCosts(**sim[key]) for key in ("costs_short", "costs_long"))
    param_bytes = sim.get("param_bytes", 4 * 3.2e6)
    sim["sim_total_s_at_2"] = sim_at_two(args, short, long)
    if "move_wall_s" in sim:
        sim["shift_sweep"] = shift_sweep(args, short, long, sim["move_wall_s"])
    sim["projection"] = project(short, long, 2, move_s, args, param_bytes=param_bytes)
    sim["anchored"] = anchor_projection(args, args.anchors)
    sim["gpu_measured"] = gpu_projection(args, args.gpu_costs)
