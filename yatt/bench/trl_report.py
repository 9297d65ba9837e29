"""The report of ``trl_compare.py``: run summaries, the markdown section, plots, the table.

Kept apart from the runs so that ``--report-only`` and the tests rebuild a report from stored
results without TRL or a model.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

RUN_LABELS = {"yatt": "yatt fp32", "yatt_bf16": "yatt bf16 rollouts", "trl": "TRL"}


def version(package: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "unknown"


def summarize(result: dict[str, Any], settings: Any) -> dict[str, Any]:
    """Throughput and timing summary of one run's step records."""
    steps = result["steps"]
    total_s = sum(s["step_s"] for s in steps)
    phase_names = sorted({name for s in steps for name in s["phases_s"]})
    return {
        "run": result.get("run", result["framework"]),
        "framework": result["framework"],
        "version": result["version"],
        "samples_per_s": settings.batch_completions * len(steps) / total_s,
        "tokens_per_s": sum(s["completion_tokens"] for s in steps) / total_s,
        "step_s_median": statistics.median(s["step_s"] for s in steps),
        "step_s_mean": total_s / len(steps),
        "phase_s_median": {
            name: statistics.median(s["phases_s"].get(name, 0.0) for s in steps)
            for name in phase_names
        },
        "reward_mean": statistics.fmean(s["reward"] for s in steps),
        "cpu_s_median": _median_of(steps, "cpu_s"),
        "zero_signal_frac": _mean_of(steps, "zero_signal_frac"),
        "prompt_ids_match_yatt": result.get("prompt_ids_match_yatt"),
        "accuracy_before": result["accuracy_before"],
        "accuracy_after": result["accuracy_after"],
        "accuracy_curve": result.get("accuracy_curve", []),
        "torch_threads": result["torch_threads"],
    }


def _median_of(steps: list[dict], key: str) -> float | None:
    """Median of `key` over the steps, or None when a step lacks it (older result files)."""
    values = [s.get(key) for s in steps]
    return None if None in values else statistics.median(values)


def _mean_of(steps: list[dict], key: str) -> float | None:
    values = [s.get(key) for s in steps]
    return None if None in values else statistics.fmean(values)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(
    summaries: dict[str, dict], settings: Any, host: dict, fairness: dict[str, str]
) -> str:
    trl = summaries["trl"]
    model = "SmolLM2-135M-Instruct" if settings.model == "smollm2" else "tiny random-init Llama"
    ratios = "; ".join(
        f"{_label(name)} is **{s['samples_per_s'] / trl['samples_per_s']:.2f}x** TRL"
        for name, s in summaries.items()
        if name != "trl"
    )
    lines = [
        "## yatt vs TRL: GRPO side by side",
        "",
        f"{model}, two-digit addition, {settings.prompts_per_step} prompts x "
        f"{settings.n_samples} completions per step, {settings.max_new_tokens} new tokens, "
        f"{settings.steps} steps each, {settings.threads} torch threads, one run "
        f"(`yatt/bench/trl_compare.py`). In completions/s: {ratios}. All runs train in fp32; "
        "'yatt bf16 rollouts' only samples in bf16 (see the fairness settings).",
        "",
        *_summary_rows(summaries),
        "",
        *curve_table({name: s["accuracy_curve"] for name, s in summaries.items()}),
        "Median phase times (s) per step. yatt: its own phase timers; TRL: `gen` is "
        "`model.generate`, `gen_and_score` is `_generate_and_score_completions` (generation, "
        "reward, advantages), `update` = step - gen_and_score (forward, backward, AdamW), "
        "`trl_step_time` is TRL's own logged `step_time`.",
        "",
    ]
    for name, summary in summaries.items():
        phases = ", ".join(
            f"{k} {v:.2f}" for k, v in summary["phase_s_median"].items() if v >= 0.005
        )
        lines.append(f"- {_label(name)}: {phases}")
    match = {True: "yes", False: "NO", None: "not checked"}[trl["prompt_ids_match_yatt"]]
    lines += ["", f"TRL's prompt token ids equal yatt's (checked on the first prompt): {match}."]
    lines += ["", "Fairness settings:", ""]
    lines += [f"- **{key}**: {text}" for key, text in fairness.items()]
    load = host.get("load_avg_1m", host.get("load_avg_1m_end"))  # (the key of older reports)
    commit = f", commit {host['git_commit']}" if "git_commit" in host else ""
    lines += [
        "",
        f"Machine: {host['cpus']} CPUs ({host['processor']}), python {host['python']}, torch "
        f"{host['torch']}, transformers {host['transformers']}, trl {host['trl']}{commit}; 1-min "
        f"load average at the end {load:.1f} (other work on a shared machine slows every run "
        "and makes the ratios noisy).",
        "",
        "![reward curves and accuracy](yatt_trl.png)",
        "",
    ]
    return "\n".join(lines)


def _label(run: str) -> str:
    return RUN_LABELS.get(run, run)


