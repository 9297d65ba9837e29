"""The cluster commands: ``dgcc node``, ``dgcc cluster start|stop|status|check``, ``dgcc call``,
``dgcc bench --nodes``.

``register(commands)`` adds the ``node`` and ``cluster`` sub-commands to the ``dgcc`` parser,
``add_bench_flags(parser)`` adds ``--nodes``/``--distributed-fraction``/``--inflight``/
``--epoch-ms``/``--durable`` to ``dgcc bench``, and ``dispatch(args)`` runs them; the ``dgcc``
entry point (``dgcc.cli``) owns the parser, and the launcher spawns nodes through it
(``python -m dgcc node ...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from dgcc.cluster import (
    CONFIG_FILE,
    ClusterConfig,
    DuplicateKey,
    load_config,
    local_config,
    unique_keys,
)
from dgcc.errors import ConfigError, brief, make_dir
from dgcc.local_cluster import (
    STATE_FILE,
    StopResult,
    check_node_restart,
    log_size,
    logged_warnings,
    read_pids,
    refuse_running,
    start_local,
    start_node,
    terminate_recorded,
)
from dgcc.local_cluster import status as cluster_status
from dgcc.local_cluster import stop as cluster_stop
from dgcc.net.loadgen import (
    EPOCH_MS_DEFAULT,
    TPCC_WAREHOUSES_PER_NODE,
    check_tpcc_placement,
    cluster_workload_options,
)

__all__ = ["COMMANDS", "add_bench_flags", "bench_nodes", "dispatch", "register"]

logger = logging.getLogger(__name__)

COMMANDS = ("node", "cluster", "call")  # what ``register`` adds; ``bench --nodes``: bench_nodes
DIRECTORY_DEFAULT = Path(".dgcc_cluster")
ABORTS_LEGEND = (
    "aborts: calls answered ABORTED (procedure rollbacks, 2PC calls out of retries); "
    "cc aborts: 2PC attempts aborted by concurrency control, then retried"
)
INFLIGHT_DEFAULT = 400  # calls in flight per node, `bench --nodes`
# `cluster start` without --config (its epoch length, like `bench --nodes`'s, is loadgen's)
NODES_DEFAULT = 2
WORKLOAD_DEFAULT = "ycsb"
SEED_DEFAULT = 1
PROTOCOL_DEFAULT = "dgcc"
CALL_TIMEOUT_S_MAX = 7 * 86400.0  # `call --timeout-s`: a week; sockets refuse ~1e10 s
CALL_UNKNOWN = 3  # `call`'s exit status when the call went out but no answer came back


_CONFIG_HELP = (
    "instead of --dir: the config file of nodes started by hand (dgcc node --config FILE)"
)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``node`` and ``cluster`` to a ``dgcc`` sub-command set."""
    node = commands.add_parser("node", help="run one cluster node (one OS process)")
    node.add_argument(
        "--config",
        type=Path,
        required=True,
        help="cluster config (.toml/.json; `cluster start` writes DIR/cluster.json)",
    )
    node.add_argument("--id", type=int, required=True, help="this node's id in the config")
    node.add_argument(
        "--data-dir", help="log and recover under DIR/node<id> (overrides the config's data_dir)"
    )
    node.set_defaults(check_invariants=False)  # the dgcc entry point reads this flag
    call = commands.add_parser(
        "call",
        help="call one stored procedure on a running cluster and print its outcome (exit 0 "
        "committed, 1 aborted, 2 error, 3 unknown: sent, but no answer came back)",
    )
    call.add_argument(
        "procedure", help="the procedure's name (a wrong one is answered with the list of names)"
    )
    call.add_argument("params", nargs="?", default="{}", help='its params as JSON ({"k": 1})')
    call.add_argument(
        "--dir",
        type=Path,
        help=f"the cluster's dir, as cluster start made it ({DIRECTORY_DEFAULT})",
    )
    call.add_argument("--config", type=Path, help=_CONFIG_HELP)
    call.add_argument("--node", type=int, default=0, help="the node to call (0)")
    call.add_argument(
        "--timeout-s", type=float, default=30.0, help="wait this long for the answer (30)"
    )
    call.set_defaults(check_invariants=False)
    cluster = commands.add_parser("cluster", help="start, stop or query a local cluster")
    cluster.set_defaults(check_invariants=False)
    actions = cluster.add_subparsers(dest="action", required=True)
    start = actions.add_parser(
        "start",
        help="start N node processes on loopback (with no flags: the cluster of --dir again), "
        "or (--node) one node again",
    )
    _add_start_flags(start)
    stop = actions.add_parser(
        "stop", help="stop every node (by request; unreachable recorded pids by SIGTERM)"
    )
    status = actions.add_parser(
        "status", help="each node's address, pid, readiness, epochs and counts"
    )
    check = actions.add_parser(
        "check",
        help="read every node's rows while no call runs and check the workload's invariants "
        "over them (exit 1 on a violation)",
    )
    for parser in (start, stop, status, check):
        parser.add_argument(
            "--dir",
            type=Path,
            help=f"cluster state directory: config, pids, node logs ({DIRECTORY_DEFAULT})",
        )
    for parser in (stop, status, check):
        parser.add_argument("--config", type=Path, help=_CONFIG_HELP)


