"""DistDGCC's piece schedule in one node's epoch run: what runs first, and when values leave.

A tiny two-node key-value workload (a fake beside these unit tests): ``move`` reads ``src`` and
writes ``dst`` from that read, so a transaction with ``src`` and ``dst`` on different nodes
sends one value message. Pieces other nodes wait on (and their local ancestors) run first and
their values leave before the local-only pieces run; pieces off every path from a remote value
run in serial order, the pending ones as values free them; and whatever the schedule, the state
equals the serial order.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgcc import debug
from dgcc.api import Piece, PieceContext, Procedure, ProcedureRegistry, TxnRequest
from dgcc.errors import ProcedureError
from dgcc.net.wire import decode, encode
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.protocols.dist_placement import Placement, Router, owned_rows
from dgcc.storage import Database, Table

KEYS = 20  # keys 0..9 live on node 0, 10..19 on node 1


class _KeyValue:
    """Rows ``kv[k] = {"v": k}``, range-partitioned over two nodes; ``ran`` logs each piece."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, int, str]] = []  # (src, dst, piece name) as pieces run

    def partition_of(self, key: Hashable, partitions: int) -> int:
        return key[1] * partitions // KEYS

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable]:
        return [("kv", params["src"]), ("kv", params["dst"])]  # bump: src is its guard

    def build(self) -> Database:
        db = Database((Table("kv"),))
        db["kv"].rows.update({k: {"v": k} for k in range(KEYS)})
        return db

    def registry(self) -> ProcedureRegistry:
        return ProcedureRegistry(
            [
                Procedure("move", {"src": int, "dst": int}, self._plan),
                Procedure("bump", {"src": int, "dst": int}, self._plan_bump),
            ]
        )

    def _plan(self, params: Mapping[str, Any], view: object) -> list[Piece]:
        src, dst, ran = params["src"], params["dst"], self.ran

        def take(ctx: PieceContext) -> int:
            ran.append((src, dst, "take"))
            return ctx.get("kv", src)["v"]

        def put(ctx: PieceContext) -> int:
            ran.append((src, dst, "put"))
            value = ctx.get("kv", dst)["v"] * 2 + ctx.input("take")
            ctx.update("kv", dst, {"v": value})
            return value

        return [
            Piece("take", take, reads=(("kv", src),)),
            Piece("put", put, reads=(("kv", dst),), writes=(("kv", dst),), after=("take",)),
        ]

    def _plan_bump(self, params: Mapping[str, Any], view: object) -> list[Piece]:
        """A check that may abort (``src`` a multiple of 3), a piece of its own that reads, and
        a write: the write waits for the check (an abort edge), the read for nothing."""
        src, dst, ran = params["src"], params["dst"], self.ran

        def check(ctx: PieceContext) -> None:
            ran.append((src, dst, "check"))
            if ctx.get("kv", src)["v"] % 3 == 0:
                ctx.abort("guard")

        def peek(ctx: PieceContext) -> int:
            ran.append((src, dst, "peek"))
            return ctx.get("kv", dst ^ 1)["v"]  # on the node of dst

        def add(ctx: PieceContext) -> int:
            ran.append((src, dst, "add"))
            value = ctx.get("kv", dst)["v"] + 1
            ctx.update("kv", dst, {"v": value})
            return value

        return [
            Piece("check", check, reads=(("kv", src),), may_abort=True),
            Piece("peek", peek, reads=(("kv", dst ^ 1),)),
            Piece("add", add, reads=(("kv", dst),), writes=(("kv", dst),)),
        ]


def _move(src: int, dst: int) -> TxnRequest:
    return TxnRequest("move", {"src": src, "dst": dst})


def _serial(requests: list[TxnRequest]) -> dict[int, int]:
    """The values after ``requests`` one by one from the loaded state."""
    state = {k: k for k in range(KEYS)}
    for request in requests:
        src, dst = request.params["src"], request.params["dst"]
        if request.procedure == "move":
            state[dst] = state[dst] * 2 + state[src]
        elif state[src] % 3:  # a bump whose guard holds
            state[dst] += 1
    return state


def _runs(workload: _KeyValue, batches: list[list[TxnRequest]]) -> tuple[list[EpochRun], list]:
    """Both nodes' runs of the epoch, and their databases."""
    router = Router(workload, Placement.round_robin(2))
    dbs = [workload.build() for _ in (0, 1)]
    runs = [EpochRun(n, dbs[n], workload.registry(), router, batches) for n in (0, 1)]
    return runs, dbs


def _wire(entries: Any) -> Any:
    return decode(encode(("values", entries)))[1]


def test_values_peers_wait_on_leave_before_the_local_only_pieces() -> None:
    local = [_move(12, 13), _move(13, 14), _move(15, 16)]  # node 1 only
    remote = _move(17, 3)  # node 1's read feeds node 0's write
    (node0, node1), _ = _runs(_KeyValue(), [[], [*local, remote]])
    assert node0.step(100) == 0 and not node0.has_ready  # its write waits for node 1's value
    assert node1.step(100) == 1  # the remote txn's read runs first, though it is last in order
    values = node1.take_outbox()
    assert list(values) == [0] and len(values[0]) == 1
    assert node1.remaining == 2 * len(local)  # the local-only pieces wait for the next slice
    node0.deliver(_wire(values[0]))
    assert node0.step(100) == 1 and node0.finished
    assert node1.step(100) == 2 * len(local) and node1.finished


