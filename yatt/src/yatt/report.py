"""What people see of a run: a rich progress bar, the end-of-run summary table, and the plots.

Only entry points (the CLI, the demo, bench scripts) use this module; the trainer reports through
a `progress(step, total, metrics)` callback and its metric history.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
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
# an RL run's, an SFT run's, a reward model's (`yatt rm`), a DPO run's (`yatt dpo`)
_METRICS_FILES = ("metrics.jsonl", "sft_metrics.jsonl", "rm_metrics.jsonl", "dpo_metrics.jsonl")


PLAIN_PROGRESS_EVERY_S = 30.0  # a progress line at most this often where no bar can show
_RECENT = 10  # steps the shown reward and step time average over


@contextmanager
def progress_bar(
    total_steps: int,
    start_step: int = 0,
    enabled: bool = True,
    metric: str = "critic/score/mean",
    label: str = "reward",
) -> Iterator[ProgressFn]:
    """A progress callback showing step, `metric` as `label` and step time (means over the last
    10 steps), the latest held-out result, and ETA. Where stderr is no terminal (a log file, a
    batch job), where a bar cannot draw, it logs the same as a line every
    `PLAIN_PROGRESS_EVERY_S` seconds and at the last step."""
    if not enabled:
        yield lambda step, total, metrics: None
        return
    recent = _Recent(metric)
    if not console.is_terminal and not console.is_jupyter:  # (a notebook draws the bar)
        yield _log_lines(recent, label)
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
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(
            "train", total=total_steps, completed=start_step, reward=0.0, step_s=0.0, extra=""
        )

        def update(step: int, total: int, metrics: dict[str, float]) -> None:
            reward, step_s, extra = recent.note(metrics)
            bar.update(task, completed=step, reward=reward, step_s=step_s, extra=extra)

        yield update


class _Recent:
    """What the progress shows of the rows so far: the means over the last `_RECENT` steps of
    `metric` and of the step time, and the latest held-out result."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.rewards: list[float] = []
        self.step_times: list[float] = []
        self.held_out = ""

    def note(self, metrics: dict[str, float]) -> tuple[float, float, str]:
        """Take in a row (a step's; an evaluation-only row has no step time or reward)."""
        if self.metric in metrics:
            self.rewards.append(metrics[self.metric])
        if "timing_s/step" in metrics:
            self.step_times.append(metrics["timing_s/step"])
        if "eval/accuracy" in metrics:
            self.held_out = f"acc {100 * metrics['eval/accuracy']:.1f}%"
        if "sft/heldout_loss" in metrics:
            self.held_out = f"held-out loss {metrics['sft/heldout_loss']:.3f}"
        if "rm/heldout_accuracy" in metrics:
            self.held_out = (
                f"held-out pairs ranked right {100 * metrics['rm/heldout_accuracy']:.1f}%"
            )
        return (
            statistics.fmean(self.rewards[-_RECENT:]) if self.rewards else math.nan,
            statistics.fmean(self.step_times[-_RECENT:]) if self.step_times else math.nan,
            self.held_out,
        )


def _log_lines(recent: _Recent, label: str) -> ProgressFn:
    """The progress as a log line every `PLAIN_PROGRESS_EVERY_S` seconds and at the last step
    (stderr is no terminal: a log file, a batch job)."""
    started_s, last_s = time.monotonic(), -math.inf

    def log_line(step: int, total: int, metrics: dict[str, float]) -> None:
        nonlocal last_s
        reward, step_s, extra = recent.note(metrics)
        now_s = time.monotonic()
        if now_s - last_s < PLAIN_PROGRESS_EVERY_S and step < total:
            return
        last_s = now_s
        # From the recent steps: a resumed run's earlier ones ran in another process.
        eta = step_s * (total - step)
        logger.info(
            "step %d/%d: %s %.3f, %.2f s/step (last %d steps)%s, elapsed %s, eta %s",
            step, total, label, reward, step_s, min(len(recent.step_times), _RECENT),
            f", {extra}" if extra else "", _clock(now_s - started_s), _clock(eta),
        )  # fmt: skip

    return log_line


