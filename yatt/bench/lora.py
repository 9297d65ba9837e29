"""Full fine-tuning against LoRA adapters in GRPO with a KL term: step time by phase, the
process's peak memory, trainable parameters and the bytes one weight sync moves.

    .venv/bin/python yatt/bench/lora.py --threads 1            # full, rank 8 and rank 64
    .venv/bin/python yatt/bench/lora.py --steps 2 --preset tiny_test   # a smoke run

Each variant runs in its own process (so its peak resident memory is its own) at the demo shape
(SmolLM2-135M-Instruct), with `algo.kl_coef` > 0, so full fine-tuning holds a frozen reference
copy, and `algo.skip_zero_adv=false`, so every row trains in every variant. Writes
docs/bench/yatt_lora.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "docs" / "bench"
PHASES = ("gen", "old_logp", "ref", "update_actor", "update_weights")
COMMON = ["algo.kl_coef=0.05", "algo.skip_zero_adv=false", "eval.n=0", "logging.progress=false",
          "logging.overwrite=true"]  # fmt: skip
VARIANTS: dict[str, list[str]] = {
    "full": [],
    "lora_r8": ["model.lora_rank=8", "model.lora_alpha=16"],
    "lora_r64": ["model.lora_rank=64", "model.lora_alpha=128"],
}


def _child(name: str, steps: int, warmup: int, threads: int, preset: str) -> dict:
    """One variant in this process: the trainer's step metrics, then what it holds."""
    from yatt.config import load_config
    from yatt.control.transfer import pack
    from yatt.control.workers import payload_nbytes
    from yatt.lora import trained_state
    from yatt.trainer import Trainer

    overrides = [*COMMON, f"train.steps={steps + warmup}", f"train.torch_threads={threads}",
                 f"logging.run_dir=/tmp/yatt_bench_lora/{name}", *VARIANTS[name]]  # fmt: skip
    trainer = Trainer(load_config(preset, overrides))
    rows = []
    for _ in range(steps + warmup):
        rows.append(trainer.train_step())
        trainer.step += 1
    measured = rows[warmup:]
    model = trainer.policy.model
    optimizer_bytes = sum(
        value.numel() * value.element_size()
        for state in trainer.policy.optimizer.state.values()
        for value in state.values()
        if hasattr(value, "numel") and value.dim() > 0
    )
    return {
        "variant": name,
        "overrides": VARIANTS[name],
        "steps": steps,
        "step_s_median": statistics.median(r["timing_s/step"] for r in measured),
        "step_cpu_s_mean": statistics.fmean(r["perf/step_cpu_s"] for r in measured),
        "phase_s_mean": {
            p: statistics.fmean(r.get(f"timing_s/{p}", 0.0) for r in measured) for p in PHASES
        },
        "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "all_params": sum(p.numel() for p in model.parameters()),
        "optimizer_state_bytes": optimizer_bytes,
        "reference_copy": trainer.reference.model is not model,
        "sync_bytes": payload_nbytes(pack(trained_state(model))),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "kl_mean": statistics.fmean(r.get("actor/kl", 0.0) for r in measured),
    }


