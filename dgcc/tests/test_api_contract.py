"""The piece contract of dgcc.api, exercised through the serial oracle.

Method: a two-account transfer procedure with a logic-abort check piece; each contract rule is
broken on purpose once and must be reported, and bad requests fail alone.
"""

import asyncio

import pytest

from dgcc import (
    Database,
    Piece,
    Procedure,
    ProcedureError,
    ProcedureRegistry,
    Status,
    Table,
    TxnRequest,
    debug,
    get_protocol,
)


def _bank(transfer_plan) -> tuple[Database, ProcedureRegistry]:
    db = Database((Table("acct"),))
    for account in range(3):
        db["acct"].insert(account, {"bal": 10})
    params = {"src": int, "dst": int, "amount": int}
    return db, ProcedureRegistry([Procedure("transfer", params, transfer_plan)])


def _good_plan(params, view):
    src, dst, amount = params["src"], params["dst"], params["amount"]

    def check(ctx):
        balance = ctx.get("acct", src)["bal"]
        if balance < amount:
            ctx.abort("overdraft")
        return balance

    def debit(ctx):
        ctx.update("acct", src, {"bal": ctx.input("check") - amount})

    def credit(ctx):
        ctx.update("acct", dst, {"bal": ctx.get("acct", dst)["bal"] + amount})

    return [
        Piece("check", check, reads=(("acct", src),), may_abort=True),
        Piece("debit", debit, writes=(("acct", src),), after=("check",)),
        Piece("credit", credit, writes=(("acct", dst),)),
    ]


def test_commit_abort_and_bad_requests_fail_alone():
    db, registry = _bank(_good_plan)
    serial = get_protocol("serial")(db, registry)
    batch = [
        TxnRequest("transfer", {"src": 0, "dst": 1, "amount": 5}),
        TxnRequest("transfer", {"src": 0, "dst": 1, "amount": 50}),
        TxnRequest("nope", {}),
        TxnRequest("transfer", {"src": "x", "dst": 1, "amount": 5}),
        "garbage",
        TxnRequest("transfer", {"src": 2, "dst": 0, "amount": 1}),
    ]
    with debug.invariants():
        outcomes = serial.run_batch(batch)
    assert [o.status for o in outcomes] == [
        Status.COMMITTED,
        Status.ABORTED,
        Status.ERROR,
        Status.ERROR,
        Status.ERROR,
        Status.COMMITTED,
    ]
    assert outcomes[1].reason == "overdraft"
    assert "unknown procedure 'nope'" in outcomes[2].reason
    assert "param 'src' must be int" in outcomes[3].reason
    assert "malformed request" in outcomes[4].reason
    assert db.dump()["acct"] == {0: {"bal": 6}, 1: {"bal": 15}, 2: {"bal": 9}}


def test_undeclared_write_is_reported():
    def plan(params, view):
        def sneaky(ctx):
            ctx.update("acct", params["dst"], {"bal": 0})

        return [Piece("sneaky", sneaky, writes=(("acct", params["src"]),))]

    db, registry = _bank(plan)
    with debug.invariants(), pytest.raises(ProcedureError, match="undeclared conflict key"):
        get_protocol("serial")(db, registry).run_batch(
            [TxnRequest("transfer", {"src": 0, "dst": 1, "amount": 1})]
        )


def test_in_place_mutation_of_a_row_fails_under_invariants():
    def plan(params, view):
        def mutate(ctx):
            ctx.get("acct", params["src"])["bal"] = 0

        return [Piece("mutate", mutate, writes=(("acct", params["src"]),))]

    db, registry = _bank(plan)
    with debug.invariants():
        outcome = get_protocol("serial")(db, registry).run_batch(
            [TxnRequest("transfer", {"src": 0, "dst": 1, "amount": 1})]
        )[0]
    assert outcome.status is Status.ERROR
    assert "TypeError" in outcome.reason
    assert db["acct"].get(0) == {"bal": 10}


