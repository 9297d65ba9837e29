"""Which workloads could re-placement win on this machine? Phase costs on one core and on two,
and the most free moves could gain over the best static plan, for a grid of workload shapes.

Usage: ``python yatt/bench/placement_ceiling.py [--quick] [--samples 3,4,6] [--short 1,4]
[--long 96,160] [--lora-rank 0] [--task addition] [--repeats 3] [--out-dir DIR] [--tag NAME]``

Runtime re-placement gains only where the fastest static plan differs between the steps of
one run, and by at most how much faster each step's fastest plan is than the plan that is best
over the whole run. This script measures that ceiling before any run, in one process on the
machine's first two cores, with the placement bench's model, data and update
(``placement.py``'s ``_config`` and ``timed_phases``): for each group size (``--samples``
completions of one prompt) and response budget, the seconds of sampling a batch and of one
update on it, on one core and on a worker owning both (2 intra-op threads), the median of
``--repeats`` after a warm-up call (a sampling call after an update includes the sampler's
refresh of its fused weights, which every plan pays), and of one weight sync on one core (the
trainer packs its weights and they are copied once, as a Ray call copies them into the object
store; the sampler loads that copy). From those, each plan's step on 2 devices: colocate =
sample and update in turn on both cores; disaggregated = the slower of load + sample on one
core and update + push on the other (they overlap); partial = load + sample on one core, then
update on both + push. Left out: the driver's calls, rewards, and a run's first steps.
For each pair of a short and a long
budget, the ceiling is ``placement.mix_ceiling``: the most free, instant moves could gain over
the best static plan, for any mix of short and long steps. Writes
``yatt_placement_ceiling.{json,md,png}`` to ``--out-dir`` (default docs/bench; a temp folder
with ``--quick``); with ``--tag NAME``, ``yatt_placement_ceiling_NAME.*`` and a subsection, for
another survey beside the default one (make bench runs those in the Makefile).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from placement import (  # yatt/bench/placement.py
    REWARD,
    _config,
    missing_worker_malloc,
    mix_ceiling,
    run_as_the_workers,
    timed_phases,
)

REPO = Path(__file__).resolve().parents[2]
TARGET = 0.15  # issue #7: runtime re-placement at least 15% faster than the best static plan
PLANS = ("colocate", "disaggregated", "partial")


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers, e.g. 1,4") from None
    if any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


def plan_steps(one: dict[str, float], two: dict[str, float], sync: dict[str, float]
               ) -> dict[str, float]:  # fmt: skip
    """Each plan's step seconds on 2 devices from the phases' seconds on one core (`one`) and
    on a worker owning both (`two`), each {"gen": s, "update": s}, and a weight sync's
    (`sync`: {"push": s on the trainer, "load": s on the sampler}), which the plans whose
    sampler is not the trainer pay every step."""
    push, load = sync["push"], sync["load"]
    return {
        "colocate": two["gen"] + two["update"],
        "disaggregated": max(load + one["gen"], one["update"] + push),
        "partial": load + one["gen"] + two["update"] + push,
    }


def timed_sync(worker) -> dict[str, float]:
    """Seconds of one weight sync on `worker`'s core: the trainer packs its weights and they
    are copied once (as a Ray call copies them into the object store), then the sampler loads
    that copy into its engine."""
    import numpy as np

    from yatt.control.transfer import PackedTensor, unpack

    start_s = time.perf_counter()
    packed = worker.weights(packed=True)
    pushed = {key: PackedTensor(np.array(value.array), value.dtype)
              for key, value in packed.items()}  # fmt: skip
    push_s = time.perf_counter() - start_s
    start_s = time.perf_counter()
    worker.rollout.engine.load_state_dict(unpack(pushed, copy=False))
    return {"push": push_s, "load": time.perf_counter() - start_s}


def ceilings(shapes: list[dict], shorts: list[int], longs: list[int]) -> list[dict]:
    """Per group size and (short, long) budget pair: the fastest plan at each length and the
    free-move ceiling over the best static plan (`mix_ceiling`)."""
    rows = []
    for shape in shapes:
        steps = {point["budget"]: point["steps"] for point in shape["points"]}
        for short, long in itertools.product(shorts, longs):
            if short >= long:
                continue
            pairs = [(steps[short][plan], steps[long][plan]) for plan in PLANS]
            rows.append({
                "samples": shape["samples"],
                "short": short,
                "long": long,
                "fastest_short": min(PLANS, key=lambda plan: steps[short][plan]),
                "fastest_long": min(PLANS, key=lambda plan: steps[long][plan]),
                "ceiling": mix_ceiling(pairs) - 1,
            })  # fmt: skip
    return rows


def measure(args: argparse.Namespace, samples: int, progress) -> dict:
    """Phase seconds at every budget, on core 0 alone and on cores 0-1, for groups of
    `samples` completions."""
    import torch

    from yatt.control.config import ControlConfig
    from yatt.control.devices import Device
    from yatt.control.rank import RankWorker

    shape = vars(args) | {"samples": samples, "prompts": 1, "steps": 1, "short": args.short[0]}
    config = _config(argparse.Namespace(**shape))
    control = ControlConfig(backend="ray", n_devices=1, device_kind="cpu", extra_rewards=REWARD)
    roles = ("policy", "sampler", "reward")
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    timed: dict[int, dict[int, dict[str, float]]] = {}
    seeds = itertools.count()
    try:
        worker = RankWorker(config, control, Device("cpu", 0), roles, "c")  # pins to core 0
        syncs = [timed_sync(worker) for _ in range(args.repeats + 1)][1:]  # after a warm-up
        sync = {key: statistics.median(s[key] for s in syncs) for key in ("push", "load")}
        for cores in (1, 2):
            if cores == 2:
                worker.reset(config, control, roles, "c", Device("cpu", 0, 2))
            for budget in [*args.short, *args.long]:
                timed_phases(worker, budget, 1, next(seeds))  # warm-up: allocations, caches
                runs = [timed_phases(worker, budget, 1, next(seeds)) for _ in range(args.repeats)]
                timed.setdefault(budget, {})[cores] = {
                    "gen": statistics.median(gen for gen, _ in runs),
                    "update": statistics.median(update for _, update in runs),
                }
                progress()
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
    points = [
        {"budget": budget, "one": by[1], "two": by[2], "steps": plan_steps(by[1], by[2], sync)}
        for budget, by in timed.items()
    ]
    return {"samples": samples, "sync": sync, "points": points}


def _heading(args, host: dict, steal: float | None) -> list[str]:
    """The section's title and its paragraph on how the phases were measured and modelled."""
    stolen = "not counted" if steal is None else f"{100 * steal:.0f}%"
    model = f"LoRA adapters of rank {args.lora_rank}" if args.lora_rank else "full weights"
    malloc = "without" if missing_worker_malloc(os.environ) else "with"
    title = "### Where re-placement could pay on this machine"
    if args.tag:
        title = f"#### The same survey, {args.task} prompts and {model}"
    return [
        f"{title} (`yatt/bench/placement_ceiling.py`)",
        "",
        f"Model `{args.model}`, {model}, one `{args.task}` prompt per step with the placement "
        f"bench's reward, sampling that ignores EOS; the median of {args.repeats} run(s) after a "
        f"warm-up, in one process pinned to core 0 (1 thread) or cores 0-1 (2 threads), {malloc} "
        f"the Ray CPU workers' malloc settings. Host: {host['cpus']} CPUs ({host['processor']}), "
        f"torch {host['torch']}, commit {host['git_commit']}; the hypervisor took {stolen} of "
        "the CPU time while it ran. Each plan's step is modelled from the phases: colocate = "
        "sample, then update, on both cores; disaggregated = the slower of load + sample on one "
        "core and update + push on the other; partial = load + sample on one core, then update "
        "on both + push (a sampling call after an update includes the sampler's weight refresh; "
        "push: pack the weights and copy them once, as into Ray's object store; load: the "
        "sampler takes that copy; the driver's calls and rewards are left out). "
        f"`{_command(args)}`.",
    ]


