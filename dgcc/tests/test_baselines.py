"""The single-node baselines (2PL NO_WAIT, 2PL WAIT_DIE, OCC, Calvin) are correct.

Method: run a few batches of each workload's seeded stream at a small, contended scale with
invariant checks on. For the interleaving protocols, record the committed history (per conflict
key, the version each transaction read and wrote), check the conflict graph is acyclic, replay
the committed requests serially in the graph's topological order on a fresh copy of the initial
state, and require the same results and the same final state. Contention must actually cause
concurrency-control aborts, so the check is not vacuous, and the canary (OCC without
validation) must be caught. Calvin must equal the serial executor under shuffled ready orders.
"""

from __future__ import annotations

import itertools

import pytest

from dgcc import debug, get_protocol
from dgcc.api import (
    Outcome,
    Piece,
    PlannedTxn,
    Procedure,
    ProcedureRegistry,
    Status,
    TxnRequest,
    plan_batch,
)
from dgcc.errors import ConfigError
from dgcc.protocols._history import CommittedTxn, NotSerializable, replay
from dgcc.protocols._locking import UndoContext
from dgcc.storage import Database, Table
from dgcc.workloads import _load_builtin, get_workload

pytestmark = pytest.mark.usefixtures("invariants")

_load_builtin()

CONTENDED = {
    "tpcc": {
        "warehouses": 1,
        "items": 1000,
        "customers_per_district": 60,
        "orders_per_district": 60,
    },
    "ycsb": {"records": 200, "theta": 0.99, "read_ratio": 0.5},
    "smallbank": {"accounts": 100, "hot_accounts": 5, "hot_fraction": 0.8},
}
BATCHES = 3
BATCH_SIZE = 50
INTERLEAVING = ("no_wait", "wait_die", "occ")


def _run(workload_name: str, protocol: str, **options):
    workload = get_workload(workload_name, **CONTENDED[workload_name])
    db = workload.build(seed=5)
    engine = get_protocol(protocol)(db, workload.registry(), **options)
    stream = workload.requests(seed=6)
    batches, outcomes = [], []
    for _ in range(BATCHES):
        batch = list(itertools.islice(stream, BATCH_SIZE))
        batch_outcomes = engine.run_batch(batch)
        assert len(batch_outcomes) == len(batch)
        workload.observe(batch, batch_outcomes)
        batches.append(batch)
        outcomes.append(batch_outcomes)
    return workload, db, engine, batches, outcomes


def _replay(workload_name: str, engine, outcomes) -> dict:
    """Replay the committed history serially in conflict order; the final state."""
    workload = get_workload(workload_name, **CONTENDED[workload_name])
    db = workload.build(seed=5)
    replay(engine.history, db, workload.registry(), outcomes)
    return db.dump()


@pytest.mark.parametrize("workload_name", sorted(CONTENDED))
@pytest.mark.parametrize("protocol", INTERLEAVING)
def test_history_is_conflict_serializable(protocol: str, workload_name: str) -> None:
    workload, db, engine, _, outcomes = _run(
        workload_name, protocol, inflight=8, seed=3, record_history=True
    )
    assert workload.check(db) == []
    flat = [outcome for batch in outcomes for outcome in batch]
    assert not [o for o in flat if o.status is Status.ERROR]
    committed = sum(outcome.committed for outcome in flat)
    logic_aborts = sum(o.status is Status.ABORTED and not o.gave_up for o in flat)
    assert committed == engine.stats[f"{protocol}/commits"]
    assert [txn.aborted for txn in engine.history].count(False) == committed
    assert [txn.aborted for txn in engine.history].count(True) == logic_aborts
    assert _replay(workload_name, engine, outcomes) == db.dump()


@pytest.mark.parametrize("protocol", INTERLEAVING)
def test_contention_causes_cc_aborts_and_retries(protocol: str) -> None:
    _, _, engine, _, outcomes = _run("smallbank", protocol, inflight=16, seed=1)
    aborts = {k: v for k, v in engine.stats.items() if "/cc_aborts/" in k}
    assert sum(aborts.values()) > 0, f"{protocol}: no cc aborts under contention"
    assert engine.stats[f"{protocol}/retries"] == sum(aborts.values())
    assert engine.stats[f"{protocol}/gave_up"] == 0
    assert not [o for batch in outcomes for o in batch if o.gave_up]


