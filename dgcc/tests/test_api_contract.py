"""The piece contract of dgcc.api, exercised through the serial oracle.

Method: a two-account transfer procedure with a logic-abort check piece; each contract rule is
broken on purpose once and must be reported, and bad requests fail alone.
"""

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
