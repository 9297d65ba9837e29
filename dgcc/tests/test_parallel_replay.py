"""Partitioned dependency replay: what the log records about partitions, and what replay does.

Goal: the cheap run-time record (one partition per transaction from the workload's routing)
says exactly what looking at every piece's keys says; a workload whose routing lies is caught
with invariants on; a child's changes rebuild its writes (rows and indexes) in the parent;
for any seed, batch size, partition count and worker count, recovery in worker processes
equals the serial replay of exactly the logged epochs; and recovery through the procedures'
replay entry points (TPC-C) or without them (Smallbank) equals it too, while a wrong entry
point is caught. Method: the drill's small TPC-C and a small Smallbank, planned
and run by DGCC in-process, the durable engine in a temp directory, and random write
sequences on a toy table.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgcc.api import Piece, PlannedTxn, Procedure, ProcedureRegistry
from dgcc.durable import DurableConfig, DurableEngine
from dgcc.errors import DgccError
from dgcc.protocols.dgcc import DgccProtocol, Graph
from dgcc.protocols.serial import SerialProtocol
from dgcc.storage import Database, Index, ReadView, Table
from dgcc.wal import command, dependency, parallel
from dgcc.wal.drill import DRILL_TPCC, batches, open_engine, reference_state
from dgcc.wal.recovery import recover
from dgcc.workloads.smallbank import SmallbankWorkload
from dgcc.workloads.tpcc import TpccWorkload
from dgcc.workloads.tpcc.schema import create_tables

SEED, BATCH, EPOCHS = 5, 40, 3


@pytest.fixture(scope="module")
def epochs() -> list[list[PlannedTxn]]:
    """The planned (and run) transactions of a few drill epochs."""
    workload = TpccWorkload(**DRILL_TPCC)
    protocol = DgccProtocol(workload.build(SEED), workload.registry())
    seen: list[list[PlannedTxn]] = []

    def keep(txns: list[PlannedTxn], graph: Graph) -> None:
        del graph
        seen.append(txns)

    protocol.graph_sink = keep
    for requests in batches(SEED, BATCH, 1, EPOCHS):
        protocol.run_batch(requests)
    return seen


@pytest.mark.parametrize("partitions", [1, 2, 3])
def test_routed_record_equals_the_per_piece_record(
    epochs: list[list[PlannedTxn]], partitions: int, invariants: None
) -> None:
    workload = TpccWorkload(**DRILL_TPCC)
    partition_of = lambda key: workload.partition_of(key, partitions)  # noqa: E731
    several = 0
    for txns in epochs:
        routed = parallel.record_partitions(txns, partition_of, {}, workload.route_keys)
        assert routed == parallel.record_partitions(txns, partition_of, {})
        several += len(routed[1])
    assert (several > 0) == (partitions > 1)  # remote stock and customers span partitions


def test_a_lying_route_is_caught_with_invariants_on(
    epochs: list[list[PlannedTxn]], invariants: None
) -> None:
    """Canary: routing every call to warehouse 1 alone contradicts the pieces' keys."""
    workload = TpccWorkload(**DRILL_TPCC)
    partition_of = lambda key: workload.partition_of(key, 2)  # noqa: E731
    lying = lambda procedure, params: [("warehouse", 1)]  # noqa: E731
    with pytest.raises(DgccError, match="routed to partition 0 touches partitions"):
        parallel.record_partitions(epochs[0], partition_of, {}, lying)


def test_a_transaction_that_plans_differently_is_refused(tmp_path: Path) -> None:
    engine = open_engine(tmp_path, "dependency", SEED)
    engine.run_epoch(batches(SEED, BATCH, 1, 1)[0])
    engine.close()
    workload = TpccWorkload(**DRILL_TPCC)
    payload = dependency.record_epoch([], [], Graph([], [], {}, [], 0))
    requests = command.pack_requests(batches(SEED, BATCH, 1, 1)[0][:1])
    payload.update(requests=requests, request_slots=[0], piece_counts=[99])
    with pytest.raises(DgccError, match=r"transaction 0 has \d+ pieces; the log has 99"):
        dependency.plan_replayed(engine.db, workload.registry(), payload, [0])