def test_retry_budget_exhausted_gives_a_retryable_abort() -> None:
    workload, db, engine, _, outcomes = _run(
        "smallbank", "no_wait", inflight=16, seed=1, retries_max=0, record_history=True
    )
    gave_up = [o for batch in outcomes for o in batch if o.status is Status.ABORTED]
    assert gave_up and all(o.gave_up for o in gave_up)
    assert engine.stats["no_wait/gave_up"] == len(gave_up)
    assert workload.check(db) == []  # given-up transactions were fully undone
    assert _replay("smallbank", engine, outcomes) == db.dump()


@pytest.mark.parametrize("workload_name", ["smallbank", "ycsb"])
def test_canary_occ_without_validation_is_caught(workload_name: str) -> None:
    workload = get_workload(workload_name, **CONTENDED[workload_name])
    db = workload.build(seed=5)
    engine = get_protocol("occ")(db, workload.registry(), inflight=16, seed=1, record_history=True)
    engine.validate = False
    stream = workload.requests(seed=6)
    outcomes = [engine.run_batch(list(itertools.islice(stream, BATCH_SIZE))) for _ in range(2)]
    with pytest.raises(NotSerializable, match="cycle"):
        _replay(workload_name, engine, outcomes)


@pytest.mark.parametrize("workload_name", sorted(CONTENDED))
def test_calvin_equals_serial_under_shuffled_ready_order(workload_name: str) -> None:
    _, serial_db, _, _, serial_outcomes = _run(workload_name, "serial")
    for seed in (None, 7):
        _, db, _, _, outcomes = _run(workload_name, "calvin", seed=seed)
        assert outcomes == serial_outcomes
        assert db.dump() == serial_db.dump()


def test_undo_context_restores_every_kind_of_write() -> None:
    workload = get_workload("tpcc", **CONTENDED["tpcc"])
    db = workload.build(seed=5)
    before = db.dump()
    engine = get_protocol("no_wait")(db, workload.registry())
    stream = workload.requests(seed=6)
    requests = list(itertools.islice(stream, 20))
    contexts = []
    with debug.invariants(False):
        for planned in plan_batch(engine.registry, db, requests):
            assert isinstance(planned, PlannedTxn)
            ctx = UndoContext(db, planned)
            for piece in planned.pieces:
                ctx._piece = piece
                planned.outputs[piece.name] = piece.run(ctx)
            contexts.append(ctx)
    assert db.dump() != before
    kinds = {entry[0] for ctx in contexts for entry in ctx.undo_log}
    assert {"fields", "insert"} <= kinds
    for ctx in reversed(contexts):
        ctx.rollback()
    assert db.dump() == before


@pytest.mark.parametrize(
    ("option", "value"), [("inflight", 0), ("inflight", "8"), ("retries_max", -1)]
)
def test_bad_options_name_the_value(option: str, value: object) -> None:
    workload = get_workload("ycsb", records=50)
    with pytest.raises(ConfigError, match=option):
        get_protocol("wait_die")(workload.build(seed=1), workload.registry(), **{option: value})


def test_requests_are_plain_txn_requests() -> None:
    stream = get_workload("ycsb", records=50).requests(seed=1)
    assert isinstance(next(stream), TxnRequest)


def _counter_registry() -> ProcedureRegistry:
    def bump(params, view):
        def run(ctx):
            n = ctx.get("counter", 0)["n"]
            ctx.update("counter", 0, {"n": n + 1})
            return n

        return [Piece("bump", run, reads=(("counter", 0),), writes=(("counter", 0),))]

    def keyless(params, view):
        return [Piece("echo", lambda ctx: ctx.params["x"])]

    return ProcedureRegistry([Procedure("bump", {}, bump), Procedure("echo", {"x": int}, keyless)])