def markdown(shapes: list[dict], rows: list[dict], args, host: dict, steal: float | None) -> str:
    lines = [
        *_heading(args, host, steal),
        "",
        "| samples | budget | gen 1 core s | gen 2 cores s | update 1 core s | update 2 cores s"
        " | push + load s | colocate s | disaggregated s | partial s | fastest |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for shape in shapes:
        for point in shape["points"]:
            one, two, steps = point["one"], point["two"], point["steps"]
            lines.append(
                f"| {shape['samples']} | {point['budget']} | {one['gen']:.2f} | "
                f"{two['gen']:.2f} | {one['update']:.2f} | {two['update']:.2f} | "
                f"{shape['sync']['push']:.2f} + {shape['sync']['load']:.2f} | "
                f"{steps['colocate']:.2f} | {steps['disaggregated']:.2f} | "
                f"{steps['partial']:.2f} | {min(steps, key=steps.get)} |"
            )
    lines += [
        "",
        "Free, instant moves against the best static plan, for the worst mix of short and long "
        "steps (`mix_ceiling`; a real run also pays its moves and what the model leaves out):",
        "",
        "| samples | short budget | long budget | fastest short | fastest long | ceiling |",
        "|---:|---:|---:|---|---|---:|",
    ]
    lines += [
        f"| {row['samples']} | {row['short']} | {row['long']} | {row['fastest_short']} | "
        f"{row['fastest_long']} | {100 * row['ceiling']:+.1f}% |"
        for row in rows
    ]
    best = max(rows, key=lambda row: row["ceiling"])
    verdict = "above" if best["ceiling"] >= TARGET else "below"
    lines += [
        "",
        f"- Highest ceiling: {100 * best['ceiling']:+.1f}% ({best['samples']} samples, budgets "
        f"{best['short']} -> {best['long']}), {verdict} the {100 * TARGET:.0f}% target of "
        "runtime re-placement over the best static plan, before any move is paid.",
        "- Speedup on 2 cores over 1, over the grid: sampling "
        + _spread([p["one"]["gen"] / p["two"]["gen"] for s in shapes for p in s["points"]])
        + ", update "
        + _spread([p["one"]["update"] / p["two"]["update"] for s in shapes for p in s["points"]])
        + ". Colocation runs the two phases in turn on both cores where disaggregation overlaps "
        "them on one core each, so it beats disaggregation at a length by at most about these "
        "factors, and re-placement gains only where it does.",
        "- The fastest-plan columns are the model's. Check them against a measured run where a "
        "shape coincides (the placement section above: 3 samples, budgets 4 -> 96); a machine "
        "whose speed drifts between the two runs shifts the one-core phases most.",
        "",
        f"![re-placement ceiling per workload shape](yatt_placement_ceiling{_suffix(args)}.png)",
        "",
    ]
    return "\n".join(lines)


def _suffix(args: argparse.Namespace) -> str:
    """What ``--tag`` appends to the files' names (a second survey beside the default one)."""
    return f"_{args.tag}" if args.tag else ""


def _command(args: argparse.Namespace) -> str:
    """The command line that makes this section (the defaults' is the bare script)."""
    if not args.tag:
        return "python yatt/bench/placement_ceiling.py"
    flags = [f"--task {args.task}"]
    for name in ("samples", "short", "long"):
        flags.append(f"--{name} {','.join(map(str, getattr(args, name)))}")
    if args.lora_rank:
        flags.append(f"--lora-rank {args.lora_rank}")
    return " ".join(["python yatt/bench/placement_ceiling.py", *flags, f"--tag {args.tag}"])


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}x-{max(values):.2f}x"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['samples']} x {r['short']}->{r['long']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rows) + 2), 3.6))
    ax.bar(labels, [100 * r["ceiling"] for r in rows], color="tab:blue")
    ax.axhline(100 * TARGET, color="tab:red", linestyle="--", label="target (+15%)")
    ax.set_ylabel("free-move gain over best static, %")
    ax.set_xlabel("samples x short -> long response budget")
    ax.set_title("Most runtime re-placement could gain on this machine")
    ax.legend()
    fig.autofmt_xdate(rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, one shape, temp out")
    parser.add_argument("--model", default="smollm2", help="model.path (quick: tiny)")
    parser.add_argument("--samples", type=_ints, default=[3, 4, 6], help="group sizes, e.g. 3,6")
    parser.add_argument("--short", type=_ints, default=[1, 4], help="short budgets, e.g. 1,4")
    parser.add_argument("--long", type=_ints, default=[96, 160], help="long budgets, e.g. 96")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters (0: full)")
    parser.add_argument("--task", default="addition", help="data.task: the prompts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument(
        "--tag", default="", help="name suffix of the files and section (a second survey)"
    )
    args = parser.parse_args(argv)
    if args.tag and not args.tag.isalnum():
        parser.error(f"--tag {args.tag!r} must be letters and digits (it names files)")
    if args.quick:
        args.model, args.samples, args.short, args.long, args.repeats = "tiny", [2], [1], [8], 1
    if len(os.sched_getaffinity(0)) < 2:
        parser.error("needs 2 CPU cores (it compares one core with two)")
    if args.lora_rank < 0 or args.repeats < 1:
        parser.error("--lora-rank must be >= 0 and --repeats >= 1")
    run_as_the_workers(argv)
    from rich.progress import Progress

    from yatt.common.hostfacts import StealMeter, host_facts

    out_dir = args.out_dir or (Path(tempfile.mkdtemp()) if args.quick else REPO / "docs/bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    meter, shapes = StealMeter(), []
    total = len(args.samples) * 2 * (len(args.short) + len(args.long))
    with Progress() as progress:
        task = progress.add_task("phase costs", total=total)
        for samples in args.samples:
            shapes.append(measure(args, samples, lambda: progress.advance(task)))
    steal, host = meter.lap(), host_facts()
    rows = ceilings(shapes, args.short, args.long)
    section = markdown(shapes, rows, args, host, steal)
    name = "yatt_placement_ceiling" + _suffix(args)
    (out_dir / f"{name}.md").write_text(section)
    record = {"shapes": shapes, "ceilings": rows, "steal": steal, "host": host,
              "args": vars(args) | {"out_dir": str(out_dir)}}  # fmt: skip
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1, default=str))
    plot(rows, out_dir / f"{name}.png")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