@settings(max_examples=6)
@given(
    seed=st.integers(0, 1000),
    batch=st.integers(5, 30),
    epochs=st.integers(1, 3),
    partitions=st.integers(1, 3),
    workers=st.integers(2, 3),
)
def test_partitioned_recovery_equals_serial_replay(
    seed: int, batch: int, epochs: int, partitions: int, workers: int
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="dgcc_parallel_"))
    try:
        engine = open_engine(directory, "dependency", seed, partitions=partitions)
        for requests in batches(seed, batch, 1, epochs):
            engine.run_epoch(requests)
        engine.close()
        registry = TpccWorkload(**DRILL_TPCC).registry()
        recovered = recover(directory, create_tables, registry, workers=workers)
        assert "timing_s/replay_worker_cpu_max" in recovered.timing_s  # the split really ran
        assert recovered.db.dump() == reference_state(seed, batch, epochs).dump()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _toy_db(rows: dict[int, dict]) -> Database:
    indexed = Table("t", indexes=(Index("by_g", lambda pk, row: row["g"], frozenset({"g"})),))
    plain = Table("u")
    db = Database((indexed, plain))
    for pk, row in rows.items():
        indexed.insert(pk, dict(row))
        plain.insert(pk, dict(row))
    return db


_ops = st.lists(
    st.tuples(st.sampled_from(["insert", "update", "delete"]), st.integers(0, 5),
              st.integers(0, 3)),
    max_size=40,
)  # fmt: skip


@given(_ops)
def test_a_childs_changes_rebuild_its_writes(ops: list[tuple[str, int, int]]) -> None:
    """Whatever a child inserts, updates and deletes, the parent that applies its changes
    ends with the child's rows and indexes."""
    start = {pk: {"g": 0, "n": pk} for pk in range(3)}
    child, parent = _toy_db(start), _toy_db(start)
    changes = parallel._Changes(child)
    for op, pk, number in ops:
        for table in child.tables.values():
            exists = pk in table.rows
            if op == "insert" and not exists:
                table.insert(pk, {"g": number, "n": number})
            elif op == "update" and exists:
                table.update(pk, {"g": number} if number % 2 else {"n": number})
            elif op == "delete" and exists:
                table.delete(pk)
    parallel._apply(parent, changes.take())
    assert parent.dump() == child.dump()
    for name in ("t",):
        index, mirror = child.tables[name].indexes["by_g"], parent.tables[name].indexes["by_g"]
        assert {g: index.lookup(g) for g in range(4)} == {g: mirror.lookup(g) for g in range(4)}


def test_two_workers_writing_one_index_entry_are_caught() -> None:
    """Canary for the partitioning contract: the parent changed an index entry the child
    touched too, so installing the child's entry would lose the parent's write."""
    start = {pk: {"g": 0, "n": pk} for pk in range(3)}
    child, parent = _toy_db(start), _toy_db(start)
    changes = parallel._Changes(child)
    child.tables["t"].insert(10, {"g": 1, "n": 10})
    parent.tables["t"].insert(11, {"g": 1, "n": 11})
    with pytest.raises(DgccError, match=r"index t\.by_g entry 1 was written by two replay"):
        parallel._apply(parent, changes.take())


@pytest.mark.parametrize(
    ("weights", "workers"),
    [([1] * 4, 2), ([1] * 16, 16), ([1] * 16, 2), ([9, 1, 1, 1], 2), ([5, 0, 3], 3), ([2], 4)],
)
def test_partition_groups_cover_every_partition_once(weights: list[int], workers: int) -> None:
    groups = parallel.partition_groups(weights, workers)
    assert len(groups) == workers
    assert sorted(part for group in groups for part in group) == list(range(len(weights)))
    if len(weights) == workers and len(set(weights)) == 1:  # one partition per worker
        assert all(len(group) == 1 for group in groups)


def test_partition_groups_give_the_parent_the_larger_share_to_cover_installing() -> None:
    """Children also ship, the parent also installs: of 4 equal partitions on 2 workers the
    parent takes 3, unless shipping cost nothing."""
    assert [len(group) for group in parallel.partition_groups([1] * 4, 2)] == [3, 1]
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        parallel.partition_groups([1], 0)


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_four_partition_recovery_equals_one_process(tmp_path: Path, workers: int) -> None:
    """Four warehouses logged as four partitions, recovered by up to ``workers`` processes,
    give the state a single process replays."""
    workload = TpccWorkload(**{**DRILL_TPCC, "warehouses": 4})
    stream = workload.requests(SEED)
    config = DurableConfig(directory=tmp_path, partitions=4)
    engine = DurableEngine(config, workload.registry(), create_tables,
                           lambda: workload.build(SEED), workload.partition_of,
                           workload.route_keys)  # fmt: skip
    for _ in range(2):
        engine.run_epoch([next(stream) for _ in range(40)])
    engine.close()
    serial = recover(tmp_path, create_tables, workload.registry(), workers=1, repair=False)
    split = recover(tmp_path, create_tables, workload.registry(), workers=workers, repair=False)
    assert split.timing_s["timing_s/replay_worker_cpu_sum"] > 0
    assert split.db.dump() == serial.db.dump()
    for name, table in serial.db.tables.items():
        for index_name, index in table.indexes.items():
            mirror = split.db.tables[name].indexes[index_name]
            assert index._entries == mirror._entries, f"{name}.{index_name} differs"