def _clock(seconds: float) -> str:
    """`seconds` as h:mm:ss ("?" when unknown)."""
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def summary_table(history: list[dict[str, float]], evals: list[tuple[int, float]]) -> Table:
    """Accuracy before/after, reward early vs late, and the mean time of each phase; for an
    SFT run's history (rows with `sft/loss`), its loss curve instead (`evals` unused).

    A value that is not a number is left out; a NaN or an infinity shows as nan / inf, and a
    mean is taken over the finite values (the cell says how many others it left out)."""
    kind = _run_kind(history)
    if kind == "sft":
        return _sft_summary([row for row in history if "sft/loss" in row])
    if kind == "rm":
        return _rm_summary(history)
    if kind == "dpo":
        return _dpo_summary(history)
    steps = [row for row in history if "timing_s/step" in row]
    table = Table(title="yatt run summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    problems = {  # how many problems each evaluation scored (rows that record it)
        int(row["step"]): int(row["eval/problems"])
        for row in history
        if all(_is_number(row.get(k)) and math.isfinite(row[k]) for k in ("eval/problems", "step"))
    }
    ends = {0: " (first)", len(evals) - 1: " (last)"} if len(evals) > 1 else {}
    for index, (step, accuracy) in enumerate(evals):
        which = ends.get(index, "")
        scored = f" on {problems[step]}" if step in problems else ""
        table.add_row(f"held-out accuracy{which}", f"{_percent(accuracy)} @ step {step}{scored}")
    if steps:
        window = max(1, min(20, len(steps) // 4))
        for name, part in (("first", steps[:window]), ("last", steps[-window:])):
            reward = _mean_cell(part, "critic/score/mean", ".3f") or "n/a"
            table.add_row(f"reward ({name} {window} steps)", reward)
        table.add_row("steps", str(len(steps)))
        for key in sorted({k for r in steps for k in r if k.startswith("timing_s/")}):
            values = _numbers(steps, key)
            finite = [v for v in values if math.isfinite(v)]
            if finite and statistics.fmean(finite) < 0.0005 and len(finite) == len(values):
                continue  # phases this algorithm skips stay out of the table
            cell = _mean_cell(steps, key, ".3f")
            if cell is not None:
                table.add_row(f"{key} (mean)", cell)
        table.add_row("perf/throughput (tokens/s, whole run)", _overall_throughput(steps))
    return table


def _overall_throughput(steps: list[dict[str, Any]]) -> str:
    """Every step's tokens over every step's time (each step's tokens are its rate times its
    time): a mean of the per-step rates would count a short step as much as a long one."""
    pairs = [
        (float(row["perf/throughput"]), float(row["timing_s/step"]))
        for row in steps
        if _is_number(row.get("perf/throughput")) and _is_number(row.get("timing_s/step"))
    ]
    finite = [(rate, step_s) for rate, step_s in pairs if math.isfinite(rate * step_s)]
    seconds = sum(step_s for _, step_s in finite)
    if not finite or not seconds > 0:
        return "n/a"
    cell = f"{sum(rate * step_s for rate, step_s in finite) / seconds:.0f}"
    left_out = len(pairs) - len(finite)
    return cell + (f" ({left_out} non-finite steps left out)" if left_out else "")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numbers(rows: list[dict[str, Any]], key: str) -> list[float]:
    """The numeric values of `key` in `rows` (rows without one, or with another kind of value,
    are passed over)."""
    return [float(row[key]) for row in rows if _is_number(row.get(key))]


def _show(value: float, spec: str) -> str:
    """`value` formatted by `spec`, or nan / inf / -inf."""
    return format(value, spec) if math.isfinite(value) else str(value)


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if math.isfinite(fraction) else str(fraction)


def _mean_cell(rows: list[dict[str, Any]], key: str, spec: str) -> str | None:
    """The mean of `key` over `rows`, formatted by `spec`: over the finite values, naming how
    many NaN or infinite ones it left out; nan / inf when no value is finite; None when no row
    has a number for `key`."""
    values = _numbers(rows, key)
    if not values:
        return None
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return _show(statistics.fmean(values), spec)
    text = format(statistics.fmean(finite), spec)
    if len(finite) < len(values):
        text += f" ({len(values) - len(finite)} nan/inf left out)"
    return text


def control_table(run_dir: Path) -> Table | None:
    """What a distributed run's `control.json` says: the settings of each part of the run,
    the steps recorded, wall time, driver memory and bytes, the workers' peak memory and the
    runtime re-placement moves; None for a run without one (a single-process run). A file
    that does not parse is named in a warning and left out."""
    path = _run_folder(run_dir) / "control.json"
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
    _add_loss_tenths(table, rows, "sft/loss", "train loss")
    held = [row for row in rows if _is_number(row.get("sft/heldout_loss"))]
    if held:
        step, loss = int(held[-1]["step"]), held[-1]["sft/heldout_loss"]
        table.add_row(f"held-out loss at step {step}", _show(loss, ".4f"))
    epochs = _numbers(rows, "sft/epoch")
    if epochs:
        table.add_row("epochs over the training set", _show(epochs[-1], ".2f"))
    _add_step_time(table, rows)
    return table


def _add_loss_tenths(table: Table, rows: list[dict[str, float]], key: str, label: str) -> None:
    """Rows of `table`: the mean of `key` over the first and the last tenth of `rows`."""
    tenth = max(1, len(rows) // 10)
    for name, part in (("first", rows[:tenth]), ("last", rows[-tenth:])):
        loss = _mean_cell(part, key, ".4f")
        if loss is not None:
            table.add_row(f"{label}, {name} {len(part)} steps (mean)", loss)


def _add_step_time(table: Table, rows: list[dict[str, float]]) -> None:
    """A row of `table`: the mean step time of `rows`, where they hold one."""
    step_s = _mean_cell(rows, "timing_s/step", ".3f")
    if step_s is not None:
        table.add_row("mean step time", f"{step_s} s")


def _run_kind(history: list[dict[str, Any]]) -> str:
    """Which job wrote `history`: "sft" (rows with `sft/loss`), "rm" (a reward model's: rows
    with `rm/` keys, also one stopped after its step-0 evaluation), "dpo" (rows with `dpo/`
    keys, likewise) or "rl"."""
    if any("sft/loss" in row for row in history):
        return "sft"
    for prefix in ("rm/", "dpo/"):
        if any(key.startswith(prefix) for row in history for key in row):
            return prefix[:-1]
    return "rl"


def _rm_summary(rows: list[dict[str, float]]) -> Table:
    """A reward model's (`yatt rm`) sampled pairs (where it sampled them), held-out accuracy
    before and after training, loss over the first and last tenth of the steps, and step
    time."""
    table = Table(title="yatt rm summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    _add_sampled(table, rows, "rm/")
    held = [row for row in rows if _is_number(row.get("rm/heldout_accuracy"))]
    for row in held[:1] + held[1:][-1:]:
        pairs = int(row["rm/heldout_pairs"]) if _is_number(row.get("rm/heldout_pairs")) else "?"
        table.add_row(
            f"held-out pairs ranked right, step {int(row['step'])}",
            f"{_show(100 * row['rm/heldout_accuracy'], '.1f')}% of {pairs}",
        )
        kinds = [row.get(f"rm/heldout_accuracy_{kind}") for kind in ("slips", "samples")]
        if all(map(_is_number, kinds)):
            shares = " / ".join(f"{_show(100 * value, '.1f')}%" for value in kinds)
            table.add_row("  of them: slips / samples", shares)
    steps = [row for row in rows if "rm/loss" in row]
    _add_loss_tenths(table, steps, "rm/loss", "loss")
    _add_step_time(table, steps)
    return table


def _add_sampled(table: Table, rows: list[dict[str, float]], prefix: str) -> None:
    """The rows of a job that sampled its pairs (`yatt.pairs.sample_pairs`): the share of the
    samples scored as high as the reference answer, and the pairs they gave."""
    for row in [row for row in rows if _is_number(row.get(f"{prefix}samples_best"))][:1]:
        table.add_row("samples scored as high as the reference",
                      f"{_show(100 * row[f'{prefix}samples_best'], '.1f')}%")  # fmt: skip
        if _is_number(row.get(f"{prefix}sample_pairs")):
            pairs = f"{int(row[f'{prefix}sample_pairs']):,}"
            table.add_row("pairs from samples (training and held out)", pairs)


def _dpo_summary(rows: list[dict[str, float]]) -> Table:
    """A DPO run's (`yatt dpo`) pairs, held-out accuracy before and after training, held-out
    pairs ranked right by the implicit reward at the end, loss over the first and last tenth
    of the steps, and step time."""
    table = Table(title="yatt dpo summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    _add_sampled(table, rows, "dpo/")
    for row in [row for row in rows if _is_number(row.get("dpo/pairs"))][:1]:
        table.add_row("training pairs", f"{int(row['dpo/pairs']):,}")
    for row in [row for row in rows if _is_number(row.get("eval/accuracy"))]:
        scored = f" on {int(row['eval/problems'])}" if _is_number(row.get("eval/problems")) else ""
        table.add_row(f"held-out accuracy, step {int(row['step'])}",
                      f"{_percent(row['eval/accuracy'])}{scored}")  # fmt: skip
    for row in [row for row in rows if _is_number(row.get("dpo/heldout_accuracy"))][-1:]:
        table.add_row(f"held-out pairs ranked right, step {int(row['step'])}",
                      f"{_show(100 * row['dpo/heldout_accuracy'], '.1f')}%")  # fmt: skip
    steps = [row for row in rows if "dpo/loss" in row]
    _add_loss_tenths(table, steps, "dpo/loss", "loss")
    _add_step_time(table, steps)
    return table


def write_plots(history: list[dict[str, float]], run_dir: Path) -> list[Path]:
    """An RL run's rewards.png (reward + accuracy curves) and timing.png (phase seconds per
    step); an SFT run's loss.png (train and held-out loss, learning rate); a reward model's
    rm.png (loss, and pairs ranked right in each step and held out); a DPO run's dpo.png
    (loss, and the implicit rewards of the chosen and rejected responses). A NaN or an
    infinity is left out of the curves (a gap), as is a value that is not a number."""
    from yatt.common.plots import (
        plot_dpo,
        plot_reward_model,
        plot_rewards,
        plot_sft_loss,
        plot_timings,
    )

    run_dir = _run_folder(run_dir)
    history = [
        {key: value for key, value in row.items()
         if key == "step" or (_is_number(value) and math.isfinite(value))}
        for row in history
    ]  # fmt: skip
    kind = _run_kind(history)
    if kind == "sft":
        plots = [(plot_sft_loss, "loss.png")]
    elif kind == "rm":
        plots = [(plot_reward_model, "rm.png")]
    elif kind == "dpo":
        plots = [(plot_dpo, "dpo.png")]
    else:
        plots = [(plot_rewards, "rewards.png"), (plot_timings, "timing.png")]
    written = []
    for plot, name in plots:
        try:
            written.append(plot(history, run_dir / name))
        except OSError as error:  # a read-only or full folder: the report was shown anyway
            logger.warning("could not write %s: %s", run_dir / name, error.strerror or error)
    return written


def _run_folder(run_dir: Path) -> Path:
    """The run folder `run_dir` names: itself, or the folder of the metrics file named in its
    place (`yatt report runs/demo/metrics.jsonl`)."""
    path = Path(run_dir)
    return path.parent if path.name in _METRICS_FILES and path.is_file() else path


def _metrics_file(run_dir: Path) -> Path:
    """The metrics file of a run folder, or the metrics file itself; DataError, one line, for
    anything else."""
    path = Path(run_dir)
    if path.is_file():
        if path.name in _METRICS_FILES:
            return path
        raise DataError(
            f"{run_dir} is a file, not a run folder: yatt report takes the folder a run wrote "
            f"(it holds one of {', '.join(_METRICS_FILES)})"
        )
    if not path.exists():
        raise DataError(f"{run_dir}: no such folder")
    if not path.is_dir():
        raise DataError(f"{run_dir} is not a folder: yatt report takes a run folder")
    found = [path / name for name in _METRICS_FILES if (path / name).is_file()]
    if not found:
        raise DataError(
            f"{run_dir}: no {', '.join(_METRICS_FILES)} here (is it a yatt run folder?)"
        )
    return found[0]


def load_history(run_dir: Path) -> list[dict[str, Any]]:
    """The metric rows of `run_dir/metrics.jsonl` (an RL run, single-process or Ray), or else of
    `run_dir/sft_metrics.jsonl` (an SFT run: rows with `sft/loss`), `rm_metrics.jsonl` (a
    reward model's) or `dpo_metrics.jsonl` (a DPO run's); `run_dir` may also name one of
    those files.

    A torn last line (the run stopped mid-write: the start of a JSON object, no newline after
    it) is left out, with a warning. A value that is not a number is left out of its row, with
    one warning naming the first (file, line, key); the strings "nan", "inf" and "-inf" (what
    the metrics sink writes for them) become floats. Raises DataError, one line, for a folder
    that is missing, has neither file or a file without rows, or has a damaged line.
    """
    from yatt.common import read_metrics

    path = _metrics_file(run_dir)
    try:
        rows, torn = read_metrics(path)
        text = path.read_bytes()
    except ValueError as exc:
        raise DataError(str(exc)) from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    # the non-blank lines read_metrics read, numbered as the file's lines
    numbered = [
        (number, line) for number, line in enumerate(text.split(b"\n"), start=1) if line.strip()
    ]
    if torn and len(numbered) > len(rows):
        number, line = numbered[len(rows)]
        if not _looks_torn(line, last=len(rows) == len(numbered) - 1, text=text):
            shown = ascii(line.decode("utf-8", "replace").strip())[:60]
            raise DataError(
                f"{path}: line {number} is damaged (not a JSON metrics row with a step): {shown}"
            )
    if torn:
        logger.warning("%s: its last line is torn (the run stopped mid-write); left out", path)
    if not rows:
        raise DataError(f"{path} holds no metrics rows yet: nothing to report")
    history: list[dict[str, Any]] = []
    skipped: list[tuple[int | None, str, Any]] = []
    for index, (_, row) in enumerate(rows):
        number = numbered[index][0] if index < len(numbered) else None
        step = _metric_value(row["step"])
        if step is None or not math.isfinite(step):
            shown = ascii(row["step"])[:30]
            raise DataError(f"{path}: line {number}: step {shown} is not a step number")
        kept: dict[str, Any] = {}
        for key, value in row.items():
            number_value = _metric_value(value)
            if number_value is None:
                skipped.append((number, key, value))
            else:
                kept[key] = number_value
        history.append(kept)
    if skipped:
        number, key, value = skipped[0]
        others = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        logger.warning(
            "%s: line %s, key %s: %s is not a number; left out of the report%s",
            path, number, ascii(key)[:60], ascii(value)[:60], others,
        )  # fmt: skip
    return history


def _metric_value(value: Any) -> int | float | None:
    """A metric value as read: an int or a float as it is, a float for the strings the metrics
    sink writes for a NaN or an infinity ("nan", "inf", "-inf"), None for anything else (a
    bool, other strings, null, a list or an object, an int too large for a float)."""
    if isinstance(value, str) and value.strip().lower() in _NON_FINITE:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        float(value)
    except OverflowError:
        return None
    return value


_NON_FINITE = ("nan", "inf", "-inf", "infinity", "-infinity")


def _looks_torn(line: bytes, last: bool, text: bytes) -> bool:
    """Whether `line`, one that is no metrics row, is what a run stopped mid-write leaves: the
    file's last line, with no newline after it, the start of a JSON object that does not
    parse. Anything else (a newline-ended line, a whole JSON value, other bytes) is damage."""
    if not last or text.rstrip(b" \t\r").endswith(b"\n") or not line.lstrip().startswith(b"{"):
        return False
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


def evals_of(history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of the rows that carry an evaluation."""
    return [
        (int(row["step"]), row["eval/accuracy"])
        for row in history
        if isinstance(row.get("eval/accuracy"), int | float)
    ]