def _add_start_flags(start: argparse.ArgumentParser) -> None:
    """``cluster start``'s flags. Those that build the config default to None, so ``_start``
    can tell which were given (``--config`` and ``--node`` refuse them)."""
    from dgcc.cli import _add_workload_flags  # the parser that calls register is dgcc.cli's

    start.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help=f"node processes ({NODES_DEFAULT}); TPC-C warehouses (--warehouses or -o) then "
        f"count per node ({TPCC_WAREHOUSES_PER_NODE} per node)",
    )
    start.add_argument(
        "--config", type=Path, help="a config file (keys: dgcc/README.md) instead of the flags"
    )
    start.add_argument(
        "--workload",
        help=f"tpcc, ycsb, smallbank, or package.module:Class ({WORKLOAD_DEFAULT})",
    )
    _add_workload_flags(start)
    start.add_argument(
        "--epoch-ms", type=float, help=f"close an epoch after this many ms ({EPOCH_MS_DEFAULT})"
    )
    start.add_argument(
        "--seed", type=int, help=f"data load seed, the same on every node ({SEED_DEFAULT})"
    )
    start.add_argument(
        "--protocol", help=f"dgcc, calvin, no_wait, wait_die or occ ({PROTOCOL_DEFAULT})"
    )
    start.add_argument(
        "--data-dir",
        metavar="DIR",
        help="logging on: node n logs to and recovers from DIR/node<n> (logs already there "
        "are recovered); needed to restart a node alone with --node",
    )
    start.add_argument(
        "--checkpoint-every-epochs",
        type=int,
        metavar="N",
        help="with --data-dir: a checkpoint every N epochs (0: only the initial one)",
    )
    start.add_argument(
        "--secret-env",
        metavar="NAME",
        help="nodes and clients must prove the shared secret held in environment variable "
        "NAME (set it for status, stop and --node too)",
    )
    start.add_argument(
        "--node",
        type=int,
        metavar="ID",
        help="start only this node of the cluster in --dir again, with that cluster's config "
        "(after it died: it recovers from its log and rejoins the running nodes; the cluster "
        "needs --data-dir and the dgcc or calvin protocol: a 2PC cluster restarts whole)",
    )


