"""The dgcc command line: bench, demo, recover, drill, report and the cluster commands.

Progress bars and tables are drawn with rich here, never in the library. Bad flags or options,
and every other error dgcc raises on purpose (a ``DgccError``: a damaged log, a node that cannot
be reached), print one ``dgcc: error: ...`` line and exit with status 2; anything else is a bug
and keeps its traceback. Ctrl-C, and SIGTERM for every command but ``node``, stop a command and
what it started with one ``dgcc: interrupted`` (exit 130) or ``dgcc: terminated`` (143) line.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import errno
import json
import logging
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console, Group
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dgcc import cli_cluster, cli_drill, debug, report
from dgcc.bench import (
    BenchConfig,
    make_console,
    make_workload,
    run_benchmark,
    run_side_by_side,
    summary_line,
)
from dgcc.cluster import load_config
from dgcc.errors import ConfigError, DgccError, brief, make_dir
from dgcc.net.servers import server_class
from dgcc.protocols import PROTOCOLS
from dgcc.protocols.dist_placement import Router
from dgcc.wal.checkpoint import (
    LAYOUT_RECORD,
    MANIFEST,
    check_layout_record,
    check_workload_record,
    read_workload_record,
)
from dgcc.wal.dirlock import DirLock
from dgcc.wal.format import decode_payload
from dgcc.wal.node_log import node_layout, recover_node
from dgcc.wal.recovery import read_log, recover
from dgcc.wal.writer import list_segments
from dgcc.workloads import Workload, get_workload

__all__ = ["main"]

logger = logging.getLogger(__name__)

# CLI flag -> (type, help) of the workload option it sets; only flags the user sets are passed
# on (the workload's own default applies otherwise).
WORKLOAD_FLAGS = {
    "warehouses": (
        int,
        "tpcc: warehouses (on a cluster, bench --nodes or cluster start: per node)",
    ),
    "items": (int, "tpcc: ITEM rows (the spec's 100,000)"),
    "customers_per_district": (int, "tpcc: customers per district (the spec's 3,000)"),
    "orders_per_district": (int, "tpcc: initial orders per district (the spec's 3,000)"),
    "records": (int, "ycsb: records"),
    "fields": (int, "ycsb: fields per record"),
    "ops_per_txn": (int, "ycsb: record accesses per transaction"),
    "read_ratio": (float, "ycsb: share of accesses that only read (0..1)"),
    "theta": (float, "ycsb: zipfian skew of the keys (0 = uniform, 0.99 = hot)"),
    "accounts": (int, "smallbank: customers"),
    "hot_accounts": (int, "smallbank: customers in the hotspot"),
    "hot_fraction": (float, "smallbank: share of accesses to the hotspot (0..1)"),
}


BATCH_SIZE_DEFAULT = 1000  # requests in flight in an in-process run
DEMO_ROUNDS = 3  # alternating measured windows, so machine noise hits both protocols alike


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: scripts and people both read it at a glance.
        self.exit(2, f"dgcc: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dgcc", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    bench = commands.add_parser("bench", help="run one closed-loop benchmark")
    bench.add_argument(
        "--workload",
        default="ycsb",
        help="tpcc, ycsb, smallbank, or your own as package.module:Class",
    )
    bench.add_argument(
        "--protocol",
        default="dgcc",
        choices=sorted(PROTOCOLS),
        help="concurrency control (serial: in-process runs only)",
    )
    _add_run_flags(bench, seconds_default=10.0)
    bench.add_argument("--json", type=_file_path, help="write the result record to this path")
    _add_workload_flags(bench)
    cli_cluster.add_bench_flags(bench)
    demo = commands.add_parser("demo", help="TPC-C with dgcc and serial, alternating windows")
    _add_run_flags(demo, seconds_default=10.0)
    recover = commands.add_parser(
        "recover",
        help="recover a durability directory and check it (as a restart would, a torn log "
        "tail is cut off the log there; damage elsewhere is refused, changing nothing)",
    )
    recover.add_argument("directory", type=Path, help="the node's log and checkpoint directory")
    recover.add_argument(
        "--workload",
        help="tpcc, ycsb, smallbank or package.module:Class, if the directory does not record it",
    )
    recover.add_argument(
        "--workers", type=int, default=None, help="replay workers (dependency log; default 1)"
    )
    recover.add_argument(
        "--cluster",
        type=Path,
        help="for a cluster node's directory: the cluster's config file (.toml/.json)",
    )
    recover.add_argument("--node", type=int, help="with --cluster: the node id of the directory")
    recover.add_argument("--json", type=_file_path, help="write the recovery record to this path")
    _add_workload_flags(recover)
    cli_cluster.register(commands)
    cli_drill.register(commands)
    report.register(commands)
    return parser


def _file_path(text: str) -> Path:
    """A ``--json`` path: ``Path("")`` would be the working directory, so '' is refused."""
    if not text:
        raise argparse.ArgumentTypeError("must name a file, got ''")
    return Path(text)


def _add_workload_flags(parser: argparse.ArgumentParser) -> None:
    for name, (kind, text) in WORKLOAD_FLAGS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=kind, default=None, help=text
        )
    parser.add_argument(
        "-o",
        "--workload-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other workload option (Python literal values)",
    )


def _workload_options(args: argparse.Namespace) -> dict[str, Any]:
    """The workload options the user set, by flag or by ``-o key=value``."""
    options = {name: getattr(args, name) for name in WORKLOAD_FLAGS}
    options = {name: value for name, value in options.items() if value is not None}
    return options | _parse_key_values(args.workload_option)


def _add_run_flags(parser: argparse.ArgumentParser, *, seconds_default: float) -> None:
    parser.add_argument(
        "--seconds",
        type=float,
        default=seconds_default,
        help=f"measured window ({seconds_default:g} s)",
    )
    parser.add_argument("--warmup-s", type=float, default=1.0, help="warm-up before it (1 s)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help=f"requests in flight ({BATCH_SIZE_DEFAULT})"
    )
    parser.add_argument("--seed", type=int, default=1, help="data and request seed (1)")
    parser.add_argument(
        "--executors", type=int, default=None, help="logical executors (--protocol dgcc)"
    )
    parser.add_argument("--check-invariants", action="store_true", help="debug checks (slow)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # a bare `dgcc`: what it can do
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=debug.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # A node keeps SIGTERM's default (stop at once, as a crash: `cluster stop` relies on it);
    # every other command stops on it as on Ctrl-C, so what it started is stopped too.
    with _sigterm_interrupts(args.command != "node"):
        try:
            return _run(args)
        except KeyboardInterrupt as stop:
            terminated = isinstance(stop, _Terminated)
            print(f"dgcc: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
            return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that cleanup runs as it does for Ctrl-C."""


