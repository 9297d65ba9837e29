"""``dgcc report``: run every dgcc benchmark script in sequence, then rebuild docs/benchmarks.md.

Each script (``dgcc/bench/<name>.py``) measures its competitors side by side and writes its own
section, JSON and plot under ``docs/bench/``; ``tools/stitch_benchmarks.py`` joins the sections.
The scripts run as child processes under ``python -O`` (invariant checks off, as in ``make
bench``), their output goes to a log file per script, and a table sums up what each measured.
With ``quick`` the scripts run their smoke mode and write to temp folders, so docs are left
alone unless ``stitch`` is asked for.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from dgcc.errors import ConfigError, make_dir

__all__ = [
    "SCRIPTS",
    "ReportConfig",
    "ScriptResult",
    "command",
    "register",
    "repo_root",
    "run_report",
]

logger = logging.getLogger(__name__)

# Run order; a script that is not in the checkout (yet) is reported as skipped.
SCRIPTS = (
    "engine", "cluster", "protocols", "protocols_nodes", "protocols_cpu", "wal_logging",
    "postgres", "tpcc_soak",
)  # fmt: skip
# Extra arguments of a full (not quick) run: the protocols sweep also logs its headline runs,
# and the soak checks every batch against the serial executor.
FULL_ARGS = {"protocols": ("--log",), "tpcc_soak": ("--shadow", "serial")}
TIMEOUT_S_DEFAULT = 3 * 3600.0
TAIL_LINES = 8
CLEANUP_S = 60.0  # a stopped script's time to stop what it started
STITCH_TIMEOUT_S = 120.0
SUMMARY_LINES = 4  # per script in the final table, where it states no results of its own
RESULT_LINES = 12  # the most lines of a script's own results in the final table
SUMMARY_CHARS = 160
_TABLE_BOTTOMS = ("└", "╰", "┗", "╘")  # a rich table's last line starts with one


@dataclass(frozen=True)
class ReportConfig:
    """What ``run_report`` runs.

    Args:
        repo: the source checkout holding ``dgcc/bench`` and ``tools/stitch_benchmarks.py``.
        quick: pass ``--quick`` to every script (smoke mode, temp output).
        only: the script names to run, in ``SCRIPTS`` order (default all).
        stitch: rebuild docs/benchmarks.md at the end (default: unless ``quick``).
        timeout_s: bound on each script's run time.
        log_dir: where each script's output goes (default a new temp folder).

    Raises:
        ConfigError: an unknown script name, a checkout without ``dgcc/bench``, a bad timeout.
    """

    repo: Path
    quick: bool = False
    only: tuple[str, ...] = ()
    stitch: bool | None = None
    timeout_s: float = TIMEOUT_S_DEFAULT
    log_dir: Path | None = None

    def __post_init__(self) -> None:
        unknown = [name for name in self.only if name not in SCRIPTS]
        if unknown:
            raise ConfigError(f"unknown benchmark(s) {unknown}; choose from {', '.join(SCRIPTS)}")
        if not (Path(self.repo) / "dgcc" / "bench").is_dir():
            raise ConfigError(f"{str(self.repo)!r} is not a dgcc source checkout (no dgcc/bench)")
        if not isinstance(self.timeout_s, int | float) or not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        # Absolute: the scripts run with the checkout as their working directory.
        object.__setattr__(self, "repo", Path(self.repo).resolve())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name in SCRIPTS if not self.only or name in self.only)

    @property
    def stitching(self) -> bool:
        return (not self.quick) if self.stitch is None else self.stitch


@dataclass(frozen=True)
class ScriptResult:
    """One script's run: ``status`` is ok, failed, timeout or skipped."""

    name: str
    status: str
    seconds: float
    summary: tuple[str, ...]  # the script's ``[summary] key=value`` lines
    log: Path | None
    detail: str = ""
    closing: tuple[str, ...] = ()  # what it printed after its last table (results, wrote ...)


