"""Durability of the baseline protocols: the 2PC write-ahead log and Calvin's input log.

Goal: a 2PC node's log redoes exactly the committed branches (a local commit record, or a
prepare whose coordinator logged the decision) in log order, resolves its in-doubt branches once
and for all, groups the records of one loop turn into one flush, drops a torn tail and refuses
a block that fails its checksum mid-log with a one-line error; and a whole cluster of every
baseline protocol, killed with SIGKILL, restarts from its logs with nothing it answered lost.
Method: records written through ``TwoPhaseLog`` into a real directory, with hand-built images;
then real node processes over TCP with fsync on. Calvin goes through the DistDGCC crash trial
(SIGKILL mid-run, state equals the serial replay of the epochs every node made durable); the 2PC
clusters answer every call, their committed history (versions per key) is read back, every node
is killed at once, and the restarted state must equal the serial replay of that history in a
conflict order; a crash point right after a commit decision leaves participants in doubt, which
the restart must commit atomically. The logged bench section's bookkeeping runs on made-up
records.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import signal
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgcc.api import Status
from dgcc.cluster import local_config
from dgcc.errors import ConfigError
from dgcc.local_cluster import start_local
from dgcc.net import Client, call_each_in_order
from dgcc.net.client import AsyncClient
from dgcc.net.wire import NetError, decode, encode
from dgcc.protocols._history import CommittedTxn, serial_order
from dgcc.protocols.dist_placement import Router
from dgcc.protocols.serial import SerialProtocol
from dgcc.storage import Database, Table
from dgcc.wal.cluster_trials import ClusterDrill, merged_dump, random_trial
from dgcc.wal.crashpoints import CRASH_EXIT_CODE
from dgcc.wal.format import BlockKind, WalCorrupt, encode_block
from dgcc.wal.twopc_log import TwoPhaseLog, committed_txns, in_doubt, read_records, redo
from dgcc.wal.writer import list_segments, segment_name
from dgcc.workloads import get_workload

BENCH = Path(__file__).resolve().parents[1] / "bench"
A, B, C, D = ((0, seq, 0, 1) for seq in range(4))  # (coordinator, sequence, attempt, incarnation)
RECORDS = [
    ("prepare", A, {"t": {1: {"v": 1}}}),
    ("commit", A, None),
    ("prepare", B, {"t": {2: {"v": 2}}}),  # in doubt: its coordinator decided commit
    ("prepare", C, {"t": {3: {"v": 3}}}),  # in doubt: no decision, so aborted
    ("commit", D, {"t": {1: {"v": 10}, 4: None}}),  # one-phase: after A, deletes row 4
    ("decide", D),
]


def _db() -> Database:
    db = Database((Table("t"),))
    for pk in (1, 4, 5):
        db.tables["t"].insert(pk, {"v": -pk})
    return db


def _write(directory: Path, records: list[tuple]) -> TwoPhaseLog:
    """A fresh log with ``records`` appended in one loop turn; returns it (closed)."""
    log = TwoPhaseLog(directory)
    log.recover(_db(), set())

    async def run() -> None:
        lsns = [log.append(record) for record in records]
        await asyncio.gather(*(log.wait(lsn) for lsn in lsns))

    asyncio.run(run())
    log.close()
    return log


def test_redo_installs_committed_branches_in_log_order(tmp_path: Path) -> None:
    log = _write(tmp_path, RECORDS)
    assert log.stats["wal/flushes"] == 1  # one loop turn: one write, one fsync
    records, _, dropped = read_records(tmp_path)
    assert records[1:] == RECORDS and dropped == []
    assert in_doubt(records) == [B, C]
    committed = committed_txns(records, {B})
    assert committed == {A, B, D}
    db = _db()
    assert redo(db, records, committed) == 3
    assert db.dump() == {"t": {1: {"v": 10}, 2: {"v": 2}, 5: {"v": -5}}}


def test_restart_resolves_doubt_once_and_recovery_repeats(tmp_path: Path) -> None:
    _write(tmp_path, RECORDS)
    states = []
    for decided_elsewhere in ({B}, set()):  # the second restart needs no coordinator
        log = TwoPhaseLog(tmp_path)
        db = _db()
        log.recover(db, decided_elsewhere)
        assert log.decided == {D}  # kept: a peer restarting with this node may still ask
        log.close()
        states.append(db.dump())
        assert in_doubt(read_records(tmp_path)[0]) == []
    assert states[0] == states[1] == {"t": {1: {"v": 10}, 2: {"v": 2}, 5: {"v": -5}}}
    log = TwoPhaseLog(tmp_path)
    log.close()
    assert log.incarnation == 5  # after three start blocks and one flush: ids never repeat


def test_torn_tail_is_dropped_and_cut(tmp_path: Path) -> None:
    _write(tmp_path, RECORDS[:2])
    segment = list_segments(tmp_path)[-1][1]
    intact = segment.read_bytes()
    torn = encode_block(BlockKind.TWOPC, 3, RECORDS[2:])
    segment.write_bytes(intact + torn[: len(torn) // 2])  # the next flush, torn by a crash
    records, _, dropped = read_records(tmp_path)
    assert [r for r in records if r[0] != "start"] == RECORDS[:2]
    assert len(dropped) == 1 and "torn" in dropped[0]
    assert segment.read_bytes() == intact


def test_checksum_failure_mid_log_is_one_line_error(tmp_path: Path) -> None:
    _write(tmp_path, RECORDS)
    segment = list_segments(tmp_path)[-1][1]
    data = bytearray(segment.read_bytes())
    data[30] ^= 0xFF  # inside the first (start) block's payload; blocks follow it
    segment.write_bytes(bytes(data))
    with pytest.raises(
        WalCorrupt, match=r"block at offset 0 \(checksum .*no crash leaves"
    ) as error:
        read_records(tmp_path)
    assert "\n" not in str(error.value)


def test_2pc_cluster_refuses_checkpoints_it_would_not_take(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'occ' logs without checkpoints.*epochs = 2$"):
        local_config(
            2,
            workload="ycsb",
            workload_options={"records": 100},
            protocol="occ",
            data_dir=str(tmp_path),
            checkpoint_every_epochs=2,
        )


FLUSHES = [[("start",)], RECORDS[:2], RECORDS[2:4], RECORDS[4:]]


def _segment() -> tuple[bytes, list[int]]:
    """The flushes as consecutive blocks (as ``TwoPhaseLog`` writes them) and their offsets."""
    data, starts = b"", []
    for epoch, records in enumerate(FLUSHES, 1):
        starts.append(len(data))
        data += encode_block(BlockKind.TWOPC, epoch, records)
    return data, starts


@given(st.data())
def test_any_cut_keeps_the_whole_flushes_and_any_flip_before_the_last_is_refused(data) -> None:
    segment, starts = _segment()
    position = data.draw(st.integers(0, len(segment) - 1))
    flip = data.draw(st.booleans())
    damaged = bytearray(segment)
    if flip:
        damaged[position] ^= data.draw(st.integers(1, 255))
    else:
        del damaged[position:]
    hit = sum(start <= position for start in starts) - 1  # the block the damage is in
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        (directory / segment_name(1)).write_bytes(bytes(damaged))
        if flip and hit < len(FLUSHES) - 1:
            with pytest.raises(WalCorrupt, match="no crash leaves"):
                read_records(directory)
            return
        records, last_epoch, dropped = read_records(directory)
    assert records == [record for flush in FLUSHES[:hit] for record in flush]
    assert last_epoch == hit
    assert len(dropped) == (flip or position not in starts)  # a cut on a boundary tears nothing


def _bench_module() -> ModuleType:
    """``dgcc/bench/protocols_logged.py`` (it imports its neighbours ``protocols``, ``cluster``)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(
            "protocols_logged", BENCH / "protocols_logged.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def _run(protocol: str, inflight: int, rate: float) -> dict:
    metrics = {"txn/commits_per_s": rate, "txn/cc_abort_rate": 0.5}
    metrics |= {"txn/latency_ms_p50": 2.0, "txn/latency_ms_p99": 9.0}
    return {
        "config": {"protocol": protocol, "inflight": inflight, "seconds": 3.0},
        "metrics": metrics,
    }


def _pair(protocol: str, inflight: int, unlogged: list[float], logged: list[float]) -> dict:
    return {
        "unlogged": [_run(protocol, inflight, rate) for rate in unlogged],
        "logged": [_run(protocol, inflight, rate) for rate in logged],
    }


def test_logged_bench_section_shows_the_median_of_paired_rounds(tmp_path: Path) -> None:
    bench = _bench_module()
    pairs = {("tpcc-1wh", "dgcc"): _pair("dgcc", 400, [1000.0, 900.0, 1300.0], [800, 450, 900])}
    pairs[("tpcc-1wh", "occ")] = _pair("occ", 25, [500.0, 400.0, 450.0], [200.0, 100.0, 300.0])
    facts = {"cpus": 2, "load_average_1m_at_start": 0.5, "git_commit": "abc"}
    sweeps = {("tpcc-1wh", "dgcc"): {"sweep": [(400, 800.0)]}}
    bench.write(pairs, sweeps, facts, tmp_path, "given")
    text = (tmp_path / "protocols_logged.md").read_text()
    assert "swept calls in flight afresh (400, stopping once" in text  # what the sweeps tried
    # medians 1000 / 800 (overhead 20%; rounds 20%, 50%, 31%) and 450 / 200 (56%)
    assert "| tpcc-1wh | dgcc | 400 / 400 | 1,000 | 800 | 20% | 20% to 50% |" in text
    assert "| tpcc-1wh | occ | 25 / 25 | 450 | 200 | 56% | 33% to 75% |" in text
    # rounds: 800/200, 450/100, 900/300
    assert "DistDGCC / best baseline (occ) = **4.00x** (3.00x-4.50x round by round)" in text
    saved = json.loads((tmp_path / "protocols_logged.json").read_text())["pairs"]
    assert [(p["protocol"], len(p["logged"]), p["logged_sweep"]) for p in saved] == [
        ("dgcc", 3, [[400, 800.0]]),
        ("occ", 3, []),
    ]
    assert (tmp_path / "protocols_logged.png").stat().st_size > 0


def test_paired_rounds_run_each_protocol_without_and_with_its_log_in_turn(monkeypatch) -> None:
    bench = _bench_module()
    tried = []

    def make_bench(scenario, protocol, inflight, durable):
        tried.append((protocol, inflight, durable))
        return (protocol, inflight)

    monkeypatch.setattr(bench, "run_bench", lambda key: _run(key[0], key[1], 1.0))
    monkeypatch.setattr(bench, "summary_line", lambda record: "run")
    inflight = {("s", "dgcc"): (800, 400), ("s", "occ"): (25, 100)}
    pairs = bench.paired_rounds(inflight, make_bench, bench.Console(quiet=True), 2)
    first = [("dgcc", 800, False), ("dgcc", 400, True), ("occ", 25, False), ("occ", 100, True)]
    second = [("dgcc", 400, True), ("dgcc", 800, False), ("occ", 100, True), ("occ", 25, False)]
    assert tried == first + second  # a pair's two runs swap places each round
    assert [r["round"] for r in pairs[("s", "occ")]["logged"]] == [0, 1]


def test_logged_sweep_tunes_inflight_afresh_and_stops_past_the_peak(monkeypatch) -> None:
    bench = _bench_module()
    rates = {("dgcc", 25): 100.0, ("dgcc", 100): 300.0, ("dgcc", 400): 200.0}
    rates |= {("occ", 25): 50.0, ("occ", 100): 60.0, ("occ", 400): 70.0}
    tried = []

    def make_bench(scenario, protocol, inflight, durable):
        assert durable
        tried.append((protocol, inflight))
        return (protocol, inflight)

    monkeypatch.setattr(bench, "run_bench", lambda key: _run(key[0], key[1], rates[key]))
    monkeypatch.setattr(bench, "summary_line", lambda record: "run")
    keys = [("s", "dgcc"), ("s", "occ")]
    logged = bench.logged_sweep(keys, make_bench, bench.Console(quiet=True), (25, 100, 400))
    # dgcc fell below 80% of its best at 400: a fourth value would not have run either
    assert tried == [
        ("dgcc", 25),
        ("dgcc", 100),
        ("dgcc", 400),
        ("occ", 25),
        ("occ", 100),
        ("occ", 400),
    ]
    assert logged[("s", "dgcc")]["config"]["inflight"] == 100
    assert logged[("s", "dgcc")]["sweep"] == [(25, 100.0), (100, 300.0), (400, 200.0)]
    assert logged[("s", "occ")]["config"]["inflight"] == 400


def test_standalone_logged_bench_takes_the_sweeps_best_inflight(tmp_path: Path) -> None:
    bench = _bench_module()
    records = []
    for protocol in bench.protocols.PROTOCOLS:
        for inflight, rate in ((25, 10.0), (800, 20.0 if protocol == "dgcc" else 5.0)):
            run = _run(protocol, inflight, rate)
            run["config"]["distributed_fraction"] = bench.protocols.FRACTION
            records.append(run | {"scenario": "tpcc-1wh", "repeat": 0})
    path = tmp_path / "protocols.json"
    path.write_text(json.dumps({"records": records}))
    found = bench.sweep_inflights(path, ("tpcc-1wh", "ycsb-0.99"))
    assert found[("tpcc-1wh", "dgcc")] == 800 and found[("tpcc-1wh", "occ")] == 25
    assert bench.sweep_inflights(tmp_path / "absent.json", ("tpcc-1wh",)) == {}
    # no YCSB runs there: those take the defaults, and --inflight overrides both
    points, how = bench._unlogged_points(("tpcc-1wh", "ycsb-0.99"), found, {"calvin": 7})
    assert points[("tpcc-1wh", "dgcc")] == 800 and points[("tpcc-1wh", "calvin")] == 7
    assert points[("ycsb-0.99", "occ")] == bench.INFLIGHT["occ"]
    assert how.count(" or ") == 2 and "--inflight" in how and "default" in how


# -- whole clusters: real node processes, SIGKILL, restart from the logs --------------------

SEED = 3
TPCC = {
    "warehouses": 4,
    "items": 200,
    "customers_per_district": 30,
    "orders_per_district": 30,
    "remote_item_fraction": 0.2,
    "remote_payment_fraction": 0.3,
}
CALLS_PER_NODE = 120
WAVE = 30  # calls in flight per node: contended, without a retry storm that only costs time


def _wire(value):
    return decode(encode(("m", value)))[1]


@pytest.mark.integration
@pytest.mark.slow
def test_calvin_cluster_restarts_from_its_input_logs(tmp_path: Path) -> None:
    drill = ClusterDrill(seed=SEED, protocol="calvin")
    trial = random_trial(tmp_path, random.Random(SEED), drill, crash_recovery=True)
    assert 0 < trial.durable <= drill.epochs


def _history(requests, histories) -> list[CommittedTxn]:
    merged: dict[tuple[int, int], tuple[dict, dict]] = {}
    for entries in histories:
        for (origin, seq), _, _, reads, writes in entries:
            both = merged.setdefault((origin, seq), ({}, {}))
            both[0].update(reads)
            both[1].update(writes)
    return [
        CommittedTxn(origin, seq, requests[origin][seq], reads, writes)
        for (origin, seq), (reads, writes) in sorted(merged.items())
    ]


def _tpcc_cluster(tmp_path: Path, protocol: str):
    """Each node is called with calls whose data it owns (as the load generator calls), so
    no call is forwarded and each node's logged branch ids are its own calls' sequence."""
    workload = get_workload("tpcc", **TPCC)
    config = local_config(
        2,
        workload="tpcc",
        workload_options=TPCC,
        order_log=True,
        seed=SEED,
        protocol=protocol,
        data_dir=str(tmp_path / "data"),
    )
    router = Router(workload, config.placement())
    requests: list[list] = [[], []]
    for request in workload.requests(SEED):
        home = requests[min(router.route(request))]
        if len(home) < CALLS_PER_NODE:
            home.append(request)
        if all(len(calls) == CALLS_PER_NODE for calls in requests):
            return workload, requests, config
    raise AssertionError("unreachable: the request stream is endless")


def _kill_all(cluster) -> None:
    for process in cluster.processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)  # no clean stop: lazy records may be lost
    for process in cluster.processes:
        process.wait(timeout=30)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["no_wait", "wait_die", "occ"])
