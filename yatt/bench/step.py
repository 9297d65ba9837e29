"""GRPO step time, phase by phase, at the demo shape (SmolLM2-135M-Instruct, 2 prompts x 4
completions, 16 new tokens), for yatt's defaults and with each speed feature switched off.

    .venv/bin/python yatt/bench/step.py                       # all variants, 12 steps each
    .venv/bin/python yatt/bench/step.py --steps 6 --variants default,hf_generate

Writes docs/bench/yatt_step.{json,md,png}. CPU only for now (the single-process trainer builds its
batches on the CPU). The TRL reference line is TRL's median step time as the TRL comparison
(`yatt/bench/trl_compare.py`, same shape) last measured it in docs/bench/yatt_trl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "docs" / "bench"
PHASES = ("gen", "reward", "old_logp", "ref", "adv", "update_actor", "update_weights")
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "hf_generate": ["rollout.backend=hf"],
    "no_shared_prefix": ["train.shared_prefix=false"],
    "no_skip_zero_adv": ["algo.skip_zero_adv=false"],
    "bf16_autocast": ["train.bf16_autocast=true"],
}


def _run_variant(
    name: str, steps: int, warmup: int, device: str, threads: int, preset: str
) -> dict:
    from yatt.config import load_config
    from yatt.trainer import Trainer

    overrides = [
        f"train.steps={steps + warmup}", f"train.device={device}", f"train.torch_threads={threads}",
        "eval.n=0", "logging.progress=false", f"logging.run_dir=/tmp/yatt_bench_step/{name}",
        "logging.overwrite=true",
        *VARIANTS[name],
    ]  # fmt: skip
    trainer = Trainer(load_config(preset, overrides))
    rows = []
    for _ in range(steps + warmup):
        rows.append(trainer.train_step())
        trainer.step += 1
    measured = rows[warmup:]
    phases = {p: statistics.fmean(r.get(f"timing_s/{p}", 0.0) for r in measured) for p in PHASES}
    step_times = [r["timing_s/step"] for r in measured]
    return {
        "variant": name,
        "overrides": VARIANTS[name],
        "steps": steps,
        "step_s_mean": statistics.fmean(step_times),
        "step_s_median": statistics.median(step_times),
        "step_cpu_s_mean": statistics.fmean(r["perf/step_cpu_s"] for r in measured),
        "phase_s_mean": phases,
        "trained_rows_frac": statistics.fmean(r["actor/trained_rows_frac"] for r in measured),
        "reward_mean": statistics.fmean(r["critic/score/mean"] for r in measured),
    }


def _trl_reference(out_dir: Path) -> dict | None:
    """TRL's median step time from the TRL comparison's last run (None if it has not run)."""
    try:
        data = json.loads((out_dir / "yatt_trl.json").read_text())
        settings = data["settings"]
        return {
            "step_s_median": float(data["summary"]["trl"]["step_s_median"]),
            "steps": settings["steps"],
            "threads": settings["threads"],
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _shape(preset: str) -> str:
    from yatt.config import load_config

    config = load_config(preset)
    name = "SmolLM2-135M-Instruct" if config.model.path == "smollm2" else config.model.path
    return (f"{name} (preset {preset}), {config.algo.prompts_per_step} prompts x "
            f"{config.rollout.n_samples} completions, {config.rollout.max_new_tokens} new tokens, "
            f"{config.data.task}")  # fmt: skip


def _threads(count: int) -> str:
    """How many torch threads a run used, in words (0: torch's default, every CPU)."""
    if not count:
        return "torch threads: all CPUs"
    return f"{count} torch thread{'s' if count > 1 else ''}"


def _markdown(results: list[dict], host: dict, run: dict) -> str:
    trl = run["trl_reference"]
    reference = ""
    if trl:
        reference = (
            f"TRL's median step time at this shape, from the TRL comparison below ({trl['steps']} "
            f"steps, {_threads(trl['threads'])}): {trl['step_s_median']:.2f} s (the red line). "
        )
        if trl["threads"] != run["threads"]:
            reference += (
                f"It ran at {_threads(trl['threads'])} and these variants at "
                f"{_threads(run['threads'])}, so the line is a landmark, not a like-for-like "
                "comparison (the TRL comparison's own table is). "
            )
    lines = [
        "## yatt: GRPO step time breakdown",
        "",
        f"{run['shape']}, {results[0]['steps']} measured steps per variant after "
        f"{run['warmup']} warm-up steps, {_threads(run['threads'])}: "
        f"`{run['command']}`. Host: {host['cpus']} CPUs, torch {host['torch']}, 1-min load "
        f"average at the end {host['load_avg_1m']:.1f}, commit {host['git_commit']}. "
        + reference
        + "CPU s/step is this process's CPU time; with `--threads 1` it approximates the step time "
        "of an otherwise idle machine. Steps start from the untrained model, where most groups "
        "have all-equal rewards (`trained rows`: the rest are skipped exactly); later in training "
        "about half the rows train and `update_actor` grows with them.",
        "",
        "| variant | s/step (mean) | s/step (median) | CPU s/step | "
        + " | ".join(PHASES)
        + " | trained rows |",
        "|---" * (len(PHASES) + 5) + "|",
    ]
    for r in results:
        phases = " | ".join(f"{r['phase_s_mean'][p]:.2f}" for p in PHASES)
        lines.append(
            f"| {r['variant']} | {r['step_s_mean']:.2f} | {r['step_s_median']:.2f} "
            f"| {r['step_cpu_s_mean']:.2f} | {phases} "
            f"| {100 * r['trained_rows_frac']:.0f}% |"
        )
    lines += ["", "![step time by phase](yatt_step.png)", ""]
    return "\n".join(lines)


def _plot(results: list[dict], path: Path, run: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    names = [r["variant"] for r in results]
    bottom = [0.0] * len(results)
    for phase in PHASES:
        values = [r["phase_s_mean"][phase] for r in results]
        ax.bar(names, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    trl = run["trl_reference"]
    if trl:
        ax.axhline(trl["step_s_median"], color="red", linestyle="--",
                   label=f"TRL, median step ({_threads(trl['threads'])})")  # fmt: skip
    ax.set_ylabel("seconds per step")
    ax.set_title(f"yatt GRPO step, {_threads(run['threads'])}\n{run['shape']}", fontsize="small")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # off the bars
    plt.setp(ax.get_xticklabels(), rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all CPUs)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--preset", default="demo", help="config preset (tiny_test: smoke run)")
    parser.add_argument("--from-json", type=Path, help="no runs: write the markdown and plot "
                        "again from a saved yatt_step.json")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_json is not None:
        document = json.loads(args.from_json.read_text())
        _write(args.out_dir, document, json_too=False)
        return 0
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; valid: {sorted(VARIANTS)}")
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps}, {args.warmup}")
    from yatt.common.hostfacts import host_facts
    from yatt.config import preset_names

    if args.preset not in preset_names():
        parser.error(f"--preset {args.preset!r} unknown; valid: {preset_names()}")
    results = []
    for name in names:
        start_s = time.perf_counter()
        results.append(
            _run_variant(name, args.steps, args.warmup, args.device, args.threads, args.preset)
        )
        print(f"[summary] variant={name} step_s={results[-1]['step_s_mean']:.3f} "
              f"wall_s={time.perf_counter() - start_s:.0f}", flush=True)  # fmt: skip
    host = host_facts()
    given = sys.argv[1:] if argv is None else argv
    run = {"command": " ".join(["python yatt/bench/step.py", *given]), "threads": args.threads,
           "warmup": args.warmup, "preset": args.preset, "shape": _shape(args.preset),
           "trl_reference": _trl_reference(args.out_dir)}  # fmt: skip
    _write(args.out_dir, {"host": host, "run": run, "results": results}, json_too=True)
    return 0


def _write(out_dir: Path, document: dict, *, json_too: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    if json_too:
        (out_dir / "yatt_step.json").write_text(json.dumps(document, indent=2))
    results, run = document["results"], document["run"]
    (out_dir / "yatt_step.md").write_text(_markdown(results, document["host"], run))
    _plot(results, out_dir / "yatt_step.png", run)


if __name__ == "__main__":
    sys.exit(main())