def add_bench_flags(bench: argparse.ArgumentParser) -> None:
    """The flags that make ``dgcc bench`` drive a cluster of node processes."""
    bench.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="run on a new cluster of N node processes in a temporary folder; TPC-C warehouses "
        f"(--warehouses or -o) then count per node ({TPCC_WAREHOUSES_PER_NODE} per node)",
    )
    bench.add_argument(
        "--distributed-fraction",
        type=float,
        default=None,
        help="fraction of multi-node transactions (default: the workload's own mix)",
    )
    bench.add_argument(
        "--inflight", type=int, default=None, help=f"calls in flight per node ({INFLIGHT_DEFAULT})"
    )
    bench.add_argument(
        "--epoch-ms",
        type=float,
        default=None,
        help=f"close an epoch after this many ms or inflight/4 calls ({EPOCH_MS_DEFAULT})",
    )
    bench.add_argument(
        "--durable",
        action="store_true",
        help="with --nodes: every node logs; calls are answered once durable",
    )


def bench_nodes(args: argparse.Namespace) -> int:
    """``dgcc bench --nodes N``: drive a cluster of node processes closed-loop; print a table."""
    from rich.progress import BarColumn, Progress, TextColumn

    from dgcc.bench import make_console
    from dgcc.net.loadgen import bench_cluster_config, run_bench, summary_line

    bench = _bench_config(args)
    bench_cluster_config(bench, None)  # a bad setting: one line, before the progress bar
    console = make_console()
    columns = (TextColumn("{task.description}"), BarColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("loading", total=bench.warmup_s + bench.seconds)

        def report(phase: str, done_s: float) -> None:
            offset = bench.warmup_s if phase == "measure" else 0.0
            progress.update(task, completed=done_s + offset, description=phase)

        record = run_bench(bench, progress=report)
    print(ABORTS_LEGEND)  # (above the table: what follows its border is read as results)
    console.print(results_table([record]))
    violations = record["violations"]
    for violation in violations[:20]:
        print(f"violation: {violation}")
    print(summary_line(record) + f" violations={len(violations)}")
    if getattr(args, "json", None):
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return 1 if violations else 0


def _bench_config(args: argparse.Namespace) -> Any:
    """The ``ClusterBenchConfig`` of a parsed ``dgcc bench --nodes N``."""
    from dgcc.cli import _workload_options
    from dgcc.net.loadgen import ClusterBenchConfig

    return ClusterBenchConfig(
        workload=args.workload,
        nodes=args.nodes,
        distributed_fraction=args.distributed_fraction,
        workload_options=_workload_options(args),
        seconds=args.seconds,
        warmup_s=args.warmup_s,
        inflight=INFLIGHT_DEFAULT if args.inflight is None else args.inflight,
        epoch_ms=_epoch_ms(args),
        seed=args.seed,
        protocol=server_name(args.protocol),
        durable=args.durable,
        check=True,  # as the in-process bench: the end state is checked (a workload's invariants)
    )


def results_table(records: list[dict[str, Any]]) -> Any:
    """A rich table of cluster benchmark records."""
    from rich.table import Table

    durable = any(record["config"].get("durable") for record in records)
    title = "dgcc cluster benchmark" + (" (durable: every node logs, fsync on)" if durable else "")
    table = Table(title=title)
    # "multi-node asked": the share of calls made to span nodes (the workload's own mix: "mix").
    columns = ("workload", "protocol", "nodes", "multi-node asked", "multi-node", "commits/s")
    columns += ("aborts", "cc aborts", "p50 ms", "p99 ms", "msgs/commit", "bytes/commit")
    for column in (*columns, "node cpu", "viol"):
        justify = "left" if column in ("workload", "protocol") else "right"
        table.add_column(column, justify=justify, overflow="fold")
    for record in records:
        config, metrics = record["config"], record["metrics"]
        asked = config["distributed_fraction"]
        table.add_row(
            config["workload"],
            config["protocol"],
            str(config["nodes"]),
            "mix" if asked is None else f"{asked:.0%}",
            f"{metrics['txn/multi_node_fraction']:.1%}",
            f"{metrics['txn/commits_per_s']:,.0f}",
            f"{metrics['txn/abort_rate'] + metrics['txn/gave_up_rate']:.1%}",
            f"{metrics['txn/cc_abort_rate']:.1%}",
            f"{metrics['txn/latency_ms_p50']:.1f}",
            f"{metrics['txn/latency_ms_p99']:.1f}",
            f"{metrics['net/messages_per_commit']:.3f}",
            f"{metrics['net/bytes_per_commit']:,.0f}",
            f"{metrics['node/cpu_s_per_s']:.2f}",
            "-" if record.get("violations") is None else str(len(record["violations"])),
        )
    return table


def server_name(protocol: str) -> str:
    """``protocol`` if a cluster can run it (ConfigError naming the choices otherwise)."""
    from dgcc.net.servers import server_class

    server_class(protocol)
    return protocol


def dispatch(args: argparse.Namespace) -> int:
    """Run a ``node`` or ``cluster`` command parsed by ``register``'s parsers."""
    if args.command == "node":
        return _node(args)
    if args.command == "bench":
        return bench_nodes(args)
    starting = args.command == "cluster" and args.action == "start"  # (its --config: to start)
    given_config = None if starting else args.config  # nodes started by hand, by dgcc node
    if given_config is not None and args.dir is not None:
        raise ConfigError("give --dir (a cluster that cluster start made) or --config, not both")
    if args.dir is None:
        args.dir = DIRECTORY_DEFAULT
    if args.command == "call":
        return _call(args)
    if args.action == "start":
        return _start(args)
    # Stop and status only reach the nodes: a user workload need not import here.
    check_workload = args.action == "check"
    if given_config is not None:  # nodes started by hand: no pids recorded, nothing to clean
        config = load_config(given_config, check_workload=check_workload)
        if args.action == "status":
            return _status(config, by_file=True)
        if args.action == "check":
            return _check(config)
        result = cluster_stop(config)
        silent = sorted(set(range(len(config.nodes))) - set(result.by_request))
        print(f"stopped {result.stopped} of {len(config.nodes)} nodes")
        if silent:
            print(f"nodes {silent} did not answer (not running, or not reachable from here)")
        return 1 if silent else 0
    try:
        config = _config_in(args.dir, check_workload=check_workload)
    except ConfigError as error:
        damaged = args.action == "stop" and (args.dir / CONFIG_FILE).is_file()  # (not: none)
        recorded = len(read_pids(args.dir)) if damaged else 0
        if not recorded:
            raise
        # The config no longer reads, but the nodes it started are recorded: end them.
        result = terminate_recorded(args.dir)
        print(f"cannot reach the nodes ({error}): ending the recorded ones by SIGTERM")
        print(_stop_summary(result, recorded))
        return _stopped(args.dir, result)
    if args.action == "status":
        return _status(config, recorded=read_pids(args.dir))
    if args.action == "check":
        return _check(config)
    result = cluster_stop(config, directory=args.dir)
    print(_stop_summary(result, len(config.nodes)))
    return _stopped(args.dir, result)


def _stopped(directory: Path, result: StopResult) -> int:
    """``cluster stop``'s exit: 1 while a node still runs, else 0 with the state file gone."""
    if result.still_running:
        return 1
    (directory / STATE_FILE).unlink(missing_ok=True)
    return 0


def _stop_summary(result: StopResult, nodes: int) -> str:
    """What ``stop`` did, counting only nodes known to be stopped as stopped."""
    lines = [f"stopped {result.stopped} of {nodes} nodes"]
    if result.by_signal:
        lines[0] += f" (unreachable nodes {list(result.by_signal)} by SIGTERM)"
    not_running = nodes - result.stopped - len(result.still_running)
    if not_running:
        lines.append(f"{not_running} of {nodes} nodes were not running")
    if result.still_running:
        lines.append(f"nodes {list(result.still_running)} still run after SIGTERM")
    if result.not_ours:
        lines.append(f"left pids {list(result.not_ours)} alone: not this cluster's node processes")
    return "\n".join(lines)


def _node(args: argparse.Namespace) -> int:
    from dgcc.net.servers import run_server
    from dgcc.net.wire import run_async
    from dgcc.wal.rejoin import RejoinError

    overrides = {} if args.data_dir is None else {"data_dir": args.data_dir}
    config = load_config(args.config, **overrides)
    if not 0 <= args.id < len(config.nodes):
        raise ConfigError(
            f"--id {args.id} is not a node of {args.config} (0..{len(config.nodes) - 1})"
        )
    if config.data_dir is not None:  # one line here, not a traceback from the node's lock
        _make_data_dir(Path(config.data_dir))
        _make_data_dir(Path(config.data_dir) / f"node{args.id}")

    def ready(node: Any) -> None:
        address = config.nodes[args.id]
        sys.stdout.write(f"READY {args.id} {address.host}:{address.port} pid={os.getpid()}\n")
        sys.stdout.flush()

    try:
        run_async(run_server(config, args.id, ready))
    except RejoinError as error:
        print(f"dgcc: error: node {args.id} cannot rejoin: {error}", file=sys.stderr)
        return 2
    return 0


def _start(args: argparse.Namespace) -> int:
    from dgcc.net.servers.cc import PROTOCOLS as TWO_PHASE_PROTOCOLS  # (2PC: no rejoin)

    given = _config_flags_given(args)
    if args.node is not None:
        given = ["--config"] * (args.config is not None) + given
        _refuse(given, "--node (the node restarts with the config of the cluster in --dir)")
        check_node_restart(args.dir, args.node)  # refuse before saying it starts
        print(  # it may wait a while, for peers that are down too: say so first
            f"starting node {args.node}: it recovers its log, then rejoins its peers or "
            "joins their restart (it waits a while for peers that are down) ...",
            flush=True,
        )
        start = log_size(args.dir, args.node)
        process = start_node(args.dir, args.node)
        _print_warnings(args.dir, {args.node: start})
        print(f"node {args.node} started again (pid {process.pid}); config and logs in {args.dir}")
        return 0
    if args.dir.is_dir():  # refused before anything says it starts (start_local checks again)
        refuse_running(args.dir)
    earlier = args.dir / CONFIG_FILE
    if args.config is not None:
        _refuse(given, "--config (the config file holds every setting)")
        config = load_config(args.config)
    elif not given and earlier.is_file():  # a whole-cluster restart: the same cluster again
        try:
            config = load_config(earlier)
        except ConfigError as error:
            raise ConfigError(
                f"{error} (with no flags, cluster start restarts the cluster of {earlier}; "
                "flags or --config start another)"
            ) from None
        print(f"restarting the cluster of {earlier} (flags or --config start another)")
        if config.data_dir is None:
            print(
                "it runs without logging (no data_dir): every node loads its initial data "
                "again, and what the earlier run committed is not kept"
            )
    else:
        config = _flags_config(args)
    if config.data_dir is not None and not Path(config.data_dir).is_absolute():
        # as --data-dir: cluster.json keeps it absolute, so a node restarted from another
        # working directory (cluster start --node) finds its log, not a new empty directory
        config = dataclasses.replace(config, data_dir=str(Path(config.data_dir).resolve()))
    check_tpcc_placement(config)
    config.shared_secret()  # an unset secret_env fails here, not inside every node
    if config.data_dir is not None:
        _make_data_dir(Path(config.data_dir))
    what = "loads its data" if config.data_dir is None else "loads or recovers its data"
    print(f"starting {len(config.nodes)} nodes (each {what} first) ...", flush=True)
    starts = {node.id: log_size(args.dir, node.id) for node in config.nodes}
    cluster = start_local(config, args.dir)
    _print_warnings(args.dir, starts)
    for node, process in zip(config.nodes, cluster.processes, strict=True):
        print(f"node {node.id} listening on {node.host}:{node.port} (pid {process.pid})")
    print(f"config and logs in {args.dir}; stop with: dgcc cluster stop --dir {args.dir}")
    if config.data_dir is not None and config.protocol not in TWO_PHASE_PROTOCOLS:
        print(
            f"logging to {config.data_dir}; restart a stopped node with: "
            f"dgcc cluster start --dir {args.dir} --node ID"
        )
    elif config.data_dir is not None:  # (start_node refuses the 2PC protocols)
        print(
            f"logging to {config.data_dir}; a {config.protocol} cluster restarts whole "
            f"after a node stops: dgcc cluster stop, then dgcc cluster start --dir {args.dir}"
        )
    return 0


def _print_warnings(directory: Path, starts: dict[int, int]) -> None:
    """What each node's start logged as a warning (a restart that cut a torn log tail or
    dropped epochs not every node had made durable says so here, not only in its log)."""
    for node, start in starts.items():
        for line in logged_warnings(directory, node, start):
            print(f"node {node}: {line}")


def _config_flags_given(args: argparse.Namespace) -> list[str]:
    """The ``cluster start`` flags given that build a config (all default to None or [])."""
    from dgcc.cli import WORKLOAD_FLAGS

    names = ["nodes", "workload", *WORKLOAD_FLAGS, "workload_option", "epoch_ms", "seed"]
    names += ["protocol", "data_dir", "checkpoint_every_epochs", "secret_env"]
    return [
        f"--{name.replace('_', '-')}" for name in names if getattr(args, name) not in (None, [])
    ]


def _refuse(flags: list[str], where: str) -> None:
    if flags:
        verb = "does" if len(flags) == 1 else "do"
        raise ConfigError(f"{', '.join(flags)} {verb} not apply with {where}")


def _epoch_ms(args: argparse.Namespace) -> float:
    """``--epoch-ms``, refusing 0: epochs that close by count alone wait, on every node, for
    ``epoch_calls_max`` calls, which a few calls (a ``dgcc call``, a light load) never reach,
    and the whole cluster then waits (a setting for tests that send exact batches).

    Raises:
        ConfigError: ``--epoch-ms`` 0 or less.
    """
    if args.epoch_ms is None:
        return EPOCH_MS_DEFAULT
    if not args.epoch_ms > 0:  # (NaN too)
        raise ConfigError(
            f"--epoch-ms must be > 0, got {args.epoch_ms:g}: epochs closed by count alone wait "
            "for that many calls on every node, and the cluster stalls until a node gets them"
        )
    return args.epoch_ms


def _flags_config(args: argparse.Namespace) -> ClusterConfig:
    """The loopback config ``cluster start`` builds from its flags."""
    from dgcc.cli import _workload_options

    if args.checkpoint_every_epochs is not None and args.data_dir is None:
        raise ConfigError(
            "--checkpoint-every-epochs needs --data-dir (checkpoints are written there)"
        )
    nodes = NODES_DEFAULT if args.nodes is None else args.nodes
    workload = args.workload or WORKLOAD_DEFAULT
    data_dir = None
    if args.data_dir is not None:
        if not args.data_dir:
            raise ConfigError("--data-dir must name a directory, got ''")
        # Absolute: `cluster start --node` may run from another working directory.
        data_dir = str(Path(args.data_dir).resolve())
    return local_config(
        nodes,
        workload=workload,
        workload_options=cluster_workload_options(workload, _workload_options(args), nodes),
        epoch_ms=_epoch_ms(args),
        seed=SEED_DEFAULT if args.seed is None else args.seed,
        protocol=server_name(args.protocol or PROTOCOL_DEFAULT),
        data_dir=data_dir,
        checkpoint_every_epochs=args.checkpoint_every_epochs or 0,
        secret_env=args.secret_env,
    )


def _make_data_dir(path: Path) -> None:
    """Create the data dir now, so an unusable one is one error here, not one per node."""
    make_dir(path, "cannot use {path!r} as a data dir: {why}")


def _config_in(directory: Path, *, check_workload: bool = True) -> ClusterConfig:
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ConfigError(f"no cluster in {str(directory)!r} (missing {CONFIG_FILE})")
    return load_config(config_path, check_workload=check_workload)


def _call(args: argparse.Namespace) -> int:
    """``dgcc call``: one procedure on node ``--node``; the outcome as one JSON line."""
    from dgcc.net.client import Client
    from dgcc.net.wire import FrameError, FrameRefused, NetError, frame

    if not 0 < args.timeout_s <= CALL_TIMEOUT_S_MAX:  # NaN fails too; 0 means non-blocking
        raise ConfigError(
            f"--timeout-s must be a number of seconds in (0, {CALL_TIMEOUT_S_MAX:g}], "
            f"got {args.timeout_s!r}"
        )
    params = _call_params(args.params)
    try:
        frame(("calls", ((1, args.procedure, params),)))
    except FrameError as error:  # (a name that is not text: the params are checked above)
        raise ConfigError(f"procedure {brief(args.procedure)} cannot be sent: {error}") from None
    if args.config is not None:
        config, source = load_config(args.config, check_workload=False), str(args.config)
    else:
        config, source = _config_in(args.dir, check_workload=False), f"the cluster in {args.dir}"
    if not 0 <= args.node < len(config.nodes):  # (the node checks the call itself)
        raise ConfigError(f"--node {args.node} is not a node of {source}")
    node = config.nodes[args.node]
    secret = config.shared_secret()
    where = f"node {args.node} at {node.host}:{node.port}"
    try:
        client = Client(node.host, node.port, secret=secret, timeout_s=args.timeout_s)
    except (OSError, NetError) as error:  # nothing was sent
        raise ConfigError(f"{where}: {error}") from None
    with client:
        try:
            outcome = client.call(args.procedure, params)
        except FrameRefused as error:  # the node read our frame and refused it whole
            raise ConfigError(f"{where}: {error}; the call did not run") from None
        except (OSError, NetError) as error:  # the call may have reached the node
            print(
                f"dgcc: error: {where}: {error}; the call was sent, so its outcome is unknown: "
                "it may still commit (look at its effect before calling again)",
                file=sys.stderr,
            )
            return CALL_UNKNOWN
    result = _json_keys(outcome.result)
    answer = {"status": outcome.status.value, "result": result, "reason": outcome.reason}
    print(json.dumps(answer, default=repr))
    return {"committed": 0, "aborted": 1}.get(outcome.status.value, 2)


def _json_keys(value: Any) -> Any:
    """``value`` with every map key JSON cannot take (a tuple, bytes ...) written as its repr:
    msgpack carries such keys, and ``json.dumps``'s ``default`` never sees keys."""
    if isinstance(value, dict):
        plain = (str, int, float, bool, type(None))
        return {
            key if isinstance(key, plain) else repr(key): _json_keys(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_json_keys(item) for item in value]
    return value


def _call_params(text: str) -> dict[str, Any]:
    """``dgcc call``'s params: a JSON object that the wire can carry."""
    import msgpack  # (not wire.encode: its one FrameError would hide which limit was hit)

    try:
        params = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as error:
        raise ConfigError(f"params {text!r:.200} name {error} twice") from None
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
        raise ConfigError(f"params {text!r:.200} are not JSON: {error}") from None
    if not isinstance(params, dict):
        raise ConfigError(f'params must be a JSON object ({{"name": value}}), got {text!r:.200}')
    try:
        msgpack.packb(params, use_bin_type=True)
    except OverflowError:
        raise ConfigError(
            f"params {text!r:.200} hold an integer outside -2**63 .. 2**64 - 1, which a call "
            "cannot carry"
        ) from None
    except UnicodeEncodeError as error:
        bad = error.object[error.start : error.end]
        raise ConfigError(
            f"params {text!r:.200} hold {bad!r}, which is not valid in UTF-8 (a lone surrogate)"
        ) from None
    except ValueError as error:  # msgpack's own limits (nesting depth, sizes)
        raise ConfigError(f"params {text!r:.200} cannot be sent: {error}") from None
    return params


def _check(config: Any) -> int:
    from dgcc.local_cluster import check

    print(f"reading the rows of {len(config.nodes)} nodes while no call runs ...", flush=True)
    violations = check(config)
    for violation in violations[:20]:
        print(f"violation: {violation}")
    print(
        f"cluster of {len(config.nodes)} nodes ({config.workload}): "
        + (f"{len(violations)} violations" if violations else "consistent")
    )
    return 1 if violations else 0


def _status(config: Any, *, by_file: bool = False, recorded: list[int] | None = None) -> int:
    """``cluster status``: a table of the nodes and, below it, what is wrong (exit 1 then);
    ``by_file``: the nodes were started by hand (``dgcc node --config``), not by ``cluster
    start``, so the advice names restarting them that way; ``recorded``: the pids a cluster
    folder's state file holds, to tell its nodes from another cluster's on the same ports."""
    from rich.table import Table

    from dgcc.bench import make_console
    from dgcc.net.servers.cc import PROTOCOLS as TWO_PHASE_PROTOCOLS

    table = Table(title="dgcc cluster")
    columns = ("node", "address", "pid", "ready", "epochs", "rows held", "committed", "aborted")
    for column in (*columns, "failed calls"):
        table.add_column(column, overflow="fold")
    problems = []  # what is wrong, below the table: a reason must be read whole
    epochs = config.protocol not in TWO_PHASE_PROTOCOLS  # (2PC nodes run no epochs)
    for entry in cluster_status(config):
        if "error" in entry and "ready" not in entry:
            address = config.nodes[entry["id"]]
            # A node that answered but refused us (a wrong secret) is not down.
            state = "refused" if entry["error"].startswith("HandshakeError") else "down"
            cells = (str(entry["id"]), f"{address.host}:{address.port}", "-", state)
            table.add_row(*cells, "-", "-", "-", "-", "-")
            problems.append(f"node {entry['id']} {state}: {entry['error']}")
            continue
        node = entry["id"]
        if recorded is not None and (node >= len(recorded) or entry["pid"] != recorded[node]):
            problems.append(
                f"node {node}'s address {entry['host']}:{entry['port']} answers from pid "
                f"{entry['pid']}, which is not the process this folder started (another "
                "cluster took the port?)"
            )
        down = entry.get("peers_down") or []
        if down and epochs:  # its link to them failed (a crash, or a frame it refused)
            problems.append(
                f"node {entry['id']} lost its link to nodes {down}: the epochs they share wait "
                "until they rejoin (see the nodes' logs)"
            )
        elif down:
            restart = (
                "dgcc cluster stop --config FILE, then dgcc node --config FILE --id N on each host"
                if by_file
                else "dgcc cluster stop, then dgcc cluster start"
            )
            problems.append(
                f"node {entry['id']} lost its link to nodes {down}: its calls that need them "
                f"fail; a {config.protocol} cluster restarts whole ({restart}; see the nodes' "
                "logs)"
            )
        table.add_row(
            str(entry["id"]),
            f"{entry['host']}:{entry['port']}",
            str(entry["pid"]),
            ("peers down" if down else "yes") if entry["ready"] else "no",
            str(entry["epochs_executed"]) if epochs else "-",
            f"{entry['rows_held']:,}",
            f"{entry['txn/committed']:,.0f}",
            f"{entry['txn/aborted']:,.0f}",
            f"{entry['txn/error']:,.0f}",
        )
    make_console().print(table)
    for line in problems:
        print(line)
    return 1 if problems else 0