@contextlib.contextmanager
def _sigterm_interrupts(wanted: bool) -> Iterator[None]:
    """Within the block, SIGTERM raises ``_Terminated`` (only in the main thread, where
    signal handlers run); the previous handler comes back after it."""
    if not wanted or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    console = make_console()
    try:
        if args.command in ("bench", "recover") and args.json is not None:
            _check_writable(args.json)
        if args.command in cli_cluster.COMMANDS:
            return cli_cluster.dispatch(args)
        if args.command == "recover":
            return _recover(args, console)
        if args.command == "report":
            return report.command(args, console)
        if args.command == "drill":
            return cli_drill.command(args, console)
        with debug.invariants(args.check_invariants or debug.check_invariants):
            if args.command == "bench":
                return _bench(args, console)
            return _demo(args, console)
    except DgccError as error:
        print(f"dgcc: error: {error}", file=sys.stderr)
        return 2


def _check_writable(path: Path) -> None:
    """Fail before a run, not after it, when ``--json`` cannot be written.

    Creates the missing parent folders (the run would too) and a nameless file in the last one.
    """
    named = repr(str(path)).replace("{", "{{").replace("}", "}}")  # (a format string below)
    make_dir(path.parent, f"--json {named} cannot be written: {{why}}")
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as error:
        raise ConfigError(
            f"--json {str(path)!r} cannot be written: {error.strerror or error}"
        ) from None


def _bench(args: argparse.Namespace, console: Console) -> int:
    _refuse_ignored_flags(args)
    if args.nodes is not None:
        return cli_cluster.bench_nodes(args)
    config = _config(args, args.workload, args.protocol, _workload_options(args))
    records = _run_all([config], console)
    record = records[0]
    console.print(results_table(records))
    print(summary_line(record))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        console.print(f"wrote {args.json}")
    return 1 if record["violations"] else 0