@pytest.mark.parametrize("protocol", ["calvin", *INTERLEAVING])
def test_keyless_and_hot_counter_transactions(protocol: str) -> None:
    db = Database((Table("counter"),))
    db["counter"].insert(0, {"n": 0})
    engine = get_protocol(protocol)(db, _counter_registry())
    batch = [TxnRequest("bump", {}) if i % 2 else TxnRequest("echo", {"x": i}) for i in range(40)]
    outcomes = engine.run_batch(batch)
    assert [o.result for o in outcomes[::2]] == [{"echo": i} for i in range(0, 40, 2)]
    assert sorted(o.result["bump"] for o in outcomes[1::2]) == list(range(20))
    assert db["counter"].get(0) == {"n": 20}
    assert engine.stats[f"{protocol}/commits"] == 40


def _sum_check_registry() -> ProcedureRegistry:
    """``check`` reads ``a``, then ``b`` in a piece that aborts when their sum is below
    ``need``; ``move`` shifts money between them (the sum stays 200): no serial order aborts
    ``check``."""

    def check_plan(params, view):
        a, b, need = params["a"], params["b"], params["need"]

        def total(ctx):
            total = ctx.input("ra") + ctx.get("acct", b)["bal"]
            if total < need:
                ctx.abort(f"total {total} < {need}")
            return total

        return [
            Piece("ra", lambda ctx: ctx.get("acct", a)["bal"], reads=(("acct", a),)),
            Piece("rb", total, reads=(("acct", b),), after=("ra",), may_abort=True),
        ]

    def move_plan(params, view):
        src, dst, amount = params["src"], params["dst"], params["amount"]

        def run(ctx):
            ctx.update("acct", src, {"bal": ctx.get("acct", src)["bal"] - amount})
            ctx.update("acct", dst, {"bal": ctx.get("acct", dst)["bal"] + amount})

        return [Piece("move", run, writes=(("acct", src), ("acct", dst)))]

    return ProcedureRegistry([
        Procedure("check", {"a": int, "b": int, "need": int}, check_plan),
        Procedure("move", {"src": int, "dst": int, "amount": int}, move_plan),
    ])  # fmt: skip


@pytest.mark.parametrize("protocol", ["no_wait", "wait_die", "occ"])
def test_a_logic_abort_is_one_a_serial_order_gives(protocol: str) -> None:
    """OCC decided ``check``'s abort on reads a concurrent ``move`` had made stale (a total of
    150) in about a quarter of interleavings; it now validates before the abort is final."""
    batch = [TxnRequest("check", {"a": 0, "b": 1, "need": 200}),
             TxnRequest("move", {"src": 1, "dst": 0, "amount": 50})]  # fmt: skip
    for seed in range(60):
        db = Database((Table("acct"),))
        db["acct"].rows.update({0: {"bal": 100}, 1: {"bal": 100}})
        outcomes = get_protocol(protocol)(db, _sum_check_registry(), inflight=8,
                                          seed=seed).run_batch(batch)  # fmt: skip
        assert [o.status for o in outcomes] == [Status.COMMITTED] * 2, (seed, outcomes)


def _sum_check_db() -> Database:
    db = Database((Table("acct"),))
    db["acct"].rows.update({0: {"bal": 100}, 1: {"bal": 100}})
    return db


def _sum_check_run(protocol: str, seed: int, need: int, *, validate: bool = True):
    """``check`` then ``move`` (see ``_sum_check_registry``) in one batch, with a history;
    ``validate=False``: OCC's canary."""
    batch = [TxnRequest("check", {"a": 0, "b": 1, "need": need}),
             TxnRequest("move", {"src": 1, "dst": 0, "amount": 50})]  # fmt: skip
    engine = get_protocol(protocol)(_sum_check_db(), _sum_check_registry(), inflight=8,
                                    seed=seed, record_history=True)  # fmt: skip
    if not validate:
        engine.validate = False
    return engine, [engine.run_batch(batch)]


