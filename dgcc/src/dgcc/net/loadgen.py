"""Closed-loop load for a cluster: request streams with a distributed fraction, client processes.

``request_pool`` builds a node's requests: every transaction starts on data the node owns and,
with probability ``distributed_fraction``, also touches data of another node (YCSB: half of its
keys; Smallbank: an Amalgamate or SendPayment with a remote second customer, which only
those two calls have, so each crosses with probability ``distributed_fraction`` over their
40% share of the mix, capped at all of them; TPC-C: a remote supply warehouse or a remote
paying customer, which only NewOrder and Payment can have, so each of those crosses nodes with
probability ``distributed_fraction`` over their share of the mix, and a fraction above that
share (88% of the standard mix) makes all of them cross). ``None`` keeps the workload's own
mix: TPC-C's standard 1% / 15% remote fractions, and YCSB's keys and Smallbank's customers drawn
over the whole cluster, as the workload's own request stream draws them; a workload of your own
runs its own mix only. ``run_bench`` starts the node processes and
one client process per node, each with ``inflight`` calls always outstanding on one pipelined
connection (answers arrive batched per epoch; each submits the next call from a callback), and
measures a window after a warm-up. ``cluster_workload_options`` makes TPC-C warehouses count per
node, here and in ``dgcc cluster start``. Calls a 2PC node gave up on after its retry budget
(ABORTED with a ``retry`` reason) count apart from logic aborts: ``txn/gave_up_rate`` and
``txn/abort_rate`` (logic aborts only) are both shares of all answered calls.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import logging
import math
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dgcc.api import TxnRequest
from dgcc.cluster import ClusterConfig, load_config, local_config
from dgcc.errors import ConfigError
from dgcc.local_cluster import check, last_log_line, spawn_into, start_local, wait_ready_lines
from dgcc.net.wire import run_async
from dgcc.stats import host_ticks, percentile
from dgcc.workloads import get_workload
from dgcc.workloads.smallbank import TWO_CUSTOMER_SHARE
from dgcc.workloads.tpcc.schema import MIX_STANDARD
from dgcc.workloads.ycsb import ZipfianGenerator

__all__ = [
    "EPOCH_MS_DEFAULT",
    "TPCC_WAREHOUSES_PER_NODE",
    "ClusterBenchConfig",
    "check_pool",
    "check_tpcc_placement",
    "cluster_workload_options",
    "request_pool",
    "run_bench",
]

logger = logging.getLogger(__name__)

POOL_SIZE = 20_000
CLIENT_EXIT_TIMEOUT_S = 60.0
# The epoch length of cluster benchmarks and of the cluster CLI (`bench --nodes`, `cluster
# start`); docs/benchmarks.md reports runs at this value.
EPOCH_MS_DEFAULT = 2.0
TPCC_WAREHOUSES_PER_NODE = 2  # when a cluster run names no warehouse count (weak scaling)
COUNTED = ("committed", "aborted", "gave_up", "error")  # a client's answers, by kind


def cluster_workload_options(
    workload: str, options: Mapping[str, Any], nodes: int
) -> dict[str, Any]:
    """``options`` for a cluster of ``nodes`` nodes: TPC-C ``warehouses`` counts per node.

    Weak scaling, and every node owns warehouses (warehouse w lives on partition
    (w - 1) % partitions); without a count, ``TPCC_WAREHOUSES_PER_NODE`` per node.

    Raises:
        ConfigError: a TPC-C warehouse count per node that is not an int >= 1.
    """
    options = dict(options)
    if workload == "tpcc":
        per_node = options.get("warehouses", TPCC_WAREHOUSES_PER_NODE)
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise ConfigError(f"tpcc warehouses per node must be an int >= 1, got {per_node!r}")
        options["warehouses"] = per_node * nodes
    return options


def check_tpcc_placement(config: ClusterConfig) -> None:
    """Refuse a TPC-C cluster in which some node would own no warehouse (it would hold no data).

    Raises:
        ConfigError: naming the idle nodes and the warehouse count that would fill them.
    """
    if config.workload != "tpcc":
        return
    workload = get_workload("tpcc", **dict(config.workload_options))
    owners = config.placement().partition_nodes
    warehouses = workload.config.warehouses
    owning = {
        owners[workload.partition_of(("warehouse", w), len(owners))]
        for w in range(1, warehouses + 1)
    }
    idle = sorted(set(range(len(config.nodes))) - owning)
    if idle:
        raise ConfigError(
            f"tpcc with warehouses={warehouses} leaves nodes {idle} of {len(config.nodes)} "
            f"owning no warehouse; give at least {len(owners)} warehouses"
        )


def _ranges(size: int, partitions: int) -> list[range]:
    """Partition q of a range-partitioned id space [0, size): ids with id * p // size == q."""
    bounds = [math.ceil(q * size / partitions) for q in range(partitions + 1)]
    return [range(bounds[q], bounds[q + 1]) for q in range(partitions)]