def _refuse_ignored_flags(args: argparse.Namespace) -> None:
    """A flag the chosen kind of run would ignore is an error, not a silent no-op."""
    cluster_only = {
        "--distributed-fraction": args.distributed_fraction,
        "--inflight": args.inflight,
        "--epoch-ms": args.epoch_ms,
        "--durable": args.durable or None,
    }
    in_process_only = {
        "--batch-size": args.batch_size,
        "--executors": args.executors,
        "--check-invariants": args.check_invariants or None,
    }
    if args.nodes is None:
        given = [flag for flag, value in cluster_only.items() if value is not None]
        where = "a cluster run (--nodes N)"
    else:
        given = [flag for flag, value in in_process_only.items() if value is not None]
        where = "an in-process run (without --nodes)"
        if "--batch-size" in given:
            where += "; a cluster run's load is --inflight"
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ConfigError(f"{', '.join(given)} {verb} only to {where}")
    if args.executors is not None and args.protocol != "dgcc":
        raise ConfigError(f"--executors applies only to --protocol dgcc, not {args.protocol}")


def _recover(args: argparse.Namespace, console: Console) -> int:
    """Recover ``args.directory``, check the workload's state invariants, print a table."""
    directory: Path = args.directory
    if args.cluster is not None and args.node is None:
        raise ConfigError(f"--node is needed with --cluster: which node of {args.cluster} wrote it")
    if args.cluster is None and args.node is not None:
        raise ConfigError(
            f"--node {args.node} applies only with --cluster (the config of the node's cluster)"
        )
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise ConfigError(f"recovery directory {str(directory)!r} {what}")
    if args.cluster is not None:
        flags = {"--workers": args.workers is not None, "--workload": args.workload is not None,
                 "workload options": bool(_workload_options(args))}  # fmt: skip
        if any(flags.values()):
            given = ", ".join(flag for flag, set_ in flags.items() if set_)
            raise ConfigError(
                f"{given}: not for a cluster node's directory, which replays in one process "
                f"with the workload of {args.cluster}"
            )
    args.workers = 1 if args.workers is None else args.workers
    if not 1 <= args.workers <= 1024:
        raise ConfigError(f"--workers must be in 1..1024, got {args.workers}")
    if not (directory / MANIFEST).exists() and not list_segments(directory):  # before the lock
        raise ConfigError(
            f"{directory}: no checkpoint manifest and no log (wal-*.log): not a dgcc data dir, "
            "nothing to recover"
        )
    with DirLock(directory, "dgcc recover"):  # never while a node writes it
        if args.cluster is not None:
            return _recover_node(args, console)
        return _recover_alone(args, console)


def _recover_alone(args: argparse.Namespace, console: Console) -> int:
    """``_recover`` of a single-node directory (the engine's, or a drill's)."""
    directory: Path = args.directory
    if (directory / LAYOUT_RECORD).exists():
        raise ConfigError(
            f"{directory} holds a cluster node's log ({LAYOUT_RECORD}): recover it with "
            "--cluster CONFIG --node ID"
        )
    name, workload = _recovery_workload(directory, args.workload, _workload_options(args))
    started_s = time.perf_counter()
    with console.status(f"recovering {directory}"):
        recovered = recover(directory, workload.schema, workload.registry(), workers=args.workers)
    recovery_s = time.perf_counter() - started_s
    blocks, _ = read_log(directory, recovered.checkpoint_epoch)
    payloads = [decode_payload(block) for block in blocks]
    record = {
        "directory": str(directory),
        "workload": workload.describe() or {"workload": name},
        "modes": sorted({block.kind.name.lower() for block in blocks}),
        "checkpoint_epoch": recovered.checkpoint_epoch,
        "epoch": recovered.epoch,
        "replayed_epochs": recovered.replayed_epochs,
        "replayed_txns": sum(len(payload.get("requests", ())) for payload in payloads),
        "replayed_images": sum(
            len(images) for payload in payloads for images in payload.get("images", {}).values()
        ),
        "dropped": recovered.dropped,
        "recovery_s": recovery_s,
        "timing": recovered.timing_s,
        "workers": args.workers,
        "violations": workload.check_state(recovered.db),
    }
    console.print(recovery_table(record))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        console.print(f"wrote {args.json}")
    return 1 if record["violations"] else 0