@pytest.mark.parametrize("protocol", INTERLEAVING)
def test_the_history_holds_logic_aborts_and_the_replay_aborts_them(protocol: str) -> None:
    """A sum no order reaches (need 300): ``check`` logic-aborts in every interleaving; the
    history holds it as a logic abort and the serial replay aborts it, with the same reason."""
    for seed in range(10):
        engine, outcomes = _sum_check_run(protocol, seed, need=300)
        assert [o.status for o in outcomes[0]] == [Status.ABORTED, Status.COMMITTED]
        assert sorted((t.index, t.aborted) for t in engine.history) == [(0, True), (1, False)]
        aborted = next(t for t in engine.history if t.aborted)
        assert aborted.writes == {} and set(aborted.reads) == {("acct", 0), ("acct", 1)}
        replay(engine.history, _sum_check_db(), _sum_check_registry(), outcomes)


def test_canary_occ_logic_abort_on_stale_reads_is_caught_by_the_history_check() -> None:
    """OCC without validation decides ``check``'s abort on a view no serial order gives (``a``
    before ``move``, ``b`` after) in some interleavings; the abort's recorded reads put it in
    a cycle with ``move``. Before, logic aborts were not in the history: nothing caught it."""
    caught = 0
    for seed in range(60):
        engine, outcomes = _sum_check_run("occ", seed, need=200, validate=False)
        if outcomes[0][0].status is Status.ABORTED:
            caught += 1
            with pytest.raises(NotSerializable, match="cycle"):
                replay(engine.history, _sum_check_db(), _sum_check_registry(), outcomes)
    assert caught > 0, "no seed made unvalidated OCC abort on stale reads"


_CHECK_300 = TxnRequest("check", {"a": 0, "b": 1, "need": 300})
_CHECK_100 = TxnRequest("check", {"a": 0, "b": 1, "need": 100})
_READS = {("acct", 0): 0, ("acct", 1): 0}


@pytest.mark.parametrize(
    ("history", "outcome", "problem"),
    [
        pytest.param(  # committed in the run, but the serial order aborts it
            [CommittedTxn(0, 0, _CHECK_300, _READS, {})],
            Outcome(Status.COMMITTED, {"ra": 100, "rb": 200}),
            "gave Outcome",
            id="committed-aborts-in-replay",
        ),
        pytest.param(  # logic-aborted in the run, but the serial order commits it
            [CommittedTxn(0, 0, _CHECK_100, _READS, {}, aborted=True)],
            Outcome(Status.ABORTED, reason="total 200 < 100"),
            "gave Outcome",
            id="aborted-commits-in-replay",
        ),
        pytest.param(  # a logic abort the protocol did not record
            [],
            Outcome(Status.ABORTED, reason="total 200 < 300"),
            r"ended aborted \(total 200 < 300\) but the history has it not in it",
            id="logic-abort-missing",
        ),
        pytest.param(  # a logic abort filed as a commit
            [CommittedTxn(0, 0, _CHECK_300, _READS, {})],
            Outcome(Status.ABORTED, reason="total 200 < 300"),
            "but the history has it as committed",
            id="logic-abort-filed-as-commit",
        ),
        pytest.param(  # a give-up was undone: it must not be in the history
            [CommittedTxn(0, 0, _CHECK_300, _READS, {}, aborted=True)],
            Outcome(Status.ABORTED, reason="retry: occ cc_abort (validation) after 1 attempts"),
            "but the history has it as logic-aborted",
            id="give-up-recorded",
        ),
    ],
)
def test_the_replay_compares_aborted_outcomes(history, outcome, problem: str) -> None:
    with pytest.raises(NotSerializable, match=problem):
        replay(history, _sum_check_db(), _sum_check_registry(), [[outcome]])


def test_the_replay_accepts_a_logic_abort_at_its_place() -> None:
    history = [CommittedTxn(0, 0, _CHECK_300, _READS, {}, aborted=True)]
    outcome = Outcome(Status.ABORTED, reason="total 200 < 300")
    replay(history, _sum_check_db(), _sum_check_registry(), [[outcome]])