def _split(config: ClusterConfig, node: int) -> tuple[list[int], list[int]]:
    """This node's partitions and the partitions of every other node."""
    owners = config.placement().partition_nodes
    mine = [p for p, owner in enumerate(owners) if owner == node]
    return mine, [p for p, owner in enumerate(owners) if owner != node]


def request_pool(
    config: ClusterConfig, node: int, fraction: float | None, seed: int, count: int = POOL_SIZE
) -> list[TxnRequest]:
    """``count`` requests for clients of ``node``; see the module docstring."""
    if fraction is not None and not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"distributed fraction must be in [0, 1], got {fraction}")
    maker = _POOLS.get(config.workload, _own_pool)
    if fraction is None and maker is not _tpcc_pool:  # YCSB, Smallbank: their own key draws
        maker = _own_pool
    check_pool(config, fraction)
    rng = random.Random(seed * 7919 + node)
    return maker(config, node, fraction, rng, count)


def _own_pool(config, node, fraction, rng, count) -> list[TxnRequest]:
    """The workload's own request stream, seeded per node (your own ``package.module:Class``,
    or a built-in one with no distributed fraction asked for): which calls cross nodes is its
    mix's business, not a knob here."""
    assert fraction is None, f"{config.workload}: a distributed fraction of its own mix"
    workload = get_workload(config.workload, **dict(config.workload_options))
    return list(itertools.islice(workload.requests(rng.randrange(2**31)), count))


def check_pool(config: ClusterConfig, fraction: float | None) -> None:
    """Refuse a YCSB or SmallBank cluster whose partitions are too small for the calls the
    request pool makes there (it would draw keys forever, or divide by an empty range).

    Raises:
        ConfigError: naming the sizes and the least that would do.
    """
    if fraction is None or config.workload not in ("ycsb", "smallbank"):
        return  # the workload's own stream: no per-partition draws
    workload = get_workload(config.workload, **dict(config.workload_options))
    partitions = config.placement().partitions
    if config.workload == "ycsb":
        size, ops = workload.records, workload.ops_per_txn
        smallest = min(map(len, _ranges(size, partitions)))
        if smallest < ops:
            raise ConfigError(
                f"ycsb: {size} records over {partitions} partitions leave {smallest} in one, "
                f"fewer than ops_per_txn={ops} distinct keys a call takes there; give at least "
                f"{ops * partitions} records"
            )
        if fraction and len(config.nodes) > 1 and ops < 2:
            raise ConfigError(
                "ycsb: a distributed call touches keys of its own node and of another, so a "
                f"distributed fraction needs ops_per_txn >= 2, got {ops}"
            )
        return
    size = workload.accounts
    smallest = min(map(len, _ranges(size, partitions)))
    if smallest < 2:
        raise ConfigError(
            f"smallbank: {size} accounts over {partitions} partitions leave {smallest} in one, "
            f"and a call takes 2 accounts of its node; give at least {2 * partitions} accounts"
        )