def repo_root() -> Path:
    """The checkout this package is installed from (editable installs), else the cwd."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "dgcc" / "bench").is_dir() and (parent / "tools").is_dir():
            return parent
    return Path.cwd()


def _run_script(config: ReportConfig, name: str, log_dir: Path) -> ScriptResult:
    script = config.repo / "dgcc" / "bench" / f"{name}.py"
    if not script.is_file():
        return ScriptResult(name, "skipped", 0.0, (), None, f"{script} not in this checkout")
    extra = ["--quick"] if config.quick else list(FULL_ARGS.get(name, ()))
    command = [sys.executable, "-O", str(script), *extra]
    log = log_dir / f"{name}.log"
    started_s = time.perf_counter()
    with log.open("w") as output:
        process = subprocess.Popen(  # its own session: a terminal's Ctrl-C reaches it only
            command,  # as the one SIGINT _interrupt sends (a second one broke its cleanup)
            cwd=config.repo,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=config.timeout_s)
            status = "ok" if code == 0 else "failed"
            detail = "" if status == "ok" else f"exit status {code}"
        except subprocess.TimeoutExpired:
            _interrupt(process)
            status, detail = "timeout", f"no result after {config.timeout_s:g} s"
        except BaseException:  # Ctrl-C or SIGTERM here: the script stops its processes first
            _interrupt(process)
            raise
    seconds = time.perf_counter() - started_s
    lines = log.read_text(errors="replace").splitlines()
    summary = tuple(line for line in lines if line.startswith("[summary]"))
    if status == "failed":  # its last lines say why
        detail += ": " + " | ".join(lines[-TAIL_LINES:])
    elif status == "timeout":  # (its last lines are the interrupt's traceback: the log has all)
        detail += f" (its output: {log})"
    if status != "ok":
        logger.error("%s %s (%s)", name, status, detail)
    return ScriptResult(name, status, seconds, summary, log, detail, _closing(lines))


def _interrupt(process: subprocess.Popen) -> None:
    """Stop a bench script as Ctrl-C does, so that its cleanup stops the node processes and
    servers it started (they run in sessions of their own: a SIGKILL of the script left them
    running, holding their ports and the CPU the next script measures on); SIGKILL it if
    that takes longer than ``CLEANUP_S``."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=CLEANUP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    except BaseException:  # a second Ctrl-C while it cleans up: it runs in its own session,
        process.kill()  # so nothing else would stop it
        process.wait()
        raise


def _closing(lines: list[str]) -> tuple[str, ...]:
    """The non-empty lines after the last table's bottom border (none without a table)."""
    bottoms = [i for i, line in enumerate(lines) if line.lstrip().startswith(_TABLE_BOTTOMS)]
    if not bottoms:
        return ()
    return tuple(line.strip() for line in lines[bottoms[-1] + 1 :] if line.strip())