def _summary_rows(summaries: dict[str, dict]) -> list[str]:
    """The markdown table of the runs' summaries, one column per run."""
    rows = [
        ("version", lambda s: s["version"]),
        ("completions/s", lambda s: f"{s['samples_per_s']:.2f}"),
        ("completion tokens/s", lambda s: f"{s['tokens_per_s']:.1f}"),
        ("step s (median)", lambda s: f"{s['step_s_median']:.2f}"),
        ("step s (mean)", lambda s: f"{s['step_s_mean']:.2f}"),
        ("process CPU s per step (median)", lambda s: _fmt(s["cpu_s_median"], ".2f")),
        ("groups with all-equal rewards", lambda s: _fmt(s["zero_signal_frac"], ".0%")),
        ("mean train reward", lambda s: f"{s['reward_mean']:.3f}"),
        ("held-out acc. before", lambda s: f"{100 * s['accuracy_before']:.1f}%"),
        ("held-out acc. after", lambda s: f"{100 * s['accuracy_after']:.1f}%"),
    ]
    lines = ["| | " + " | ".join(_label(name) for name in summaries) + " |",
             "|---" * (len(summaries) + 1) + "|"]  # fmt: skip
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(s) for s in summaries.values()) + " |")
    return lines


def curve_table(curves: dict[str, list]) -> list[str]:
    """Markdown rows of held-out accuracy by step, one column per run (empty if one lacks it)."""
    if not curves or not all(curves.values()):
        return []
    by_step = {name: {int(step): accuracy for step, accuracy in curve}
               for name, curve in curves.items()}  # fmt: skip
    steps = sorted({step for points in by_step.values() for step in points})
    lines = [
        "Held-out greedy accuracy (200 problems) during training; evaluation time is not "
        "counted in the step times.",
        "",
        "| step | " + " | ".join(_label(name) for name in curves) + " |",
        "|---:" * (len(curves) + 1) + "|",
    ]
    for step in steps:
        cells = [by_step[name].get(step) for name in curves]
        text = ["n/a" if value is None else f"{100 * value:.1f}%" for value in cells]
        lines.append(f"| {step} | " + " | ".join(text) + " |")
    return [*lines, ""]


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve, bars) = plt.subplots(1, 2, figsize=(11, 4))
    window = 5
    for name, result in results.items():
        rewards = [s["reward"] for s in result["steps"]]
        smooth = [statistics.fmean(rewards[max(0, i - window + 1) : i + 1])
                  for i in range(len(rewards))]  # fmt: skip
        line = curve.plot(range(1, len(rewards) + 1), rewards, alpha=0.3)[0]
        curve.plot(range(1, len(rewards) + 1), smooth, color=line.get_color(),
                   label=f"{_label(name)} ({window}-step mean)")  # fmt: skip
    curve.set(xlabel="step", ylabel="mean reward of the step's completions", title="train reward",
              ylim=(-0.02, 1.02))  # fmt: skip
    curve.legend()
    for name, result in results.items():
        points = result.get("accuracy_curve") or [
            (0, result["accuracy_before"]),
            (len(result["steps"]), result["accuracy_after"]),
        ]
        bars.plot([p[0] for p in points], [100 * p[1] for p in points], marker="o",
                  label=_label(name))  # fmt: skip
    bars.set(xlabel="step", ylabel="held-out greedy accuracy (%)", title="200 held-out problems",
             ylim=(0, 100))  # fmt: skip
    bars.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_table(summaries: dict[str, dict]) -> None:
    from rich.table import Table

    from yatt.report import wide_console

    table = Table(title="yatt vs TRL (GRPO, same settings)")
    table.add_column("metric")
    for name in summaries:
        table.add_column(_label(name), justify="right")
    rows = [
        ("completions/s", "samples_per_s", "{:.2f}"),
        ("tokens/s", "tokens_per_s", "{:.1f}"),
        ("step s (median)", "step_s_median", "{:.2f}"),
        ("reward mean", "reward_mean", "{:.3f}"),
        ("acc. before", "accuracy_before", "{:.1%}"),
        ("acc. after", "accuracy_after", "{:.1%}"),
    ]
    for label, key, fmt in rows:
        table.add_row(label, *(fmt.format(s[key]) for s in summaries.values()))
    trl_rate = summaries["trl"]["samples_per_s"]
    table.caption = ", ".join(f"{_label(name)} / TRL completions/s = "
                              f"{s['samples_per_s'] / trl_rate:.2f}x"
                              for name, s in summaries.items() if name != "trl")  # fmt: skip
    wide_console().print(table)


def write_report(
    out_dir: Path,
    settings: Any,
    results: dict[str, dict],
    fairness: dict[str, str],
    host: dict[str, Any] | None = None,
) -> None:
    """Summaries, ``yatt_trl.{json,md,png}`` in ``out_dir`` and a console table of the runs.

    Args:
        settings: the bench's ``BenchSettings``.
        fairness: what makes the runs comparable, as shown in the report.
        host: the machine the runs measured (a rebuilt report keeps its stored one); None =
            this machine, now.
    """
    summaries = {name: summarize(result, settings) for name, result in results.items()}
    if host is None:
        from yatt.common.hostfacts import host_facts

        host = host_facts() | {"trl": version("trl")}
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"settings": dataclasses.asdict(settings), "fairness": fairness, "host": host,
               "summary": summaries, "runs": results}  # fmt: skip
    (out_dir / "yatt_trl.json").write_text(json.dumps(payload, indent=2))
    (out_dir / "yatt_trl.md").write_text(markdown(summaries, settings, host, fairness))
    plot(results, out_dir / "yatt_trl.png")
    print_table(summaries)