def _markdown(results: list[dict], host: dict, run: dict) -> str:
    full = next((r for r in results if r["variant"] == "full"), None)
    lines = [
        "## yatt: LoRA adapters against full fine-tuning",
        "",
        f"GRPO with a KL term (`{' '.join(COMMON[:2])}`), {run['shape']}, {run['steps']} "
        f"measured steps per variant after {run['warmup']} warm-up, each variant in its own "
        f"process, torch threads {run['threads'] or 'all CPUs'}: `{run['command']}`. Host: "
        f"{host['cpus']} CPUs, torch {host['torch']}, commit {host['git_commit']}, 1-min load "
        f"average at the end {host['load_avg_1m']:.1f}. Peak memory is the process's peak "
        "resident set (model, reference, optimizer, activations, sampler); `sync` is what one "
        "weight push to a separate sampler moves (yatt's packed transfer); with adapters the KL "
        "reference is the policy with its adapters off, so no copy is held. Every row trains "
        "(`algo.skip_zero_adv=false`), so the update covers the same rows in every variant.",
        "",
        "| variant | trained params | optimizer state MB | sync MB | reference copy | peak RSS MB "
        "| s/step (median) | " + " | ".join(PHASES) + " |",
        "|---" * (len(PHASES) + 7) + "|",
    ]
    for r in results:
        phases = " | ".join(f"{r['phase_s_mean'][p]:.2f}" for p in PHASES)
        share = r["trained_params"] / r["all_params"]
        lines.append(
            f"| {r['variant']} | {r['trained_params']:,} ({share:.2%}) "
            f"| {r['optimizer_state_bytes'] / 2**20:,.1f} | {r['sync_bytes'] / 2**20:,.2f} "
            f"| {'yes' if r['reference_copy'] else 'no'} | {r['peak_rss_mb']:,.0f} "
            f"| {r['step_s_median']:.2f} | {phases} |"
        )
    if full is not None:
        lines.append("")
        for r in results:
            if r is full:
                continue
            memory = r["peak_rss_mb"] / full["peak_rss_mb"]
            update = r["phase_s_mean"]["update_actor"] / full["phase_s_mean"]["update_actor"]
            lines.append(
                f"- {r['variant']} against full: peak memory {memory:.2f}x, sync bytes "
                f"{full['sync_bytes'] / r['sync_bytes']:,.0f}x fewer, update_actor {update:.2f}x "
                f"and step {r['step_s_median'] / full['step_s_median']:.2f}x full's time."
            )
    lines += ["", "![LoRA against full fine-tuning](yatt_lora.png)", ""]
    return "\n".join(lines)


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["variant"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    bottom = [0.0] * len(results)
    for phase in PHASES:
        values = [r["phase_s_mean"][phase] for r in results]
        left.bar(names, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.set(ylabel="seconds per step (mean)", title="step time by phase")
    left.legend(fontsize="small")
    right.bar(names, [r["peak_rss_mb"] for r in results], color="tab:gray")
    right.set(ylabel="MB", title="peak resident memory")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all CPUs)")
    parser.add_argument("--preset", default="demo", help="config preset (tiny_test: smoke run)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; valid: {sorted(VARIANTS)}")
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps}, {args.warmup}")
    if args.child:
        result = _child(args.child, args.steps, args.warmup, args.threads, args.preset)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    results = []
    for name in names:
        start_s = time.perf_counter()
        command = [sys.executable, __file__, "--child", name, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--threads", str(args.threads),
                   "--preset", args.preset]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if done.returncode != 0 or line is None:
            print(done.stderr[-3000:], file=sys.stderr)
            print(f"lora bench: variant {name} failed (exit {done.returncode})", file=sys.stderr)
            return 1
        results.append(json.loads(line.removeprefix("RESULT ")))
        r = results[-1]
        print(f"[summary] variant={name} step_s={r['step_s_median']:.2f} "
              f"peak_rss_mb={r['peak_rss_mb']:.0f} sync_mb={r['sync_bytes'] / 2**20:.2f} "
              f"wall_s={time.perf_counter() - start_s:.0f}", flush=True)  # fmt: skip
    from yatt.common.hostfacts import host_facts
    from yatt.config import load_config

    config = load_config(args.preset)
    model = "SmolLM2-135M-Instruct" if config.model.path == "smollm2" else config.model.path
    given = sys.argv[1:] if argv is None else argv
    run = {"command": " ".join(["python yatt/bench/lora.py", *given]), "steps": args.steps,
           "warmup": args.warmup, "threads": args.threads, "preset": args.preset,
           "shape": f"{model} (preset {args.preset}), {config.algo.prompts_per_step} prompts x "
                    f"{config.rollout.n_samples} completions, "
                    f"{config.rollout.max_new_tokens} new tokens"}  # fmt: skip
    host = host_facts()
    document = {"host": host, "run": run, "results": results}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "yatt_lora.json").write_text(json.dumps(document, indent=2) + "\n")
    markdown = _markdown(results, host, run)
    (args.out_dir / "yatt_lora.md").write_text(markdown)
    _plot(results, args.out_dir / "yatt_lora.png")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