def test_occ_gives_up_as_a_retry_when_a_piece_raised_on_a_stale_view():
    """``check`` reads a, then b, and raises when they differ, which no serial order lets
    happen; ``bump`` raises both. OCC finds the raise stale and restarts; with no retries
    left it used to end the call ERROR (the stale raise) where it counted a give-up."""
    from dgcc import Database, Piece, Procedure, ProcedureRegistry, Status, Table, TxnRequest
    from dgcc.protocols.occ import OccProtocol

    def bump_plan(params, view):
        def bump(key):
            def run(ctx):
                ctx.update("kv", key, {"v": ctx.get("kv", key)["v"] + 1})

            return Piece(key, run, reads=(("kv", key),), writes=(("kv", key),))

        return [bump("a"), bump("b")]

    def check_plan(params, view):
        def second(ctx):
            if ctx.input("first") != ctx.get("kv", "b")["v"]:
                raise RuntimeError("a and b differ")

        return [
            Piece("first", lambda ctx: ctx.get("kv", "a")["v"], reads=(("kv", "a"),)),
            Piece("second", second, reads=(("kv", "b"),), after=("first",)),
        ]

    registry = ProcedureRegistry(
        [Procedure("bump", {}, bump_plan), Procedure("check", {}, check_plan)]
    )
    db = Database((Table("kv"),))
    db["kv"].rows.update({"a": {"v": 0}, "b": {"v": 0}})
    batch = [TxnRequest("check" if i % 2 else "bump", {}) for i in range(60)]
    engine = OccProtocol(db, registry, seed=6, inflight=8, retries_max=0)
    outcomes = engine.run_batch(batch)
    assert [o for o in outcomes if o.status is Status.ERROR] == []
    gave_up = [o for o in outcomes if o.gave_up]
    assert gave_up and len(gave_up) == engine.stats["occ/gave_up"]


def test_occ_deleting_and_inserting_a_row_again_leaves_the_new_row_alone():
    from dgcc import Database, Piece, Procedure, ProcedureRegistry, Status, Table, TxnRequest
    from dgcc.protocols.occ import OccProtocol

    def plan(params, view):
        def run(ctx):
            ctx.delete("kv", 1)
            ctx.insert("kv", 1, {"g": 5})

        return [Piece("replace", run, writes=(("kv", 1),))]

    db = Database((Table("kv"),))
    db["kv"].insert(1, {"g": 1, "old": "x"})
    registry = ProcedureRegistry([Procedure("replace", {}, plan)])
    outcome = OccProtocol(db, registry).run_batch([TxnRequest("replace", {})])[0]
    assert outcome.status is Status.COMMITTED and db["kv"].get(1) == {"g": 5}


@pytest.mark.parametrize("protocol", ["no_wait", "wait_die", "occ"])
def test_the_history_check_passes_a_call_whose_result_builder_raised(protocol):
    """Such a call commits (its writes stand) and answers ERROR; the checker used to call
    the history incomplete, a false alarm on a serializable run."""
    from dgcc import Database, Piece, Procedure, ProcedureRegistry, Status, Table, TxnRequest

    def plan(params, view):
        def run(ctx):
            ctx.update("kv", 1, {"v": ctx.get("kv", 1)["v"] + 1})
            return params["n"]

        return [Piece("add", run, reads=(("kv", 1),), writes=(("kv", 1),))]

    def result(outputs):
        return 10 // outputs["add"]

    registry = ProcedureRegistry([Procedure("add", {"n": int}, plan, result=result)])

    def fresh():
        db = Database((Table("kv"),))
        db["kv"].insert(1, {"v": 0})
        return db

    db = fresh()
    engine = get_protocol(protocol)(db, registry, seed=1, inflight=3, record_history=True)
    outcomes = engine.run_batch([TxnRequest("add", {"n": i % 3}) for i in range(9)])
    assert [o.status for o in outcomes].count(Status.ERROR) == 3
    replayed = fresh()
    replay(engine.history, replayed, registry, [outcomes])
    assert replayed["kv"].get(1) == db["kv"].get(1) == {"v": 9}