def test_abort_after_write_is_a_contract_violation():
    def plan(params, view):
        def write_then_abort(ctx):
            ctx.update("acct", params["src"], {"bal": 0})
            ctx.abort("too late")

        return [Piece("w", write_then_abort, writes=(("acct", params["src"]),))]

    db, registry = _bank(plan)
    with debug.invariants(), pytest.raises(ProcedureError, match="after the transaction wrote"):
        get_protocol("serial")(db, registry).run_batch(
            [TxnRequest("transfer", {"src": 0, "dst": 1, "amount": 1})]
        )


def _bound_plan(params, view):
    """A transfer whose ``credit`` uses ``getter``, ``updater`` and ``inserter`` (the bound
    forms hot pieces use) after ``debit`` used the methods; ``credit`` also inserts ``dst`` +
    10 holding ``src``'s new balance, a key only ``wide`` declares."""
    src, dst, amount, wide = params["src"], params["dst"], params["amount"], params["wide"]

    def debit(ctx):
        ctx.update("acct", src, {"bal": ctx.get("acct", src)["bal"] - amount})  # the methods

    def credit(ctx):
        get, insert = ctx.getter("acct"), ctx.inserter("acct")
        ctx.updater("acct")(dst, {"bal": get(dst)["bal"] + amount})
        insert(dst + 10, {"bal": get(src)["bal"]})  # debit's write, wherever it is kept

    writes = (("acct", dst), ("acct", dst + 10)) if wide else (("acct", dst),)
    return [
        Piece("debit", debit, writes=(("acct", src),)),
        Piece("credit", credit, reads=(("acct", src),), writes=writes, after=("debit",)),
    ]


def _bound_bank() -> tuple[Database, ProcedureRegistry]:
    db, _ = _bank(_good_plan)
    params = {"src": int, "dst": int, "amount": int, "wide": bool}
    return db, ProcedureRegistry([Procedure("transfer", params, _bound_plan)])


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("protocol", ["serial", "dgcc", "occ", "no_wait"])
def test_bound_accessors_act_as_the_methods(protocol, checked):
    # The fast path (plain context, no checks) and the checked or overriding paths (OCC's
    # buffered writes, NO_WAIT's undo log) all leave the state the methods would.
    db, registry = _bound_bank()
    call = TxnRequest("transfer", {"src": 0, "dst": 1, "amount": 4, "wide": True})
    with debug.invariants(checked):
        outcomes = get_protocol(protocol)(db, registry).run_batch([call])
    assert [o.status for o in outcomes] == [Status.COMMITTED], outcomes
    assert db.dump()["acct"] == {0: {"bal": 6}, 1: {"bal": 14}, 2: {"bal": 10}, 11: {"bal": 6}}


def test_bound_accessors_check_declared_keys_under_invariants():
    db, registry = _bound_bank()
    call = TxnRequest("transfer", {"src": 0, "dst": 1, "amount": 4, "wide": False})
    serial = get_protocol("serial")(db, registry)
    with debug.invariants(), pytest.raises(ProcedureError, match=r"\('acct', 11\)"):
        serial.run_batch([call])


def test_getter_rows_are_read_only_under_invariants():
    db, registry = _bound_bank()
    seen = []

    def plan(params, view):
        def peek(ctx):
            row = ctx.getter("acct")(0)
            seen.append(row)
            row["bal"] = 0  # the contract forbids this; checks make it fail

        return [Piece("peek", peek, reads=(("acct", 0),))]

    registry.register(Procedure("peek", {}, plan))
    with debug.invariants():
        (outcome,) = get_protocol("serial")(db, registry).run_batch([TxnRequest("peek", {})])
    assert outcome.status is Status.ERROR and "does not support item assignment" in outcome.reason
    assert db.dump()["acct"][0] == {"bal": 10}


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"src": True, "dst": 1, "amount": 1}, "param 'src' must be int, got bool"),
        ({"src": 0, "dst": 1.0, "amount": 1}, "param 'dst' must be int, got float"),
        ({"src": 0, "dst": 1, "total": 1}, ": missing params ['amount'], unexpected params"),
        ({"src": 0, "dst": 1, "amount": 1, "x": 2}, "transfer: unexpected params ['x']"),
        ({"src": 0, "dst": 1, "amount": 1}, ""),
    ],
)
def test_param_types_are_exact_on_the_fast_path(params: dict, needle: str) -> None:
    # ``Procedure.signature`` answers good calls at once; anything else takes the full check.
    db, registry = _bank(_good_plan)
    (outcome,) = get_protocol("serial")(db, registry).run_batch([TxnRequest("transfer", params)])
    if needle:
        assert outcome.status is Status.ERROR and needle in outcome.reason, outcome
    else:
        assert outcome.status is Status.COMMITTED, outcome


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"src": 0, "dst": 1}, "transfer: missing params ['amount']"),
        ({"src": 0, "dst": 1, "amount": 1, "x": 2}, "transfer: unexpected params ['x']"),
        (
            {"dst": 1, "amount": 1, "y": 2},
            "transfer: missing params ['src'], unexpected params ['y']",
        ),
    ],
)
def test_a_bad_set_of_params_names_only_what_is_wrong(params: dict, reason: str) -> None:
    db, registry = _bank(_good_plan)
    (outcome,) = get_protocol("serial")(db, registry).run_batch([TxnRequest("transfer", params)])
    assert (outcome.status, outcome.reason) == (Status.ERROR, reason)