def _recovery_workload(
    directory: Path, name: str | None, given: dict[str, Any]
) -> tuple[str, Workload]:
    """The workload that wrote ``directory``: the one it records, which the flags (``name``
    and the ``given`` options) may only restate, else the one the flags name.

    Raises:
        ConfigError: no workload recorded or named, or flags that disagree with the record
            (as the workloads' ``describe`` reports their options).
    """
    recorded = read_workload_record(directory)
    if recorded is None:
        if name is None:
            raise ConfigError(
                f"{directory} does not record its workload: recover needs --workload (or "
                "--cluster and --node for a cluster node's directory)"
            )
        return name, make_workload(name, given)
    written_name, options = recorded
    if name not in (None, written_name):
        raise ConfigError(f"{directory} was written by workload {written_name!r}, not {name!r}")
    written = make_workload(written_name, options)
    have, want = written.describe(), make_workload(written_name, options | given).describe()
    differ = [
        f"{key}={have.get(key)!r}, not {value!r}"
        for key, value in want.items()
        if have.get(key) != value
    ]
    if differ:
        raise ConfigError(
            f"{directory} was written by {written_name} with {'; '.join(differ)} (it records "
            f"options {options}): drop or correct the workload flags"
        )
    return written_name, written


def _recover_node(args: argparse.Namespace, console: Console) -> int:
    """Recover one cluster node's directory alone (its log holds the values it received)."""
    config = load_config(args.cluster)
    if not 0 <= args.node < len(config.nodes):
        raise ConfigError(f"--node {args.node} is not a node of {args.cluster}")
    check_workload_record(args.directory, config.workload, config.workload_options, claim=False)
    check_layout_record(args.directory, node_layout(config, args.node), claim=False)
    workload = get_workload(config.workload, **dict(config.workload_options))
    router = Router(workload, config.placement())
    started_s = time.perf_counter()
    with console.status(f"recovering node {args.node} from {args.directory}"):
        run_class = server_class(config.protocol).epoch_run  # Calvin's blocks replay as Calvin
        recovered = recover_node(
            args.directory,
            args.node,
            workload.schema,
            workload.registry(),
            router,
            run_class=run_class,
        )
    record = {
        "directory": str(args.directory),
        "workload": config.workload,
        "node": args.node,
        "checkpoint_epoch": recovered.checkpoint_epoch,
        "epoch": recovered.epoch,
        "replayed_epochs": recovered.epoch - recovered.checkpoint_epoch,
        "dropped": recovered.dropped,
        "load_checkpoint_s": recovered.timing_s["timing_s/load_checkpoint"],
        "replay_s": recovered.timing_s["timing_s/replay"],
        "recovery_s": time.perf_counter() - started_s,
    }
    table = Table(title=f"dgcc recover node {args.node} of {args.cluster}: {args.directory}")
    table.add_column("what")
    table.add_column("value", overflow="fold")
    rows = (
        ("workload", config.workload),
        ("checkpoint epoch", str(record["checkpoint_epoch"])),
        ("recovered epoch", str(record["epoch"])),
        ("epochs replayed", str(record["replayed_epochs"])),
        ("torn tail", "; ".join(record["dropped"]) or "none"),
        ("load checkpoint", f"{record['load_checkpoint_s']:.3f} s"),
        ("replay", f"{record['replay_s']:.3f} s"),
        ("recovery time", f"{record['recovery_s']:.3f} s"),
        ("consistency", "not checked: a node holds only its partitions' share"),
    )
    for what, value in rows:
        table.add_row(what, value)
    console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def recovery_table(record: dict[str, Any]) -> Table:
    """A two-column rich table of a ``dgcc recover`` record."""
    table = Table(title=f"dgcc recover {record['directory']}")
    table.add_column("what")
    table.add_column("value", overflow="fold")
    modes = ", ".join(record["modes"]) or "- (no log blocks after the checkpoint)"
    txns = str(record["replayed_txns"])
    if record["replayed_images"]:
        txns += f" (+ {record['replayed_images']} value after-images)"
    violations = record["violations"]
    rows = (
        ("log mode", modes),
        ("checkpoint epoch", str(record["checkpoint_epoch"])),
        ("recovered epoch", str(record["epoch"])),
        ("epochs replayed", str(record["replayed_epochs"])),
        ("transactions replayed", txns),
        ("torn tail", "; ".join(record["dropped"]) or "none"),
        ("recovery time", f"{record['recovery_s']:.3f} s"),
        ("workers", str(record["workers"])),
        ("consistency", "; ".join(violations[:5]) if violations else "ok"),
    )
    for what, value in rows:
        table.add_row(what, f"[red]{value}[/]" if what == "consistency" and violations else value)
    return table