def test_pieces_off_every_path_from_a_remote_value_run_first_in_serial_order() -> None:
    # Txn 0's put waits for node 1's take; txns 1 and 3 follow it through keys 1 and 2 (pending);
    # txn 2 has no path from it, so it runs at once, though it is later in the serial order.
    workload = _KeyValue()
    batch = [_move(15, 1), _move(1, 2), _move(6, 7), _move(2, 3)]
    (node0, node1), _ = _runs(workload, [batch, []])
    assert node0.step(100) == 2 and not node0.has_ready
    assert workload.ran == [(6, 7, "take"), (6, 7, "put")]
    assert node1.step(100) == 1 and node1.finished
    node0.deliver(_wire(node1.take_outbox()[0]))
    assert node0.step(100) == 5 and node0.finished
    assert workload.ran[3:] == [
        (15, 1, "put"),
        (1, 2, "take"),
        (1, 2, "put"),
        (2, 3, "take"),
        (2, 3, "put"),
    ]


@pytest.mark.parametrize("checked", [False, True])
def test_a_senders_ancestors_are_its_predecessors_and_their_transactions_earlier_pieces(
    checked,
) -> None:
    # Txn 1's take (key 4) feeds node 1's put, so it runs first, after txn 0's add (which writes
    # key 4) and every earlier piece of txn 0 (its check, and its peek, which has no path to the
    # take but must not run after the add: a call failing midway then leaves the same writes
    # live and in a replay). The rest runs with the local-only work, after the value left.
    workload = _KeyValue()
    bump = TxnRequest("bump", {"src": 1, "dst": 4})
    with debug.invariants(checked):
        (node0, _), _ = _runs(workload, [[bump, _move(4, 12), _move(6, 7)], []])
        assert node0.step(100) == 4 and node0.take_outbox()
        assert workload.ran == [(1, 4, "check"), (1, 4, "peek"), (1, 4, "add"), (4, 12, "take")]
        assert node0.step(100) == 2 and node0.finished
        assert workload.ran[4:] == [(6, 7, "take"), (6, 7, "put")]


@pytest.mark.parametrize("checked", [False, True])
def test_a_value_turns_into_the_value_a_peer_waits_for_before_local_work(checked: bool) -> None:
    # Node 0 -> node 1 -> node 0: txn 0's put on node 1 waits for node 0's take, and txn 1's
    # take on node 1 reads what that put writes and feeds node 0's put. Once node 0's value
    # arrives, node 1 runs both (pending, and a peer waits on them) ahead of its local-only moves.
    workload = _KeyValue()
    local = [_move(15, 16), _move(17, 18), _move(18, 19)]
    with debug.invariants(checked):
        (node0, node1), dbs = _runs(workload, [[_move(3, 12), _move(12, 4)], local])
        assert node1.step(1) == 1  # a local-only piece: no value has come yet
        assert node0.step(100) == 1  # txn 0's take, whose value leaves at once
        assert node0.step(100) == 0 and not node0.has_ready  # txn 1's put waits for node 1
        node1.deliver(_wire(node0.take_outbox()[1]))
        assert node1.step(100) == 2  # both pending pieces, then the value leaves
        assert workload.ran[2:] == [(3, 12, "put"), (12, 4, "take")]
        assert node1.remaining == 2 * len(local) - 1
        node0.deliver(_wire(node1.take_outbox()[0]))
        assert node0.step(100) == 1 and node0.finished
        assert node1.step(100) == 2 * len(local) - 1 and node1.finished
    assert dbs[1]["kv"].rows[12]["v"] == 12 * 2 + 3
    assert dbs[0]["kv"].rows[4]["v"] == 4 * 2 + dbs[1]["kv"].rows[12]["v"]