# -- replay entry points ------------------------------------------------------------------------

REDONE = ("new_order", "payment", "delivery")  # TPC-C procedures with a replay entry point


def _counting(registry: ProcedureRegistry, planned: list[str]) -> ProcedureRegistry:
    """``registry`` with every plan call recorded in ``planned`` (by procedure name)."""

    def counted(procedure: Procedure) -> Procedure:
        def plan(params: Mapping[str, Any], view: ReadView) -> Sequence[Piece]:
            planned.append(procedure.name)
            return procedure.plan(params, view)

        return dataclasses.replace(procedure, plan=plan)

    return ProcedureRegistry([counted(registry.get(name)) for name in registry.names()])


def _recover_tpcc(seed: int, batch: int, epochs: int, workers: int, registry: ProcedureRegistry):
    directory = Path(tempfile.mkdtemp(prefix="dgcc_redo_"))
    try:
        engine = open_engine(directory, "dependency", seed, partitions=2 if workers > 1 else 0)
        for requests in batches(seed, batch, 1, epochs):
            engine.run_epoch(requests)
        engine.close()
        return recover(directory, create_tables, registry, workers=workers).db
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@settings(max_examples=5)
@given(
    seed=st.integers(0, 1000),
    batch=st.integers(5, 30),
    epochs=st.integers(1, 3),
    workers=st.integers(1, 2),
)
def test_tpcc_recovery_through_replay_entry_points_equals_serial_replay(
    seed: int, batch: int, epochs: int, workers: int
) -> None:
    """Committed NewOrder, Payment and Delivery calls are redone by their procedures' replay
    entry points (never re-planned with one worker), and the state is the serial replay's."""
    planned: list[str] = []
    registry = _counting(TpccWorkload(**DRILL_TPCC).registry(), planned)
    assert all(registry.get(name).replay is not None for name in REDONE)
    recovered = _recover_tpcc(seed, batch, epochs, workers, registry)
    assert recovered.dump() == reference_state(seed, batch, epochs).dump()
    if workers == 1:
        assert not set(planned) & set(REDONE), f"re-planned {sorted(set(planned))}"


def test_a_wrong_replay_entry_point_is_caught() -> None:
    """Canary: a NewOrder replay that forgets the stock updates leaves a different state."""
    registry = TpccWorkload(**DRILL_TPCC).registry()
    right = registry.get("new_order")

    def forgetful(db: Database, params: Mapping[str, Any]) -> None:
        stock = db.tables["stock"]
        saved = {key: dict(stock.rows[key]) for key in stock.rows}
        assert right.replay is not None
        right.replay(db, params)
        stock.rows.update(saved)

    procedures = [registry.get(name) for name in registry.names() if name != "new_order"]
    wrong = ProcedureRegistry([*procedures, dataclasses.replace(right, replay=forgetful)])
    recovered = _recover_tpcc(SEED, BATCH, 1, 1, wrong)
    assert recovered.dump() != reference_state(SEED, BATCH, 1).dump()


@settings(max_examples=5)
@given(
    seed=st.integers(0, 1000),
    batch=st.integers(5, 40),
    epochs=st.integers(1, 3),
    workers=st.integers(1, 2),
)
def test_smallbank_recovery_without_entry_points_equals_serial_replay(
    seed: int, batch: int, epochs: int, workers: int
) -> None:
    """A workload whose procedures have no replay entry point is re-planned piece by piece
    (overdraft aborts included), in one process or split over partitions."""
    workload = SmallbankWorkload(accounts=40, hot_accounts=8, hot_fraction=0.5)
    stream = workload.requests(seed)
    epoch_batches = [[next(stream) for _ in range(batch)] for _ in range(epochs)]
    directory = Path(tempfile.mkdtemp(prefix="dgcc_smallbank_"))
    try:
        config = DurableConfig(directory=directory, partitions=2 if workers > 1 else 0)
        engine = DurableEngine(
            config,
            workload.registry(),
            workload.schema,
            lambda: workload.build(seed),
            workload.partition_of,
            workload.route_keys,
        )
        for requests in epoch_batches:
            engine.run_epoch(requests)
        engine.close()
        recovered = recover(directory, workload.schema, workload.registry(), workers=workers)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    reference = workload.build(seed)
    serial = SerialProtocol(reference, workload.registry())
    for requests in epoch_batches:
        serial.run_batch(requests)
    assert recovered.db.dump() == reference.dump()
    assert ("timing_s/replay_worker_cpu_max" in recovered.timing_s) == (workers > 1)