def _demo(args: argparse.Namespace, console: Console) -> int:
    configs = [
        _config(args, "tpcc", protocol, {"warehouses": 1}) for protocol in ("dgcc", "serial")
    ]
    with console.status("loading") as status:
        records = run_side_by_side(configs, rounds=DEMO_ROUNDS, progress=status.update)
    console.print(results_table(records))
    for record in records:
        print(summary_line(record))
    return 1 if any(record["violations"] for record in records) else 0


def _config(args: argparse.Namespace, workload: str, protocol: str, options: dict) -> BenchConfig:
    protocol_options = {}
    if args.executors is not None and protocol == "dgcc":
        protocol_options["executors"] = args.executors
    return BenchConfig(
        workload=workload,
        protocol=protocol,
        seconds=args.seconds,
        warmup_s=args.warmup_s,
        batch_size=BATCH_SIZE_DEFAULT if args.batch_size is None else args.batch_size,
        seed=args.seed,
        workload_options=options,
        protocol_options=protocol_options,
    )


def _parse_key_values(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"workload option {pair!r} must look like key=value")
        try:
            options[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key] = text  # a bare word: the text itself
        except (TypeError, MemoryError, RecursionError) as error:  # {[1]: 2}, nested too deep
            why = f"{type(error).__name__}: {error}".rstrip(": ")
            raise ConfigError(
                f"workload option {key}: {brief(text)} is not a value ({why})"
            ) from None
    return options


def _run_all(configs: list[BenchConfig], console: Console) -> list[dict[str, Any]]:
    """Run each config (load, warm up, measure) with a progress bar; the result records. A
    workload or option that does not build, or data that would not fit in memory, fails
    before the bar draws (its one-line error alone on the console)."""
    for config in configs:
        make_workload(config.workload, config.workload_options).check_fits_memory()
    records = []
    columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        for config in configs:
            label = f"{config.protocol} on {config.workload}"
            task = progress.add_task(f"{label}: loading", total=config.warmup_s + config.seconds)
            warmup_s = config.warmup_s

            def report(
                phase: str, done_s: float, total_s: float, task=task, label=label, skip=warmup_s
            ) -> None:
                completed = done_s + (skip if phase == "measure" else 0.0)
                progress.update(task, completed=completed, description=f"{label}: {phase}")

            records.append(run_benchmark(config, progress=report))
            progress.remove_task(task)
    return records


def results_table(records: list[dict[str, Any]]) -> Group:
    """Rich tables of result records: throughput, latency, phase split; aborts by cause."""
    table = Table(title="dgcc benchmark")
    for column in ("workload", "protocol", "commits/s", "p50 ms", "p99 ms", "abort"):
        table.add_column(column, justify="left" if column in ("workload", "protocol") else "right")
    for column in ("graph s", "exec s", "viol"):
        table.add_column(column, justify="right")
    causes = Table(title="aborts and errors by cause")
    for column in ("workload", "protocol", "cause", "count"):
        causes.add_column(column, justify="right" if column == "count" else "left")
    for record in records:
        metrics = record["metrics"]
        workload, protocol = record["config"]["workload"], record["config"]["protocol"]
        graph_s, execute_s = (
            f"{metrics[key]:.2f}" if key in metrics else "-"
            for key in ("timing_s/build_graph", "timing_s/execute")
        )
        table.add_row(
            workload,
            protocol,
            f"{metrics['txn/commits_per_s']:,.0f}",
            f"{metrics['txn/latency_ms_p50']:.1f}",
            f"{metrics['txn/latency_ms_p99']:.1f}",
            f"{metrics['txn/abort_rate']:.1%}",
            graph_s,
            execute_s,
            str(len(record["violations"])),
        )
        for key, value in metrics.items():
            for prefix, kind in (("txn/aborts/", "abort"), ("txn/error_kinds/", "error")):
                if key.startswith(prefix):
                    cause = f"{kind}: {key.removeprefix(prefix)}"
                    causes.add_row(workload, protocol, cause, f"{int(value):,}")
    return Group(table, causes) if causes.row_count else Group(table)
