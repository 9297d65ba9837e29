"""What people see of a run: a rich progress bar, the end-of-run summary table, and the plots.

Only entry points (the CLI, the demo, bench scripts) use this module; the trainer reports through
a `progress(step, total, metrics)` callback and its metric history.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from yatt.errors import DataError

__all__ = [
    "console",
    "control_table",
    "evals_of",
    "load_history",
    "progress_bar",
    "summary_table",
    "wide_console",
    "write_plots",
]

logger = logging.getLogger(__name__)

console = Console(stderr=True)


def wide_console() -> Console:
    """A stdout console for bench tables: 160 columns when output is not a terminal (logs,
    pipes), where rich would squeeze a table to 80 and cut or wrap its cells."""
    plain = Console()
    return plain if plain.is_terminal else Console(width=160)


ProgressFn = Callable[[int, int, dict[str, float]], None]
_METRICS_FILES = ("metrics.jsonl", "sft_metrics.jsonl")  # an RL run's, an SFT run's


@contextmanager
def progress_bar(
    total_steps: int,
    start_step: int = 0,
    enabled: bool = True,
    metric: str = "critic/score/mean",
    label: str = "reward",
) -> Iterator[ProgressFn]:
    """A progress callback showing step, `metric` as `label` (moving average over 10 steps),
    step time and ETA."""
    if not enabled:
        yield lambda step, total, metrics: None
        return
    columns = (
        TextColumn("[bold]step {task.completed:>4.0f}/{task.total:.0f}"),
        BarColumn(),
        TextColumn(f"{label} {{task.fields[reward]:.3f}}"),
        TextColumn("{task.fields[step_s]:.2f} s/step"),
        TextColumn("{task.fields[extra]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    rewards: list[float] = []
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(
            "train", total=total_steps, completed=start_step, reward=0.0, step_s=0.0, extra=""
        )

        def update(step: int, total: int, metrics: dict[str, float]) -> None:
            rewards.append(metrics.get(metric, 0.0))
            extra = ""
            if "eval/accuracy" in metrics:
                extra = f"acc {100 * metrics['eval/accuracy']:.1f}%"
            if "sft/heldout_loss" in metrics:
                extra = f"held-out loss {metrics['sft/heldout_loss']:.3f}"
            bar.update(
                task,
                completed=step,
                reward=statistics.fmean(rewards[-10:]),
                step_s=metrics.get("timing_s/step", 0.0),
                extra=extra,
            )

        yield update


def summary_table(history: list[dict[str, float]], evals: list[tuple[int, float]]) -> Table:
    """Accuracy before/after, reward early vs late, and the mean time of each phase; for an
    SFT run's history (rows with `sft/loss`), its loss curve instead (`evals` unused)."""
    if any("sft/loss" in row for row in history):
        return _sft_summary([row for row in history if "sft/loss" in row])
    steps = [row for row in history if "timing_s/step" in row]
    table = Table(title="yatt run summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    if evals:
        table.add_row("held-out accuracy (first)", f"{100 * evals[0][1]:.1f}% @ step {evals[0][0]}")
        for step, accuracy in evals[1:]:
            table.add_row("held-out accuracy", f"{100 * accuracy:.1f}% @ step {step}")
    if steps:
        window = max(1, min(20, len(steps) // 4))
        early = statistics.fmean(r["critic/score/mean"] for r in steps[:window])
        late = statistics.fmean(r["critic/score/mean"] for r in steps[-window:])
        table.add_row(f"reward (first {window} steps)", f"{early:.3f}")
        table.add_row(f"reward (last {window} steps)", f"{late:.3f}")
        table.add_row("steps", str(len(steps)))
        for key in sorted({k for r in steps for k in r if k.startswith("timing_s/")}):
            mean_s = statistics.fmean(r[key] for r in steps if key in r)
            if mean_s >= 0.0005:  # phases this algorithm skips stay out of the table
                table.add_row(f"{key} (mean)", f"{mean_s:.3f}")
        throughput = statistics.fmean(r["perf/throughput"] for r in steps)
        table.add_row("perf/throughput (tokens/s)", f"{throughput:.0f}")
    return table


def control_table(run_dir: Path) -> Table | None:
    """What a distributed run's `control.json` says: the settings of each part of the run,
    the steps recorded, wall time, driver memory and bytes, the workers' peak memory and the
    runtime re-placement moves; None for a run without one (a single-process run). A file
    that does not parse is named in a warning and left out."""
    path = Path(run_dir) / "control.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
        table = Table(title="distributed run (control.json)")
        table.add_column("what")
        table.add_column("value")
        for part in summary["segments"]:
            first, last = part["steps"]
            settings = part.get("settings") or "(settings not recorded)"
            table.add_row(f"steps {first}-{last}", settings)
        if summary.get("not_recorded"):
            gaps = ", ".join(f"{a}-{b}" for a, b in summary["not_recorded"])
            table.add_row("steps not recorded", gaps)
        table.add_row("wall time", f"{summary['wall_s']:.1f} s")
        table.add_row("driver peak memory", f"{summary['driver_peak_rss_mb']:.0f} MiB")
        table.add_row("bytes through the driver", f"{summary['bytes_moved']:,}")
        peaks = [stats["peak_rss_mb"] for stats in summary["workers"].values()
                 if "peak_rss_mb" in stats]  # fmt: skip
        if peaks:
            table.add_row("worker peak memory (most)", f"{max(peaks):.0f} MiB")
        decisions = summary.get("decisions", [])
        if decisions:
            moves = [d for d in decisions if d["switch"]]
            table.add_row("re-placement decisions", f"{len(decisions)}, {len(moves)} moves")
            for move in moves:
                why = f" ({move['reason']})" if move.get("reason") else ""
                table.add_row(
                    f"move before step {move['step']}", f"{move['from']} -> {move['to']}{why}"
                )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("%s: cannot read it (%s); left out of the report", path,
                       " ".join(f"{type(exc).__name__}: {exc}".split())[:200])  # fmt: skip
        return None
    return table


def _sft_summary(rows: list[dict[str, float]]) -> Table:
    """Train loss over the first and last tenth of the steps, the last held-out loss, epochs
    and step time of an SFT run's rows (each with `step`)."""
    table = Table(title="yatt sft summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    tenth = max(1, len(rows) // 10)
    for name, part in (("first", rows[:tenth]), ("last", rows[-tenth:])):
        loss = statistics.fmean(row["sft/loss"] for row in part)
        table.add_row(f"train loss, {name} {len(part)} steps (mean)", f"{loss:.4f}")
    held = [row for row in rows if "sft/heldout_loss" in row]
    if held:
        step, loss = int(held[-1]["step"]), held[-1]["sft/heldout_loss"]
        table.add_row(f"held-out loss at step {step}", f"{loss:.4f}")
    table.add_row("epochs over the training set", f"{rows[-1]['sft/epoch']:.2f}")
    step_s = statistics.fmean(row["timing_s/step"] for row in rows)
    table.add_row("mean step time", f"{step_s:.3f} s")
    return table


def write_plots(history: list[dict[str, float]], run_dir: Path) -> list[Path]:
    """An RL run's rewards.png (reward + accuracy curves) and timing.png (phase seconds per
    step); an SFT run's loss.png (train and held-out loss, learning rate)."""
    from yatt.common.plots import plot_rewards, plot_sft_loss, plot_timings

    run_dir = Path(run_dir)
    if any("sft/loss" in row for row in history):
        return [plot_sft_loss(history, run_dir / "loss.png")]
    return [
        plot_rewards(history, run_dir / "rewards.png"),
        plot_timings(history, run_dir / "timing.png"),
    ]


def load_history(run_dir: Path) -> list[dict[str, Any]]:
    """The metric rows of `run_dir/metrics.jsonl` (an RL run, single-process or Ray), or else of
    `run_dir/sft_metrics.jsonl` (an SFT run: rows with `sft/loss`).

    A torn last line (the run stopped mid-write) is left out, with a warning. Raises DataError,
    one line, for a folder that is missing, has neither file or a file without rows, or has a
    damaged row before the last.
    """
    from yatt.common import read_metrics

    if not Path(run_dir).is_dir():
        raise DataError(f"{run_dir}: no such folder")
    found = [Path(run_dir) / name for name in _METRICS_FILES if (Path(run_dir) / name).is_file()]
    if not found:
        raise DataError(
            f"{run_dir}: no metrics.jsonl or sft_metrics.jsonl here (is it a yatt run folder?)"
        )
    path = found[0]
    try:
        rows, torn = read_metrics(path)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    if torn:
        logger.warning("%s: its last line is torn (the run stopped mid-write); left out", path)
    if not rows:
        raise DataError(f"{path} holds no metrics rows yet: nothing to report")
    return [row for _, row in rows]


def evals_of(history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of the rows that carry an evaluation."""
    return [
        (int(row["step"]), row["eval/accuracy"])
        for row in history
        if isinstance(row.get("eval/accuracy"), int | float)
    ]
