"""Closed-loop benchmark driver: one protocol, one workload, warm-up then a measured window.

A fixed number of requests is in flight (the batch size): each batch is admitted, run as one
epoch, and its requests complete together, so a transaction's latency is the time from its
batch's admission to the batch's completion (plus earlier tries if it was retried). Logic
aborts are outcomes and are not retried; an ABORTED outcome whose reason starts with ``retry``
(a protocol asking to run again) is re-admitted at the head of the next batch (so it is older
than every fresh request there), at most ``RESUBMISSIONS_MAX`` times; one still asking after that is
a give-up, counted apart (``txn/gave_up``, ``txn/gave_up_rate``), so ``txn/aborted`` and
``txn/abort_rate`` count logic aborts only. Metrics use slash keys (``txn/commits_per_s``,
``timing_s/build_graph``); see ``summary_line``.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import itertools
import logging
import os
import platform
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from dgcc.api import Protocol, Status, TxnRequest
from dgcc.errors import ConfigError
from dgcc.protocols import get_protocol
from dgcc.stats import percentile
from dgcc.workloads import Workload, get_workload

__all__ = [
    "BenchConfig",
    "Runner",
    "host_facts",
    "run_benchmark",
    "run_side_by_side",
    "summary_line",
]

logger = logging.getLogger(__name__)

RESUBMISSIONS_MAX = 10  # resubmissions of a call whose protocol gave up on it (after the first)
BATCHES_MAX = 10_000_000  # bound on the batch loop; a window this long means a stuck clock

ProgressFn = Callable[[str, float, float], None]  # (phase, done_s, total_s)


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run.

    Args:
        workload: a name in ``WORKLOADS``, or ``package.module:Class`` (``get_workload``).
        protocol: a name in ``PROTOCOLS``.
        seconds: length of the measured window.
        warmup_s: length of the warm-up before it (not measured).
        batch_size: requests in flight, i.e. per epoch.
        seed: seeds the data load and the request stream (the same for every protocol).
        workload_options: keyword options of the workload (``theta``, ``warehouses`` ...).
        protocol_options: keyword options of the protocol (``executors`` ...).

    Raises:
        ConfigError: a value out of range, an unknown protocol, or an option the protocol does
            not take (the workload and its options are checked when the run builds it).
    """

    workload: str
    protocol: str
    seconds: float = 10.0
    warmup_s: float = 1.0
    batch_size: int = 1000
    seed: int = 1
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    protocol_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.seconds, int | float) or not 0 < self.seconds <= 86_400:
            raise ConfigError(f"seconds must be in (0, 86400], got {self.seconds!r}")
        if not isinstance(self.warmup_s, int | float) or not 0 <= self.warmup_s <= 3_600:
            raise ConfigError(f"warmup_s must be in [0, 3600], got {self.warmup_s!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            raise ConfigError(f"batch_size must be an int, got {self.batch_size!r}")
        if not 1 <= self.batch_size <= 1_000_000:
            raise ConfigError(f"batch_size must be in [1, 1000000], got {self.batch_size}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an int, got {self.seed!r}")
        _check_options(get_protocol(self.protocol), self.protocol_options, "protocol")

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "protocol": self.protocol,
            "seconds": self.seconds,
            "warmup_s": self.warmup_s,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "workload_options": dict(self.workload_options),
            "protocol_options": dict(self.protocol_options),
        }