def test_once_values_come_pending_senders_and_their_ancestors_run_first() -> None:
    # On node 1, txn 0's put and txn 1's put wait for node 0's takes, and txn 2's take reads
    # what txn 1's put writes and feeds node 0. Once both values came, txn 1's put and txn 2's
    # take run and that value leaves before txn 0's put, though it is first in serial order.
    workload = _KeyValue()
    (node0, node1), dbs = _runs(workload, [[_move(1, 11), _move(2, 12), _move(12, 3)], []])
    assert node1.step(100) == 0 and not node1.has_ready
    assert node0.step(100) == 2  # both takes, whose values leave in one message
    node1.deliver(_wire(node0.take_outbox()[1]))
    assert node1.step(100) == 2
    assert workload.ran[2:] == [(2, 12, "put"), (12, 3, "take")]
    node0.deliver(_wire(node1.take_outbox()[0]))
    assert node1.step(100) == 1 and node1.finished
    assert workload.ran[4:] == [(1, 11, "put")]
    assert node0.step(100) == 1 and node0.finished
    assert dbs[0]["kv"].rows[3]["v"] == 3 * 2 + (12 * 2 + 2)


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (lambda good: [*good, (99, 0, None, None, None)], "unexpected value for txn 99 piece 0"),
        (lambda good: [*good, good[0][:4]], "a value entry of 4 fields, expected 5"),
        (lambda good: [*good, good[0]], "unexpected value"),  # the same entry twice
    ],
)
def test_a_message_with_a_bad_entry_applies_none_of_them(spoil: Any, problem: str) -> None:
    # A message with an entry that breaks the protocol is refused whole (the sender's link
    # ends): none of its entries is applied, so the same values sent again still apply.
    (node0, node1), _ = _runs(_KeyValue(), [[_move(15, 1)], []])
    assert node0.step(100) == 0 and not node0.has_ready
    assert node1.step(100) == 1
    entries = list(_wire(node1.take_outbox()[0]))
    with pytest.raises(ProcedureError, match=problem):  # a bad frame
        node0.deliver(spoil(entries))
    assert not node0.has_ready
    node0.deliver(entries)
    assert node0.step(100) == 1 and node0.finished


@pytest.mark.parametrize("checked", [False, True])
def test_an_epoch_without_cross_node_edges_runs_in_serial_order(checked: bool) -> None:
    # Nothing waits on or feeds another node: no graph (with checks on, one that is checked).
    workload = _KeyValue()
    with debug.invariants(checked):
        (run, _), dbs = _runs(workload, [[_move(1, 2), _move(6, 7), _move(2, 3)], []])
        assert run.has_ready
        assert run.step(3) == 3 and not run.finished and run.has_ready  # budgets hold
        assert run.step(100) == 3 and run.finished and not run.has_ready
        assert not run.take_outbox()
        reports = run.reports()
    assert workload.ran == [
        (1, 2, "take"),
        (1, 2, "put"),
        (6, 7, "take"),
        (6, 7, "put"),
        (2, 3, "take"),
        (2, 3, "put"),
    ]
    assert [entry[0] for entry in reports[0]] == [0, 1, 2]
    assert dbs[0]["kv"].rows[3]["v"] == 3 * 2 + (2 * 2 + 1)  # txn 2 saw txn 0's write
    with pytest.raises(ProcedureError, match="unexpected value"):
        run.deliver([(0, 0, 1, None, None)])


def test_schedule_leaves_the_serial_state() -> None:
    batches = [
        [_move(1, 12), _move(12, 2), _move(2, 3), _move(14, 15)],
        [_move(15, 4), _move(4, 16), _move(16, 17), _move(5, 6)],
    ]
    workload = _KeyValue()
    runs, dbs = _runs(workload, batches)
    while not all(run.finished for run in runs):
        for run in runs:
            run.step(3)
            for target, entries in run.take_outbox().items():
                runs[target].deliver(_wire(entries))
    expected = {k: k for k in range(KEYS)}
    for request in batches[0] + batches[1]:
        src, dst = request.params["src"], request.params["dst"]
        expected[dst] = expected[dst] * 2 + expected[src]
    state = {}
    for node, db in enumerate(dbs):
        owned = owned_rows(db, runs[node].router, node)["kv"]
        state.update({k: row["v"] for k, row in owned.items()})
    assert state == expected


_MOVES = st.lists(
    st.tuples(
        st.sampled_from(["move", "bump"]), st.integers(0, KEYS - 1), st.integers(0, KEYS - 1)
    ),
    max_size=12,
)


@given(
    batches=st.tuples(_MOVES, _MOVES),
    budgets=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    checked=st.booleans(),
)
def test_any_epoch_and_step_budgets_leave_the_serial_state(batches, budgets, checked) -> None:
    # Held pieces, senders' ancestors and the serial run mixed at random; with checks on,
    # every piece also checks the whole local graph before it runs.
    requests = [
        [TxnRequest(kind, {"src": src, "dst": dst}) for kind, src, dst in batch if src != dst]
        for batch in batches
    ]
    with debug.invariants(checked):
        runs, dbs = _runs(_KeyValue(), requests)
        turn = 0
        while not all(run.finished for run in runs):
            progressed = 0
            for run in runs:
                progressed += run.step(budgets[turn % len(budgets)])
                turn += 1
                for target, entries in run.take_outbox().items():
                    runs[target].deliver(_wire(entries))
                    progressed += 1
            assert progressed, "no piece ran and no value moved"
        for run in runs:
            run.reports()
    expected = _serial(requests[0] + requests[1])
    state = {}
    for node, db in enumerate(dbs):
        state.update(
            {k: row["v"] for k, row in owned_rows(db, runs[node].router, node)["kv"].items()}
        )
    assert state == expected


def test_an_abort_reason_that_is_not_text_travels_as_its_text() -> None:
    # A procedure's ctx.abort(404) crossed nodes as an int, which a value check now refuses:
    # every reason is text from where it is made, the same on every node and in the log.
    from dgcc.api import LogicAbort

    assert LogicAbort(404).reason == "404"
    assert LogicAbort(("no stock", 7)).reason == "('no stock', 7)"