def test_a_sequence_param_takes_a_list_or_a_tuple() -> None:
    seen = []

    def plan(params, view):
        seen.append(params["items"])
        return []

    registry = ProcedureRegistry([Procedure("p", {"items": tuple, "n": float}, plan)])
    calls = [TxnRequest("p", {"items": [1], "n": 1}), TxnRequest("p", {"items": (2,), "n": 0.5})]
    outcomes = get_protocol("serial")(Database(), registry).run_batch(calls)
    assert [o.status for o in outcomes] == [Status.COMMITTED] * 2
    assert seen == [[1], (2,)]


def _grouped(declare_index: bool) -> tuple[Database, ProcedureRegistry]:
    """Table ``t`` with a secondary index ``by_g`` on field ``g`` (the default conflict keys:
    ``("t", pk)`` per row, ``("t", "by_g", g)`` per index entry). ``put`` inserts, moves
    (``g`` changes), touches (another field changes) or deletes a row."""
    from dgcc import Index

    db = Database((Table("t", indexes=(Index("by_g", lambda pk, row: row["g"], frozenset("g")),)),))
    db["t"].insert(1, {"g": 1, "n": 0})

    def plan(params, view):
        pk, op, g = params["pk"], params["op"], params["g"]
        row = view.get("t", pk)
        entries = {("t", "by_g", g)} | ({("t", "by_g", row["g"])} if row else set())

        def run(ctx):
            if op == "insert":
                ctx.insert("t", pk, {"g": g, "n": 0})
            elif op == "move":
                ctx.update("t", pk, {"g": g})
            elif op == "touch":
                ctx.update("t", pk, {"n": 1})
            else:
                ctx.delete("t", pk)

        writes = (("t", pk), *sorted(entries)) if declare_index else (("t", pk),)
        return [Piece("put", run, writes=writes)]

    return db, ProcedureRegistry([Procedure("put", {"pk": int, "op": str, "g": int}, plan)])


@pytest.mark.parametrize("protocol", ["serial", "dgcc", "no_wait", "occ", "calvin"])
@pytest.mark.parametrize("op", ["insert", "move", "delete"])
def test_a_write_that_changes_an_index_entry_must_declare_it(protocol, op):
    """A piece that looks ``by_g`` up declares the entry's key; a writer that did not declare
    it went unordered with the reader (DGCC could let a scan before an insert in the serial
    order see the inserted row). Under invariants the writer's undeclared entry is named."""
    pk = 5 if op == "insert" else 1
    request = TxnRequest("put", {"pk": pk, "op": op, "g": 2})
    db, registry = _grouped(declare_index=False)
    with (
        debug.invariants(),
        pytest.raises(ProcedureError, match=r"undeclared conflict key \('t', 'by_g', [12]\)"),
    ):
        get_protocol(protocol)(db, registry).run_batch([request])
    db, registry = _grouped(declare_index=True)
    with debug.invariants():
        outcome = get_protocol(protocol)(db, registry).run_batch([request])[0]
    assert outcome.status is Status.COMMITTED