def test_2pc_cluster_killed_restarts_to_its_committed_history(tmp_path, protocol) -> None:
    workload, requests, config = _tpcc_cluster(tmp_path, protocol)
    cluster = start_local(config, tmp_path / "run", ready_timeout_s=60)
    try:
        addresses = [(n.host, n.port) for n in config.nodes]
        outcomes: list[list] = [[], []]
        for start in range(0, CALLS_PER_NODE, WAVE):  # waves, in order: the sequence numbers
            wave = [batch[start : start + WAVE] for batch in requests]  # stay the call indices
            for node, done in enumerate(asyncio.run(call_each_in_order(addresses, wave))):
                outcomes[node] += done
        histories, stats = [], []
        for node in config.nodes:
            with Client(node.host, node.port, timeout_s=60) as client:
                histories.append(client.order())
                stats.append(client.status())
    finally:
        _kill_all(cluster)
    assert all(o.status is not Status.ERROR for node in outcomes for o in node)
    assert all(s["wal/flushes"] > 0 and s["wal/records"] > s["wal/flushes"] for s in stats)
    assert sum(s["txn/multi_node"] for s in stats) > 0  # two-phase commits were logged
    history = _history(requests, histories)
    assert len(history) == sum(o.status is Status.COMMITTED for node in outcomes for o in node)
    db = workload.build(SEED)
    serial = SerialProtocol(db, workload.registry())
    for txn in serial_order(history):
        serial.run_batch([txn.request])
    restarted = start_local(config, tmp_path / "restart", ready_timeout_s=60)
    try:
        assert _wire(merged_dump(restarted)) == _wire(db.dump())
    finally:
        restarted.stop()
    assert workload.check_state(db) == []


