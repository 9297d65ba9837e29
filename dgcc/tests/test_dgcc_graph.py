"""Unit tests of the DGCC graph builder and the protocol's options, stats and checks.

Method: hand-built transactions with known conflict keys; the edges are compared with the ones
the rules in ``dgcc.protocols.dgcc`` prescribe, and bad options must raise ConfigError.
"""

from __future__ import annotations

import pytest

from dgcc import (
    ConfigError,
    Database,
    Piece,
    Procedure,
    ProcedureRegistry,
    Status,
    Table,
    TxnRequest,
    get_protocol,
)
from dgcc.api import PlannedTxn
from dgcc.protocols import PROTOCOLS
from dgcc.protocols.dgcc import DgccProtocol, build_graph

pytestmark = pytest.mark.usefixtures("invariants")

PROC = Procedure("p", {}, lambda params, view: [])


def txn(index: int, *pieces: Piece) -> PlannedTxn:
    return PlannedTxn(index, PROC, {}, pieces)


def piece(name: str, reads=(), writes=(), after=(), may_abort=False) -> Piece:
    return Piece(name, lambda ctx: None, tuple(reads), tuple(writes), tuple(after), may_abort)


def edge_set(graph) -> set[tuple[int, int]]:
    return {(source, target) for source, targets in graph.successors.items() for target in targets}


def test_temporal_chain_per_key() -> None:
    graph = build_graph(
        [
            txn(0, piece("r", reads=["a"])),  # 0
            txn(1, piece("r", reads=["a"])),  # 1: read-read, no edge
            txn(2, piece("w", writes=["a"])),  # 2: after both reads
            txn(3, piece("r", reads=["a"])),  # 3: after the write
            txn(4, piece("w", writes=["a"])),  # 4: after write 2 and read 3
            txn(5, piece("w", writes=["b"])),  # 5: independent
        ]
    )
    assert edge_set(graph) == {(0, 2), (1, 2), (2, 3), (2, 4), (3, 4)}
    assert graph.in_degrees == [0, 0, 2, 1, 2, 0]
    assert graph.edges == 5
    assert graph.owners == [0, 1, 2, 3, 4, 5]


def test_logical_and_abort_edges_within_a_transaction() -> None:
    graph = build_graph(
        [
            txn(
                0,
                piece("check", reads=["x"], may_abort=True),  # 0
                piece("check2", reads=["y"], may_abort=True),  # 1: after check (abort order)
                piece("read", reads=["z"]),  # 2: reads need not wait for the decision
                piece("write", writes=["w"]),  # 3: after both deciders
                piece("use", writes=["v"], after=["read"]),  # 4: after read + deciders
            )
        ]
    )
    assert edge_set(graph) == {(0, 1), (0, 3), (1, 3), (2, 4), (0, 4), (1, 4)}


def test_piece_reading_and_writing_a_key_has_no_self_edge() -> None:
    graph = build_graph([txn(0, piece("rw", reads=["a"], writes=["a", "a"]))])
    assert graph.edges == 0
    assert graph.in_degrees == [0]


def test_duplicate_edges_are_counted_consistently() -> None:
    graph = build_graph(
        [txn(0, piece("w", writes=["a", "b"])), txn(1, piece("r", reads=["a", "b"]))]
    )
    assert graph.successors[0] == [1, 1]
    assert graph.in_degrees == [0, 2]