def _ycsb_pool(config, node, fraction, rng, count) -> list[TxnRequest]:
    workload = get_workload("ycsb", **dict(config.workload_options))
    ranges = _ranges(workload.records, config.placement().partitions)
    mine, others = _split(config, node)
    # One Zipf draw per partition size, so every key of a longer range can come up.
    zipfs = {
        size: ZipfianGenerator(size, workload.theta, rng.randrange(2**31))
        for size in sorted({len(r) for r in ranges})
    }
    ops = workload.ops_per_txn
    pool = []
    for _ in range(count):
        home = ranges[rng.choice(mine)]
        remote = others and fraction and rng.random() < fraction
        far = ranges[rng.choice(others)] if remote else home
        keys: list[int] = []
        while len(keys) < ops:
            place = far if remote and len(keys) < max(1, ops // 2) else home
            key = place[zipfs[len(place)].next()]
            if key not in keys:
                keys.append(key)
        rmw = [rng.random() >= workload.read_ratio for _ in keys]
        pool.append(TxnRequest("ycsb_txn", {"keys": keys, "rmw": rmw}))
    return pool


def _smallbank_pool(config, node, fraction, rng, count) -> list[TxnRequest]:
    workload = get_workload("smallbank", **dict(config.workload_options))
    ranges = _ranges(workload.accounts, config.placement().partitions)
    mine, others = _split(config, node)
    stream = workload.requests(rng.randrange(2**31))
    # Only the two-customer calls (Amalgamate, SendPayment) can cross nodes: each does with
    # probability fraction / their share of the mix, so the mix stays the standard one and
    # ``fraction`` of all calls cross (capped at their share, 40%).
    cross = min(1.0, (fraction or 0.0) / TWO_CUSTOMER_SHARE)
    pool = []
    for request in itertools.islice(stream, count):
        params = dict(request.params)
        home = ranges[rng.choice(mine)]
        for name in ("customer", "source", "target"):  # scaled into the home range: the mix's
            if name in params:  # spread hotspot stays spread, whatever the partitions' sizes
                params[name] = home[params[name] * len(home) // workload.accounts]
        if "target" in params and params["target"] == params["source"]:
            params["target"] = home[(home.index(params["source"]) + 1) % len(home)]
        if others and "target" in params and rng.random() < cross:
            far = ranges[rng.choice(others)]  # the target drawn as the mix draws customers
            params["target"] = far[workload.draw_customer(rng) * len(far) // workload.accounts]
        pool.append(TxnRequest(request.procedure, params))
    return pool


def _tpcc_pool(config, node, fraction, rng, count) -> list[TxnRequest]:
    options = dict(config.workload_options)
    partitions = config.placement().partitions
    probe = get_workload("tpcc", **options)
    warehouses = probe.config.warehouses
    owners = config.placement().partition_nodes
    mine = [w for w in range(1, warehouses + 1) if owners[(w - 1) % partitions] == node]
    others = [w for w in range(1, warehouses + 1) if w not in mine]
    if not mine:
        raise ConfigError(f"node {node} owns no tpcc warehouse of {warehouses}")
    options["home_warehouses"] = mine
    if fraction is not None:
        options |= {"remote_item_fraction": 0.0, "remote_payment_fraction": 0.0}
    workload = get_workload("tpcc", **options)
    # Only NewOrder and Payment can touch another warehouse: each crosses with the chance that
    # makes ``fraction`` of all calls cross (capped at all of them).
    mix = workload.config.mix or MIX_STANDARD
    can_cross = mix.get("new_order", 0.0) + mix.get("payment", 0.0)
    if fraction and can_cross == 0:
        raise ConfigError(
            "a tpcc distributed fraction needs new_order or payment in the mix: only they can "
            "touch another warehouse"
        )
    chance = min(1.0, fraction * sum(mix.values()) / can_cross) if fraction else 0.0
    pool = []
    for request in itertools.islice(workload.requests(rng.randrange(2**31)), count):
        params = dict(request.params)
        crossing = request.procedure in ("new_order", "payment")
        if crossing and others and rng.random() < chance:
            far = rng.choice(others)
            if request.procedure == "new_order":
                lines = [tuple(line) for line in params["lines"]]
                lines[0] = (lines[0][0], far, lines[0][2])
                params["lines"] = lines
            elif request.procedure == "payment":
                # A by-name customer stays valid: every district has every loaded name.
                params["c_w_id"], params["c_d_id"] = far, rng.randint(1, 10)
        pool.append(TxnRequest(request.procedure, params))
    return pool


# The built-in workloads' cluster loads (with a distributed-fraction knob); any other
# workload runs its own request mix (``_own_pool``).
_POOLS = {"tpcc": _tpcc_pool, "ycsb": _ycsb_pool, "smallbank": _smallbank_pool}


# -- one client process ---------------------------------------------------------------------


async def _client_loop(args: argparse.Namespace) -> dict[str, Any]:
    from dgcc.net.client import AsyncClient

    config = load_config(args.config)
    pool = request_pool(config, args.node, args.fraction, args.seed)
    address = config.nodes[args.node]
    client = await AsyncClient.connect(address.host, address.port, secret=config.shared_secret())
    gc.collect()
    gc.freeze()  # the request pool lives as long as the process
    # Readiness handshake with the driver: say READY, then read the window (unix times).
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    window = sys.stdin.readline().split()
    if len(window) != 2:
        raise ConfigError(f"expected 'measure_from until' on stdin, got {window!r}")
    loop = _ClosedLoop(client, pool, float(window[0]), float(window[1]))
    return await loop.run(args.inflight) | {"node": args.node}


class _ClosedLoop:
    """``inflight`` calls always outstanding: each answer submits the next call at once.

    Callbacks, not a coroutine per call: the client process stays a small share of a core.
    Counts and latencies cover the calls answered inside ``[measure_from, until)``, whenever
    they started: throughput is completions per second of the window, and a protocol whose
    calls take longer than the window is not undercounted (counting only calls that also
    started inside it dropped them, and their latencies). ``counts`` splits the answers into
    committed, aborted (logic aborts), gave_up (concurrency-control give-ups) and error.
    """

    def __init__(self, client: Any, pool: list[TxnRequest], measure_from: float, until: float):
        self.client = client
        self.cursor = itertools.cycle([(r.procedure, r.params) for r in pool])
        self.measure_from = measure_from
        self.until = until
        self.counts = dict.fromkeys(COUNTED, 0)
        self.latencies_ms: list[float] = []
        self.lost: BaseException | None = None
        self.done = asyncio.Event()

    def _submit(self) -> None:
        procedure, params = next(self.cursor)
        started_s = time.time()
        self.client.submit(procedure, params, lambda result: self._answered(started_s, result))

    def _answered(self, started_s: float, result: Any) -> None:
        done_s = time.time()
        if isinstance(result, BaseException):
            self.lost = result
            self.done.set()
            return
        if self.measure_from <= done_s < self.until:
            self.counts["gave_up" if result.gave_up else result.status.value] += 1
            self.latencies_ms.append((done_s - started_s) * 1000)
        if done_s < self.until:
            self._submit()
        elif not self.client.in_flight:
            self.done.set()

    async def run(self, inflight: int) -> dict[str, Any]:
        for _ in range(inflight):
            self._submit()
        await asyncio.sleep(max(0.0, self.measure_from - time.time()))
        cpu_from_s = time.process_time()  # CPU time of this process over the window
        await asyncio.sleep(max(0.0, self.until - time.time()))
        cpu_s = time.process_time() - cpu_from_s
        try:  # the window's answers are counted; the rest only need to end, or be left
            await asyncio.wait_for(self.done.wait(), CLIENT_EXIT_TIMEOUT_S)
        except TimeoutError:  # e.g. a 2PC baseline retrying hundreds of calls at 99% aborts
            logger.warning(
                "%d calls still in flight %.0f s after the window: left unanswered",
                self.client.in_flight, CLIENT_EXIT_TIMEOUT_S,
            )  # fmt: skip
        lost = self.lost  # before closing: the close fails the calls left above, as lost
        await self.client.close()
        if lost is not None:
            raise lost
        return {"counts": self.counts, "latencies_ms": self.latencies_ms, "cpu_s": cpu_s}


def _client_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dgcc-loadgen")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--inflight", type=int, required=True)
    parser.add_argument("--fraction", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run_async(_client_loop(args))
    args.out.write_text(json.dumps(result))
    return 0


# -- the driver -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterBenchConfig:
    """One cluster benchmark run.

    Args:
        workload: ``tpcc``, ``ycsb``, ``smallbank`` or ``package.module:Class``.
        nodes: node processes (one client process each).
        distributed_fraction: see ``request_pool``; None keeps the workload's own mix.
        workload_options: the workload's options (TPC-C ``warehouses`` is per node here, see
            ``cluster_workload_options``).
        seconds: the measured window; ``warmup_s`` runs before it.
        inflight: calls outstanding per node.
        epoch_ms: close an epoch after this long (``EPOCH_MS_DEFAULT``); it also closes at
            ``inflight // 4`` calls.
        protocol: the nodes' concurrency control (a key of ``dgcc.net.servers.SERVERS``).
        durable: logging on every node (``ClusterConfig.data_dir`` in the run's temp folder):
            calls are answered only once they are durable.
        seed: data and request seed.
        check: after the window, once every client stopped, check the workload's state
            invariants over the union of the nodes' rows (``local_cluster.check``); the
            record's ``violations`` lists what failed ([] when consistent).
    """

    workload: str
    nodes: int
    distributed_fraction: float | None = None
    workload_options: dict[str, Any] = field(default_factory=dict)
    seconds: float = 5.0
    warmup_s: float = 1.0
    inflight: int = 400
    epoch_ms: float = EPOCH_MS_DEFAULT
    seed: int = 1
    protocol: str = "dgcc"
    durable: bool = False
    check: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ConfigError(f"nodes must be an int >= 1, got {self.nodes!r}")
        if not 0 < self.seconds <= 3600:
            raise ConfigError(f"seconds must be in (0, 3600], got {self.seconds!r}")
        if not 0 <= self.warmup_s <= 3600:  # (NaN fails too)
            raise ConfigError(f"warmup_s must be in [0, 3600], got {self.warmup_s!r}")
        if not 1 <= self.inflight <= 100_000:
            raise ConfigError(f"inflight must be in 1..100000, got {self.inflight!r}")
        fraction = self.distributed_fraction
        if fraction is not None and not 0 <= fraction <= 1:
            raise ConfigError(f"distributed_fraction must be in [0, 1], got {fraction!r}")
        if fraction is not None and self.workload not in _POOLS:
            raise ConfigError(
                f"a distributed fraction needs a built-in workload ({', '.join(_POOLS)}); "
                f"{self.workload!r} runs the mix of its own requests()"
            )


SNAPSHOT_AT = "snapshot/wall_s"


def _snapshot(config: ClusterConfig) -> dict[str, float]:
    from dgcc.local_cluster import status

    total: dict[str, float] = host_ticks()  # (the host's, once: not summed over nodes)
    asked_s = time.time()
    for entry in status(config, timeout_s=30):
        if "error" in entry and "ready" not in entry:
            raise ConfigError(f"node {entry['id']} is down: {entry['error']}")
        for key, value in entry.items():
            if "/" in key:
                total[key] = total.get(key, 0) + value
    # when the nodes were read: the middle of the status round trip (node CPU rates divide
    # by the time between two snapshots, not by the clients' window they straddle)
    total[SNAPSHOT_AT] = (asked_s + time.time()) / 2
    return total


def bench_cluster_config(bench: ClusterBenchConfig, directory: Path | None) -> ClusterConfig:
    """The loopback cluster ``bench`` runs (logging in ``directory/wal`` when durable); a
    ConfigError names a setting it cannot take, before anything starts."""
    config = local_config(
        bench.nodes,
        workload=bench.workload,
        workload_options=cluster_workload_options(
            bench.workload, bench.workload_options, bench.nodes
        ),
        epoch_ms=bench.epoch_ms,
        epoch_calls_max=max(1, bench.inflight // 4),
        seed=bench.seed,
        protocol=bench.protocol,
        data_dir=str(directory / "wal") if bench.durable and directory is not None else None,
    )
    check_pool(config, bench.distributed_fraction)
    return config


def run_bench(
    bench: ClusterBenchConfig, progress: Callable[[str, float], None] | None = None
) -> dict[str, Any]:
    """Start the cluster and clients, measure one window; the result record."""
    with tempfile.TemporaryDirectory(prefix="dgcc_bench_") as directory:
        config = bench_cluster_config(bench, Path(directory))
        if progress:
            progress("loading", 0.0)
        with start_local(config, Path(directory)) as cluster:
            record = _measure(bench, cluster.config, Path(directory), progress)
    return record


def _measure(bench, config, directory: Path, progress) -> dict[str, Any]:
    processes: list[subprocess.Popen] = []
    try:
        return _measure_with(bench, config, directory, progress, processes)
    except BaseException:  # a failed client, Ctrl-C or SIGTERM: no client outlives the run
        for process in processes:
            process.kill()
            process.wait()
        raise


def _measure_with(bench, config, directory: Path, progress, processes: list) -> dict[str, Any]:
    """``_measure``, its client processes added to ``processes`` as they start."""
    outs = []
    for node in range(bench.nodes):
        out = directory / f"client{node}.json"
        outs.append(out)
        command = [sys.executable, "-m", "dgcc.net.loadgen", "--config"]
        command += [str(directory / "cluster.json"), "--node", str(node)]
        command += ["--inflight", str(bench.inflight), "--seed", str(bench.seed), "--out", str(out)]
        if bench.distributed_fraction is not None:
            command += ["--fraction", str(bench.distributed_fraction)]
        spawn_into(processes, command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    wait_ready_lines(processes, CLIENT_EXIT_TIMEOUT_S)  # pools built, connections open
    start_s = time.time()
    measure_from = start_s + bench.warmup_s
    until = measure_from + bench.seconds
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(f"{measure_from} {until}\n")
        process.stdin.close()
    _wait_until(measure_from, progress, "warm-up", start_s)
    before = _snapshot(config)
    _wait_until(until, progress, "measure", measure_from)
    after = _snapshot(config)
    if progress:  # the clients wait for their calls in flight (2PC retries can take a while)
        progress("draining calls in flight", bench.warmup_s + bench.seconds)
    for process in processes:
        code = process.wait(timeout=CLIENT_EXIT_TIMEOUT_S + 30)  # (its own drain wait, then)
        if code != 0:  # (``_measure`` stops the others: a rerun may follow)
            ends = "; ".join(
                f"node {node}: {last_log_line(directory, node, 0)}" for node in range(bench.nodes)
            )
            raise ConfigError(
                f"client process {process.pid} failed with exit code {code} (node logs end: {ends})"
            )
    results = [json.loads(out.read_text()) for out in outs]
    record = _record(bench, config, results, before, after)
    if bench.check:  # the clients are done: the cluster goes quiet once its epochs drain
        if progress:
            progress("checking", bench.warmup_s + bench.seconds)
        record["violations"] = check(config)
    return record


def _wait_until(when_s: float, progress, phase: str, since_s: float) -> None:
    """Sleep to a point of the measurement clock (a window boundary, not a synchronisation)."""
    while (left_s := when_s - time.time()) > 0:
        if progress:
            progress(phase, max(0.0, time.time() - since_s))
        time.sleep(min(left_s, 0.25))


def _record(bench, config, results, before, after) -> dict[str, Any]:
    """The run's record. ``txn/abort_rate`` is the share of answered calls that logic-aborted;
    ``txn/gave_up_rate`` the share a 2PC node gave up on after its retries (not logic aborts)."""
    delta = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    counts = {k: sum(r["counts"].get(k, 0) for r in results) for k in COUNTED}
    latencies = sorted(itertools.chain.from_iterable(r["latencies_ms"] for r in results))
    committed = max(1, delta["txn/committed"])
    node_s = delta.get(SNAPSHOT_AT) or bench.seconds  # the nodes' counters cover this long
    node_cpu_s = delta["timing_s/cpu"] * bench.seconds / node_s  # over the clients' window
    metrics = {
        "txn/commits_per_s": counts["committed"] / bench.seconds,
        "txn/txns_per_s": sum(counts.values()) / bench.seconds,
        "txn/abort_rate": counts["aborted"] / max(1, sum(counts.values())),
        "txn/gave_up_rate": counts["gave_up"] / max(1, sum(counts.values())),
        "txn/gave_up": counts["gave_up"],
        "txn/cc_abort_rate": delta.get("txn/cc_aborts", 0) / max(1, delta.get("txn/attempts", 0)),
        "txn/errors": counts["error"],
        "txn/latency_ms_p50": percentile(latencies, 0.50, float("nan")),
        "txn/latency_ms_p99": percentile(latencies, 0.99, float("nan")),
        "txn/multi_node_fraction": delta["txn/multi_node"] / max(1, delta["txn/executed"]),
        "net/messages_per_commit": delta["net/peer_messages"] / committed,
        "net/bytes_per_commit": delta["net/peer_bytes"] / committed,
        "node/cpu_s_per_s": delta["timing_s/cpu"] / node_s / bench.nodes,
        "node/wait_inputs_s_per_s": delta["timing_s/wait_inputs"] / node_s / bench.nodes,
        "node/wait_values_s_per_s": delta["timing_s/wait_values"] / node_s / bench.nodes,
        "client/cpu_s_per_s": sum(r["cpu_s"] for r in results) / bench.seconds / bench.nodes,
        "txn/commits_per_node_cpu_s": counts["committed"] / max(1e-9, node_cpu_s),
        # the share of the window's CPU time the hypervisor gave other guests (NaN: not counted)
        "host/cpu_stolen": (
            delta["host/stolen_ticks"] / delta["host/ticks"]
            if "host/ticks" in before and delta.get("host/ticks", 0) > 0
            else float("nan")
        ),
    }
    from dgcc.bench import git_commit, host_facts

    return {
        "config": asdict(bench) | {"workload_options": config.workload_options},
        "metrics": metrics,
        "host": host_facts(),
        "git_commit": git_commit(),
    }


def summary_line(record: dict[str, Any]) -> str:
    """One parsable ``[summary] key=value ...`` line."""
    config, metrics = record["config"], record["metrics"]
    parts = [f"workload={config['workload']}", f"protocol={config['protocol']}"]
    parts.append(f"nodes={config['nodes']}")
    parts.append(f"distributed_fraction={config['distributed_fraction']}")
    parts += [f"{key}={value:.4g}" for key, value in metrics.items()]
    return "[summary] " + " ".join(parts)


if __name__ == "__main__":
    sys.exit(_client_main(sys.argv[1:]))