async def _drive_until_a_node_dies(cluster, requests) -> set[tuple[int, int]]:
    """Every call pipelined in order; (node, index) of the committed answers. The first lost
    connection (a node died at its crash point) kills the others, which would stall."""
    nodes = cluster.config.nodes
    clients = [await AsyncClient.connect(n.host, n.port) for n in nodes]
    answered: set[tuple[int, int]] = set()

    async def one(node: int, index: int, request) -> None:
        try:
            outcome = await clients[node].call(request.procedure, request.params, timeout_s=60)
        except NetError:
            _kill_all(cluster)
            return
        if outcome.status is Status.COMMITTED:
            answered.add((node, index))

    try:
        calls = [one(n, i, r) for n, batch in enumerate(requests) for i, r in enumerate(batch)]
        await asyncio.gather(*calls)
    finally:
        for client in clients:
            await client.close()
    return answered


def _logs(data_dir: Path) -> list[list[tuple]]:
    return [read_records(data_dir / f"node{n}", repair=False)[0] for n in range(2)]


@pytest.mark.integration
@pytest.mark.slow
def test_2pc_crash_after_a_decision_commits_the_branches_in_doubt(tmp_path, monkeypatch) -> None:
    """Each node dies right after forcing its third commit decision, before sending commit."""
    workload, requests, config = _tpcc_cluster(tmp_path, "no_wait")
    monkeypatch.setenv("DGCC_CRASHPOINT", "twopc.after_decide:3")  # the nodes inherit it
    cluster = start_local(config, tmp_path / "run", ready_timeout_s=60)
    monkeypatch.delenv("DGCC_CRASHPOINT")
    answered = asyncio.run(_drive_until_a_node_dies(cluster, requests))
    _kill_all(cluster)
    assert CRASH_EXIT_CODE in [process.returncode for process in cluster.processes]
    before = _logs(tmp_path / "data")
    decided = [{r[1] for r in log if r[0] == "decide"} for log in before]
    doubtful = [in_doubt(log) for log in before]
    across = [txn for node in (0, 1) for txn in doubtful[node] if txn[0] != node]
    assert any(txn in decided[txn[0]] for txn in across), "no participant left in doubt"
    restarted = start_local(config, tmp_path / "restart", ready_timeout_s=60)
    try:
        merged = _wire(merged_dump(restarted))
    finally:
        restarted.stop()
    after = _logs(tmp_path / "data")
    assert [in_doubt(log) for log in after] == [[], []]
    for log in after:  # atomic: a prepared branch committed exactly when its coordinator decided
        committed = {r[1] for r in log if r[0] == "commit"}
        for txn in (r[1] for r in log if r[0] == "prepare"):
            assert (txn in committed) == (txn in decided[txn[0]]), f"branch {txn}"
    durable = {r[1][:2] for log in after for r in log if r[0] == "decide" or r[0:1] == ("commit",)}
    assert answered <= durable, f"answered but lost: {sorted(answered - durable)[:5]}"
    db = workload.schema()
    for table, rows in merged.items():
        for pk, row in rows.items():
            db.tables[table].insert(pk, dict(row))
    assert workload.check_state(db) == []