def test_graph_is_forward_only_and_linear_in_size() -> None:
    txns = [txn(i, piece("w", writes=[i % 7]), piece("r", reads=[(i + 1) % 7])) for i in range(500)]
    graph = build_graph(txns)
    assert all(s < t for s, t in edge_set(graph))
    assert len(graph.pieces) == 1000
    assert graph.edges < 4 * len(graph.pieces)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"executors": 0}, "executors must be in"),
        ({"executors": 2.5}, "executors must be an int"),
        ({"executors": True}, "executors must be an int"),
        ({"shuffle_seed": "x"}, "shuffle_seed"),
    ],
)
def test_bad_options_raise_config_error(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DgccProtocol(Database(), ProcedureRegistry(), **options)


def counter_setup() -> tuple[Database, ProcedureRegistry]:
    db = Database((Table("c"),))
    db["c"].insert(0, {"n": 0})

    def plan(params, view):
        def bump(ctx):
            value = ctx.get("c", 0)["n"] + params["by"]
            ctx.update("c", 0, {"n": value})
            return value

        def sneaky_abort(ctx):
            ctx.abort("not declared as may_abort")

        pieces = [Piece("bump", bump, writes=(("c", 0),))]
        if params["by"] < 0:
            pieces.insert(0, Piece("x", sneaky_abort))
        return pieces

    return db, ProcedureRegistry([Procedure("bump", {"by": int}, plan)])


def test_epochs_chain_and_stats_accumulate() -> None:
    db, registry = counter_setup()
    engine = get_protocol("dgcc")(db, registry, executors=2)
    for _ in range(3):
        outcomes = engine.run_batch([TxnRequest("bump", {"by": 1}), TxnRequest("bump", {"by": 2})])
    assert [o.result for o in outcomes] == [{"bump": 7}, {"bump": 9}]
    assert db["c"].rows[0]["n"] == 9
    assert engine.stats["dgcc/batches"] == 3
    assert engine.stats["dgcc/pieces"] == 6
    assert engine.stats["dgcc/edges"] == 3  # one write->write edge per batch
    assert all(
        engine.stats[f"timing_s/{phase}"] > 0 for phase in ("plan", "build_graph", "execute")
    )


def test_bad_requests_become_errors_and_the_engine_goes_on() -> None:
    db, registry = counter_setup()
    engine = get_protocol("dgcc")(db, registry)
    batch = [TxnRequest("nope", {}), TxnRequest("bump", {"by": "1"}), 42, TxnRequest("bump", {})]
    batch.append(TxnRequest("bump", {"by": 5}))
    outcomes = engine.run_batch(batch)
    assert [o.status for o in outcomes] == [Status.ERROR] * 4 + [Status.COMMITTED]
    assert "unknown procedure 'nope'" in outcomes[0].reason
    assert "'by' must be int" in outcomes[1].reason
    assert "malformed request 42" in outcomes[2].reason
    assert engine.run_batch([]) == []
    assert db["c"].rows[0]["n"] == 5


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_abort_from_a_piece_without_may_abort_fails_its_call_alone(name: str) -> None:
    # No protocol orders other pieces after an undeclared abort, so it cannot be a clean
    # ABORTED; it once tripped an assertion that stopped a cluster node.
    db, registry = counter_setup()
    engine = get_protocol(name)(db, registry)
    bad, good = engine.run_batch([TxnRequest("bump", {"by": -1}), TxnRequest("bump", {"by": 2})])
    assert bad.status is Status.ERROR
    assert bad.reason == (
        "bump.x aborted (not declared as may_abort) but is not declared may_abort=True: only "
        "a piece so declared may abort"
    )
    assert good.status is Status.COMMITTED


def test_checked_runner_catches_a_piece_run_twice() -> None:
    from dgcc.api import PieceContext
    from dgcc.protocols.dgcc import _checked_runner

    planned = txn(0, piece("a"))
    ctx = PieceContext(Database(), planned)
    run = _checked_runner()
    run(ctx, planned, planned.pieces[0])
    with pytest.raises(AssertionError, match="ran twice"):
        run(ctx, planned, planned.pieces[0])


@pytest.mark.parametrize(
    ("options", "serial_order"),
    [({}, True), ({"executors": 3}, False), ({"shuffle_seed": 1}, False)],
)
def test_execution_orders(options: dict, serial_order: bool) -> None:
    trace: list[tuple[int, int]] = []

    def plan(params, view):
        def step(position):
            return lambda ctx: trace.append((params["txn"], position))

        key = ("k", params["txn"] % 2)
        return [Piece(f"s{i}", step(i), writes=(key,) if i == 0 else ()) for i in range(3)]

    engine = get_protocol("dgcc")(
        Database(), ProcedureRegistry([Procedure("t", {"txn": int}, plan)]), **options
    )
    engine.run_batch([TxnRequest("t", {"txn": i}) for i in range(6)])
    expected = [(t, i) for t in range(6) for i in range(3)]
    assert sorted(trace) == expected
    assert (trace == expected) is serial_order
