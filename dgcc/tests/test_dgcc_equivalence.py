"""DGCC equals the serial executor: the property the whole protocol rests on.

Method: hypothesis generates a random toy database and batches of random "programs" (reads,
writes, read-modify-writes, logic aborts, inserts, deletes, index lookups and scans, plan-time
reconnaissance, pieces passing values along logical edges) with bad requests mixed in. Each
batch runs under the serial oracle and under DGCC with several executor counts and random
topological orders; every outcome and the state after every batch must be equal. A canary runs
the same property against a graph builder with its read->write edges removed and must fail.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from dgcc import (
    BadParams,
    Database,
    Index,
    Piece,
    PieceContext,
    Procedure,
    ProcedureRegistry,
    Table,
    TxnRequest,
    get_protocol,
)
from dgcc.storage import ReadView

pytestmark = pytest.mark.usefixtures("invariants")

KEYS = 6
GROUPS = 3


def build_toy_db(seed: int) -> Database:
    rng = random.Random(seed)
    kv = Table("kv")
    items = Table(
        "items",
        conflict_key=lambda pk: ("items", pk[0]),
        indexes=(Index("by_grp", lambda pk, row: pk[0], fields=frozenset()),),
        index_conflict_key=lambda index, grp: ("items", grp),
    )
    for key in range(KEYS):
        kv.insert(key, {"val": rng.randrange(11)})
    for grp in range(GROUPS):
        for n in range(rng.randrange(4)):
            items.insert((grp, n), {"val": rng.randrange(11)})
    return Database((kv, items))


# -- the toy procedure: a list of ops, one piece each ------------------------------------------


def _kv(key: int) -> tuple[str, int]:
    return ("kv", key)


def _items(grp: int) -> tuple[str, int]:
    return ("items", grp)


def _op_piece(name: str, op: list, view: ReadView, position: int) -> Piece:
    kind, args = op[0], op[1:]
    if kind == "check":
        key, threshold = args

        def check(ctx: PieceContext) -> int:
            value = ctx.get("kv", key)["val"]
            if value < threshold:
                ctx.abort(f"kv {key} below {threshold}")
            return value

        return Piece(name, check, reads=(_kv(key),), may_abort=True)
    if kind == "read":
        (key,) = args
        return Piece(name, lambda ctx: ctx.get("kv", key)["val"], reads=(_kv(key),))
    if kind == "write":
        key, value = args
        return Piece(name, lambda ctx: ctx.update("kv", key, {"val": value}), writes=(_kv(key),))
    if kind == "rmw":
        key, delta = args

        def rmw(ctx: PieceContext) -> int:
            value = ctx.get("kv", key)["val"] + delta
            ctx.update("kv", key, {"val": value})
            return value

        return Piece(name, rmw, writes=(_kv(key),))
    if kind == "move":
        source, target = args

        def move(ctx: PieceContext) -> int:
            value = ctx.get("kv", target)["val"] + ctx.get("kv", source)["val"]
            ctx.update("kv", target, {"val": value})
            return value

        return Piece(name, move, reads=(_kv(source),), writes=(_kv(target),))
    if kind == "use":
        key, earlier = args
        if not 0 <= earlier < position:
            raise BadParams(f"prog: op {position} uses a later or missing piece {earlier}")
        source = f"p{earlier}"

        def use(ctx: PieceContext) -> int:
            given_value = ctx.input(source)
            value = ctx.get("kv", key)["val"] + (given_value if isinstance(given_value, int) else 1)
            ctx.update("kv", key, {"val": value})
            return value

        return Piece(name, use, writes=(_kv(key),), after=(source,))
    return _items_piece(name, kind, args, view)


def _items_piece(name: str, kind: str, args: list, view: ReadView) -> Piece:
    grp = args[0]
    if kind == "insert":

        def insert(ctx: PieceContext) -> tuple:
            last = ctx.last("items", "by_grp", grp)
            pk = (grp, 0 if last is None else last[1] + 1)
            ctx.insert("items", pk, {"val": args[1]})
            return pk

        return Piece(name, insert, writes=(_items(grp),))
    if kind == "delete":

        def delete(ctx: PieceContext) -> tuple | None:
            pk = ctx.first("items", "by_grp", grp)
            if pk is not None:
                ctx.delete("items", pk)
            return pk

        return Piece(name, delete, writes=(_items(grp),))
    if kind == "sum":

        def total(ctx: PieceContext) -> int:
            pks = ctx.lookup("items", "by_grp", grp)
            return sum(ctx.get("items", pk)["val"] for pk in pks)

        return Piece(name, total, reads=(_items(grp),))
    if kind == "bump":

        def bump(ctx: PieceContext) -> int:
            pks = ctx.lookup("items", "by_grp", grp)
            for pk in pks:
                ctx.update("items", pk, {"val": ctx.get("items", pk)["val"] + args[1]})
            return len(pks)

        return Piece(name, bump, writes=(_items(grp),))
    if kind == "recon":
        pk = view.last("items", "by_grp", grp)  # reconnaissance at plan time

        def recon(ctx: PieceContext) -> Any:
            row = None if pk is None else ctx.get("items", pk)
            return None if row is None else row["val"]

        return Piece(name, recon, reads=(_items(grp),))
    raise BadParams(f"prog: unknown op kind {kind!r}")


ARITY = {"check": 2, "read": 1, "write": 2, "rmw": 2, "move": 2, "use": 2}
ARITY |= {"insert": 2, "delete": 1, "sum": 1, "bump": 2, "recon": 1}


def plan_prog(params: Mapping[str, Any], view: ReadView) -> list[Piece]:
    pieces: list[Piece] = []
    wrote = False
    for position, op in enumerate(params["ops"]):
        if not isinstance(op, list) or not op or op[0] not in ARITY or len(op) != ARITY[op[0]] + 1:
            raise BadParams(f"prog: malformed op {op!r}")
        if not all(isinstance(arg, int) and not isinstance(arg, bool) for arg in op[1:]):
            raise BadParams(f"prog: op arguments must be ints: {op!r}")
        if op[0] == "check" and wrote:
            raise BadParams(f"prog: check after a write: {op!r}")
        piece = _op_piece(f"p{position}", op, view, position)
        wrote = wrote or bool(piece.writes)
        pieces.append(piece)
    return pieces


REGISTRY = ProcedureRegistry([Procedure("prog", {"ops": list}, plan_prog)])

# -- strategies ---------------------------------------------------------------------------------

keys = st.integers(0, KEYS - 1)
groups = st.integers(0, GROUPS - 1)
small = st.integers(-3, 6)
body_ops = st.one_of(
    st.tuples(st.just("read"), keys),
    st.tuples(st.just("write"), keys, small),
    st.tuples(st.just("rmw"), keys, small),
    st.tuples(st.just("move"), keys, keys),
    st.tuples(st.just("use"), keys, st.integers(0, 8)),
    st.tuples(st.just("insert"), groups, small),
    st.tuples(st.just("delete"), groups),
    st.tuples(st.just("sum"), groups),
    st.tuples(st.just("bump"), groups, small),
    st.tuples(st.just("recon"), groups),
)
check_ops = st.tuples(st.just("check"), keys, st.integers(0, 12))


@st.composite
def prog_requests(draw) -> TxnRequest:
    ops = [list(op) for op in draw(st.lists(check_ops, max_size=2))]
    for op in draw(st.lists(body_ops, min_size=1, max_size=5)):
        op = list(op)
        if op[0] == "use":
            op[2] = op[2] % len(ops) if ops else 0
            if not ops:
                op = ["read", op[1]]
        ops.append(op)
    return TxnRequest("prog", {"ops": ops})


bad_requests = st.sampled_from(
    [
        TxnRequest("nope", {}),
        TxnRequest("prog", {"ops": "not a list"}),
        TxnRequest("prog", {}),
        TxnRequest("prog", {"ops": [["read", 1]], "extra": 1}),
        TxnRequest("prog", {"ops": [["frobnicate", 1]]}),
        TxnRequest("prog", {"ops": [["read", "x"]]}),
        TxnRequest("prog", {"ops": [["rmw", 0, 1], ["check", 0, 3]]}),
        TxnRequest("prog", {"ops": [["use", 0, 5]]}),
        "garbage",
        None,
    ]
)
batches = st.lists(
    st.one_of(prog_requests(), prog_requests(), prog_requests(), bad_requests), max_size=25
)
cases = st.fixed_dictionaries(
    {
        "db_seed": st.integers(0, 2**16),
        "batches": st.lists(batches, min_size=1, max_size=3),
        "executors": st.integers(2, 5),
        "shuffle_seed": st.integers(0, 2**16),
    }
)


def assert_same_as_serial(case: dict, *, read_write_edges: bool = True) -> None:
    serial_db = build_toy_db(case["db_seed"])
    serial = get_protocol("serial")(serial_db, REGISTRY)
    variants = [
        {},
        {"executors": case["executors"]},
        {"executors": case["executors"], "shuffle_seed": case["shuffle_seed"]},
        {"shuffle_seed": case["shuffle_seed"] + 1},
    ]
    engines = []
    for options in variants:
        db = build_toy_db(case["db_seed"])
        engine = get_protocol("dgcc")(db, REGISTRY, **options)
        engine.read_write_edges = read_write_edges
        engines.append((options, db, engine))
    for epoch, batch in enumerate(case["batches"]):
        expected = serial.run_batch(batch)
        assert len(expected) == len(batch)
        for options, db, engine in engines:
            outcomes = engine.run_batch(batch)
            assert outcomes == expected, f"epoch {epoch}, dgcc {options}: outcomes differ"
            assert db.dump() == serial_db.dump(), f"epoch {epoch}, dgcc {options}: state differs"


def equivalence_property(*, read_write_edges: bool, phases=tuple(Phase)):
    @settings(phases=phases, max_examples=settings.default.max_examples * 10)
    @given(case=cases)
    def check(case: dict) -> None:
        assert_same_as_serial(case, read_write_edges=read_write_edges)

    return check


def test_dgcc_equals_serial_on_random_batches() -> None:
    equivalence_property(read_write_edges=True)()


def test_canary_broken_graph_is_caught() -> None:
    # Same property, planted bug: reads no longer hold back later writes of their key.
    broken = equivalence_property(
        read_write_edges=False, phases=(Phase.explicit, Phase.reuse, Phase.generate)
    )
    with pytest.raises(AssertionError, match="differ"):
        broken()


def test_toy_procedure_aborts_errors_and_commits() -> None:
    # Guards the toy procedure itself: each status is reachable, so the property compares them.
    rng = random.Random(7)
    db = build_toy_db(3)
    engine = get_protocol("dgcc")(db, REGISTRY, executors=3, shuffle_seed=rng.randrange(99))
    batch = [
        TxnRequest("prog", {"ops": [["check", 0, 100], ["rmw", 0, 1]]}),
        TxnRequest("prog", {"ops": [["check", 0, 0], ["rmw", 0, 1], ["use", 1, 1]]}),
        TxnRequest("nope", {}),
        TxnRequest("prog", {"ops": [["insert", 0, 5], ["sum", 0], ["delete", 0], ["recon", 0]]}),
    ]
    statuses = [outcome.status.value for outcome in engine.run_batch(batch)]
    assert statuses == ["aborted", "committed", "error", "committed"]