def test_a_write_that_leaves_the_index_entries_alone_declares_none():
    db, registry = _grouped(declare_index=False)
    with debug.invariants():
        outcome = get_protocol("dgcc")(db, registry).run_batch(
            [TxnRequest("put", {"pk": 1, "op": "touch", "g": 1})]
        )[0]
    assert outcome.status is Status.COMMITTED and db["t"].get(1) == {"g": 1, "n": 1}


def _teams(plan) -> tuple[Database, ProcedureRegistry]:
    """Players (team, n) in the group key ("team", team); each its own key ("player", team, n)."""
    table = Table(
        "player",
        conflict_key=lambda pk: ("player", *pk),
        group_key=lambda pk: ("team", pk[0]),
    )
    db = Database((table,))
    for n in range(3):
        db["player"].insert((1, n), {"score": 0})
    return db, ProcedureRegistry([Procedure("score", {"n": int}, plan)])


@pytest.mark.parametrize(
    ("reads", "writes", "error"),
    [
        ((("team", 1),), (("player", 1, 0),), None),  # its own key, reading the group
        ((), (("team", 1),), None),  # the whole group
        ((), (("player", 1, 0),), "declared .* but not its group key \\('team', 1\\)"),
        ((("team", 1),), (), "undeclared conflict key \\('player', 1, 0\\)"),  # the group read
    ],
)
@pytest.mark.parametrize("protocol", ["serial", "dgcc", "no_wait", "occ", "calvin"])
def test_a_record_in_a_group_is_written_under_its_own_key_and_the_group_or_the_group(
    protocol, reads, writes, error
):
    def plan(params, view):
        def score(ctx):
            pk = (1, params["n"])
            ctx.update("player", pk, {"score": ctx.get("player", pk)["score"] + 1})

        return [Piece("score", score, reads=reads, writes=writes)]

    db, registry = _teams(plan)
    request = TxnRequest("score", {"n": 0})
    with debug.invariants():
        if error is None:
            [outcome] = get_protocol(protocol)(db, registry).run_batch([request])
            assert outcome.status is Status.COMMITTED and db["player"].get((1, 0)) == {"score": 1}
        else:
            with pytest.raises(ProcedureError, match=error):
                get_protocol(protocol)(db, registry).run_batch([request])


def test_cluster_occ_versions_the_group_of_a_member_it_wrote():
    """A whole-group writer read a member, then that member's own writer committed: the group
    writer's 2PC vote must fail (it validates the group key, which the member's commit
    versions), or its write would overwrite the member's (a lost update)."""
    from dgcc.api import plan_batch, run_piece
    from dgcc.net.servers.cc import OccCC

    def plan_one(params, view):
        def score(ctx):
            ctx.update("player", (1, 0), {"score": ctx.get("player", (1, 0))["score"] + 1})

        return [Piece("score", score, reads=(("team", 1),), writes=(("player", 1, 0),))]

    def plan_all(params, view):
        def bonus(ctx):
            ctx.update("player", (1, 0), {"score": ctx.get("player", (1, 0))["score"] + 10})

        return [Piece("bonus", bonus, writes=(("team", 1),))]

    db, _ = _teams(plan_one)
    registry = ProcedureRegistry([Procedure("one", {}, plan_one), Procedure("all", {}, plan_all)])
    cc = OccCC(db)
    whole, member = (
        cc.branch((n, 0, 0), txn)
        for n, txn in enumerate(
            plan_batch(registry, db, [TxnRequest(p, {}) for p in ("all", "one")])
        )
    )

    def run(branch) -> None:
        [piece] = branch.txn.pieces
        keys = dict.fromkeys(piece.reads, "S") | dict.fromkeys(piece.writes, "X")
        assert asyncio.run(cc.before_piece(branch, keys)) is None
        run_piece(branch.ctx, branch.txn, piece)

    run(whole)  # reads the member's score (0) into its buffer
    run(member)
    assert cc.prepare(member)
    assert ("team", 1) in cc.commit(member)
    assert not cc.prepare(whole)
    cc.abort(whole)
    assert db["player"].get((1, 0)) == {"score": 1}