def _stitch(repo: Path) -> ScriptResult:
    started_s = time.perf_counter()
    try:
        completed = subprocess.run(
            [sys.executable, str(repo / "tools" / "stitch_benchmarks.py")],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=STITCH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        detail = f"no result after {STITCH_TIMEOUT_S:g} s"
        return ScriptResult("stitch", "timeout", time.perf_counter() - started_s, (), None, detail)
    status = "ok" if completed.returncode == 0 else "failed"
    detail = (completed.stdout + completed.stderr).strip()
    return ScriptResult("stitch", status, time.perf_counter() - started_s, (), None, detail)


def _log_dir(config: ReportConfig) -> Path:
    """``config.log_dir``, created if missing, or a new temp folder.

    Raises:
        ConfigError: ``log_dir`` is a file, or cannot be created.
    """
    if config.log_dir is None:
        return Path(tempfile.mkdtemp(prefix="dgcc_report_"))
    return make_dir(config.log_dir, "cannot use {path!r} as the log dir: {why}")


def run_report(
    config: ReportConfig, progress: Callable[[str, int, int], None] | None = None
) -> list[ScriptResult]:
    """Run the configured scripts in order, then stitch; one result per step.

    ``progress(name, done, total)`` is called before each step. A failing script does not stop
    the others: every result says what happened, and its log path holds the full output.
    """
    log_dir = _log_dir(config)
    steps: Sequence[str] = (*config.names, *(("stitch",) if config.stitching else ()))
    results = []
    for done, name in enumerate(steps):
        if progress is not None:
            progress(name, done, len(steps))
        if name == "stitch":
            results.append(_stitch(config.repo))
        else:
            results.append(_run_script(config, name, log_dir))
    if progress is not None:
        progress("done", len(steps), len(steps))
    return results


def _summary_cell(result: ScriptResult) -> str:
    """What a script found: the results it stated after its last table (up to
    ``RESULT_LINES``), else its first ``SUMMARY_LINES`` summary lines; then where it wrote.
    Each line is cut to ``SUMMARY_CHARS``; the log holds all."""
    if result.status != "ok":
        return result.detail or (str(result.log) if result.log else "")
    closing = [line for line in result.closing if not line.startswith("[summary]")]
    wrote = [line for line in closing if line.startswith(("wrote ", "rewrote "))]
    stated = [line for line in closing if line not in wrote]
    lines, most, what = stated, RESULT_LINES, "result"
    if not stated:
        lines = [line.removeprefix("[summary] ") for line in result.summary]
        most, what = SUMMARY_LINES, "summary"
    shown = [line if len(line) <= SUMMARY_CHARS else line[:SUMMARY_CHARS] + "..." for line in lines]
    text = "\n".join(shown[:most])
    if len(lines) > most:
        text += f"\n(+{len(lines) - most} more {what} lines in {result.log})"
    text = "\n".join([text, *wrote]).strip()
    return text or result.detail or (str(result.log) if result.log else "")


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``report`` to a ``dgcc`` sub-command set."""
    summary = "run every dgcc benchmark, rebuild the report"
    parser = commands.add_parser(
        "report",
        help=summary,
        description=f"{summary}: each script in dgcc/bench in turn, each writing its tables, "
        "JSON and plots into the checkout's docs/bench, then docs/benchmarks.md stitched from "
        "them. A full run takes over an hour on 2 cores; --quick runs each script's smoke "
        "mode into a temp folder instead.",
    )
    parser.add_argument("--quick", action="store_true", help="each script's smoke mode")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help=", ".join(SCRIPTS))
    stitch = parser.add_mutually_exclusive_group()
    stitch.add_argument(
        "--stitch",
        dest="stitch",
        action="store_true",
        default=None,
        help="rebuild docs/benchmarks.md at the end (the default, except with --quick)",
    )
    stitch.add_argument(
        "--no-stitch", dest="stitch", action="store_false", help="leave docs/benchmarks.md"
    )
    parser.add_argument("--repo", type=Path, default=None, help="source checkout (default: ours)")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S_DEFAULT, help="per script")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="each script's output (default: a temp folder)"
    )
    parser.set_defaults(check_invariants=False)


def command(args: argparse.Namespace, console: Console) -> int:
    """``dgcc report``: run the scripts with a progress bar, then print a table of results."""
    config = ReportConfig(
        repo=args.repo or repo_root(),
        quick=args.quick,
        only=tuple(args.only),
        stitch=args.stitch,
        timeout_s=args.timeout_s,
        log_dir=args.log_dir,
    )
    config = dataclasses.replace(config, log_dir=_log_dir(config))  # fails before the bar
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("starting", total=None)

        def report(name: str, done: int, total: int) -> None:
            progress.update(
                task, description=f"{name} ({done}/{total})", completed=done, total=total
            )

        results = run_report(config, report)
    table = Table(title="dgcc report" + (" (quick)" if config.quick else ""))
    for column in ("step", "status", "seconds", "summary / detail"):
        table.add_column(column, overflow="fold")
    for result in results:
        style = {"ok": "green", "skipped": "yellow"}.get(result.status, "red")
        text = _summary_cell(result)
        table.add_row(result.name, f"[{style}]{result.status}[/]", f"{result.seconds:.0f}", text)
    console.print(table)
    if results and results[0].log is not None:
        console.print(f"script output: {results[0].log.parent}")
    return 0 if all(r.status in ("ok", "skipped") for r in results) else 1