def _keyword_options(target: type) -> set[str] | None:
    """The keyword-only options ``target(...)`` takes: an ``__init__`` that takes ``**options``
    passes them on to its base class's, so those count too; None if no class in the chain
    names them (any option may then be meant)."""
    accepted: set[str] = set()
    for cls in target.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        accepted |= {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return accepted
    return None


def _check_options(target: type, options: Mapping[str, Any], what: str) -> None:
    """Reject keyword options ``target`` does not accept (see ``_keyword_options``)."""
    accepted = _keyword_options(target)
    if accepted is None:
        return
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(
            f"{what} {getattr(target, 'name', target.__name__)!r} does not take option(s) "
            f"{unknown}; it takes: {', '.join(sorted(accepted)) or 'none'}"
        )


def make_workload(name: str, options: Mapping[str, Any]) -> Workload:
    """The workload ``name`` built with ``options``.

    Raises:
        ConfigError: an unknown workload, or an option it does not take or rejects.
    """
    try:
        return get_workload(name, **options)
    except TypeError as error:  # an unexpected keyword for this workload's __init__
        raise ConfigError(f"workload {name!r} rejects options {dict(options)}: {error}") from None


@dataclass
class _Window:
    """Counters of one measured window."""

    committed: int = 0
    aborted: Counter[str] = field(default_factory=Counter)  # logic aborts, by reason
    gave_up: int = 0  # still a concurrency-control give-up after RESUBMISSIONS_MAX resubmissions
    errors: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    batches: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # this thread's CPU time: steadier than wall time on a shared machine
    run_batch_s: float = 0.0
    protocol_stats: Counter[str] = field(default_factory=Counter)


class Runner:
    """A protocol on its own database, fed by the workload's request stream; resumable.

    Several runners can take turns on windows (``run_window``), so a side-by-side comparison
    interleaves them and machine noise hits both alike.
    """

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.workload = make_workload(config.workload, config.workload_options)
        started_s = time.perf_counter()
        self.db = self.workload.build(config.seed)
        self.load_s = time.perf_counter() - started_s
        # The loaded tables are long-lived: keep the cyclic GC from rescanning them in every
        # full collection (pauses of 0.1-0.3 s at TPC-C scale that land on whichever protocol
        # allocates at that moment). Applies equally to every protocol.
        gc.collect()
        gc.freeze()
        protocol_cls = get_protocol(config.protocol)
        self.protocol: Protocol = protocol_cls(
            self.db, self.workload.registry(), **config.protocol_options
        )
        self._stream = self.workload.requests(config.seed + 1)
        self._retries: list[tuple[TxnRequest, float, int]] = []  # request, admitted_s, tries
        self.window = _Window()

    def run_window(
        self, seconds: float, *, measure: bool, progress: ProgressFn | None = None
    ) -> None:
        """Run batches for ``seconds``; add their counts to ``self.window`` if ``measure``."""
        phase = "measure" if measure else "warmup"
        window = self.window if measure else _Window()
        stats = getattr(self.protocol, "stats", None)
        stats_before = dict(stats) if stats else {}
        started_s = time.perf_counter()
        started_cpu_s = time.thread_time()
        for _ in range(BATCHES_MAX):
            now_s = time.perf_counter()
            if now_s - started_s >= seconds:
                break
            self._run_one_batch(window)
            if progress is not None:
                progress(phase, min(time.perf_counter() - started_s, seconds), seconds)
        else:
            raise RuntimeError(f"{BATCHES_MAX} batches in a {seconds} s window: clock stuck?")
        window.elapsed_s += time.perf_counter() - started_s
        window.cpu_s += time.thread_time() - started_cpu_s
        if stats:
            for key, value in stats.items():
                window.protocol_stats[key] += value - stats_before.get(key, 0)

    def _run_one_batch(self, window: _Window) -> None:
        admitted_s = time.perf_counter()
        in_flight = self._retries[: self.config.batch_size]
        self._retries = self._retries[self.config.batch_size :]
        fresh = self.config.batch_size - len(in_flight)
        in_flight += [(request, admitted_s, 0) for request in itertools.islice(self._stream, fresh)]
        batch = [request for request, _, _ in in_flight]
        outcomes = self.protocol.run_batch(batch)
        done_s = time.perf_counter()
        assert len(outcomes) == len(batch), f"{len(outcomes)} outcomes for {len(batch)} requests"
        self.workload.observe(batch, outcomes)
        window.batches += 1
        window.run_batch_s += done_s - admitted_s
        latencies_ms = window.latencies_ms
        for (request, first_s, tries), outcome in zip(in_flight, outcomes):
            if outcome.gave_up and tries < RESUBMISSIONS_MAX:
                self._retries.append((request, first_s, tries + 1))
                window.retried += 1
                continue
            latencies_ms.append((done_s - first_s) * 1e3)
            if outcome.status is Status.COMMITTED:
                window.committed += 1
            elif outcome.gave_up:
                window.gave_up += 1
            elif outcome.status is Status.ABORTED:
                window.aborted[outcome.reason] += 1
            else:
                window.errors[outcome.reason.split(":")[0]] += 1

    def metrics(self) -> dict[str, float]:
        """The measured window's metrics under slash keys. ``txn/aborted`` and ``txn/abort_rate``
        count logic aborts only; calls the protocol gave up on count under ``txn/gave_up`` and
        ``txn/gave_up_rate`` (all rates are over every completed call)."""
        window = self.window
        elapsed_s = max(window.elapsed_s, 1e-9)
        aborted = sum(window.aborted.values())
        completed = window.committed + aborted + window.gave_up + sum(window.errors.values())
        latencies = sorted(window.latencies_ms)
        metrics: dict[str, float] = {
            "txn/commits_per_s": window.committed / elapsed_s,
            "txn/commits_per_cpu_s": window.committed / max(window.cpu_s, 1e-9),
            "txn/completed_per_s": completed / elapsed_s,
            "txn/committed": window.committed,
            "txn/aborted": aborted,
            "txn/errors": sum(window.errors.values()),
            "txn/retried": window.retried,
            "txn/abort_rate": aborted / completed if completed else 0.0,
            "txn/gave_up": window.gave_up,
            "txn/gave_up_rate": window.gave_up / completed if completed else 0.0,
            "txn/latency_ms_p50": percentile(latencies, 0.50),
            "txn/latency_ms_p99": percentile(latencies, 0.99),
            "txn/batches": window.batches,
            "timing_s/window": window.elapsed_s,
            "timing_s/window_cpu": window.cpu_s,
            "timing_s/run_batch": window.run_batch_s,
            "timing_s/load": self.load_s,
        }
        for reason, count in sorted(window.aborted.items()):
            metrics[f"txn/aborts/{reason}"] = count
        for reason, count in sorted(window.errors.items()):
            metrics[f"txn/error_kinds/{reason}"] = count
        for key, value in sorted(window.protocol_stats.items()):
            metrics[key] = value
        return metrics


def run_benchmark(
    config: BenchConfig, *, progress: ProgressFn | None = None, check: bool = True
) -> dict[str, Any]:
    """Warm up, measure, optionally check the workload's invariants; the JSON-ready result."""
    runner = Runner(config)
    if config.warmup_s:
        runner.run_window(config.warmup_s, measure=False, progress=progress)
    runner.run_window(config.seconds, measure=True, progress=progress)
    return result_record(runner, check=check)


def run_side_by_side(
    configs: Sequence[BenchConfig],
    *,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Load and warm up every config, then alternate ``rounds`` measured windows between them.

    Each config's ``seconds`` is split over the rounds, taken in reverse order every other
    round, so drift in machine load (a shared machine) hits every protocol alike and none
    always runs first; ``progress`` gets a line per step.

    Raises:
        ConfigError: rounds < 1, or a bad config.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds must be an int >= 1, got {rounds!r}")
    runners = []
    for config in configs:
        if progress is not None:
            progress(f"{config.protocol} on {config.workload}: loading and warming up")
        runner = Runner(config)
        if config.warmup_s:
            runner.run_window(config.warmup_s, measure=False)
        runners.append(runner)
    for round_index in range(rounds):
        for runner in runners if round_index % 2 == 0 else runners[::-1]:
            if progress is not None:
                label = f"{runner.config.protocol} on {runner.config.workload}"
                progress(f"{label}: round {round_index + 1}/{rounds}")
            runner.run_window(runner.config.seconds / rounds, measure=True)
    return [result_record(runner) for runner in runners]


def result_record(runner: Runner, *, check: bool = True) -> dict[str, Any]:
    """Config, metrics, invariant violations, git commit and host facts of a finished run."""
    violations = runner.workload.check(runner.db) if check else []
    for violation in violations:
        logger.error("invariant violated: %s", violation)
    return {
        "config": runner.config.to_dict(),
        "workload": runner.workload.describe(),
        "metrics": runner.metrics(),
        "violations": violations,
        "seed": runner.config.seed,
        "git_commit": git_commit(),
        "host": host_facts(),
    }


def summary_line(record: Mapping[str, Any]) -> str:
    """One parsable ``[summary] key=value ...`` line for a result record."""
    metrics, config = record["metrics"], record["config"]
    fields = {
        "workload": config["workload"],
        "protocol": config["protocol"],
        "batch_size": config["batch_size"],
        "seed": config["seed"],
        "commits_per_s": f"{metrics['txn/commits_per_s']:.1f}",
        "latency_ms_p50": f"{metrics['txn/latency_ms_p50']:.2f}",
        "latency_ms_p99": f"{metrics['txn/latency_ms_p99']:.2f}",
        "abort_rate": f"{metrics['txn/abort_rate']:.4f}",
        "errors": int(metrics["txn/errors"]),
        "violations": len(record["violations"]),
    }
    for phase in ("plan", "build_graph", "execute"):
        if f"timing_s/{phase}" in metrics:
            fields[f"{phase}_s"] = f"{metrics[f'timing_s/{phase}']:.3f}"
    return "[summary] " + " ".join(f"{key}={value}" for key, value in fields.items())


def git_commit() -> str:
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=os.path.dirname(__file__),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return completed.stdout.strip() if completed.returncode == 0 else "unknown"


def host_facts() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "cpus": os.cpu_count(),
        "hostname": platform.node(),
    }


def make_console() -> Console:
    """A rich console; 160 columns when output is not a terminal (logs, CI, pipes), where rich
    would squeeze tables to 80 and wrap numbers mid-value."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def at_least(kind: type, least: float, *, above: bool = False) -> Callable[[str], Any]:
    """An argparse type: a ``kind`` (int or float) of at least ``least`` (``above``: more than
    it), so a bench flag out of range is a one-line usage error, not a traceback mid-run."""
    bound = f"> {least:g}" if above else f">= {least:g}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}") from None
        if value != value or (value <= least if above else value < least):  # (NaN too)
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse
