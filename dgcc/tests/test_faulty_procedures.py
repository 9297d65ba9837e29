"""A faulty procedure fails only its own call where one node decides, under every protocol.

Goal: a plan function that raises (here ZeroDivisionError for ``d == 0``) and pieces that break
DistDGCC's placement rules (one piece spanning two nodes) become an ERROR outcome naming the
procedure and the problem, for that call alone; the rest of the batch commits, and a node keeps
serving. A raising plan of a call that several nodes plan, each against its own rows, is the one
exception: a peer may have planned it fine and committed its share, so the node stops (loudly)
instead of answering ERROR. Method: a tiny bank under every registered protocol in one process;
both nodes' epoch runs of DistDGCC and Calvin in one process for calls both nodes plan; and
in-process 2-node clusters of every server on loopback, with a YCSB subclass that adds the
faulty procedure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping
from typing import Any

import pytest

from dgcc import (
    PROTOCOLS,
    Database,
    Piece,
    Procedure,
    ProcedureRegistry,
    Status,
    Table,
    TxnRequest,
    get_protocol,
)
from dgcc.api import PieceContext
from dgcc.cluster import local_config
from dgcc.errors import ConfigError, ProcedureError
from dgcc.net import AsyncClient
from dgcc.net.servers import SERVERS, server_class
from dgcc.net.wire import decode, encode
from dgcc.protocols.dist_placement import Placement, Router, solo_route_checked
from dgcc.protocols.dist_results import ResultAssembler
from dgcc.workloads import WORKLOADS
from dgcc.workloads.ycsb import TABLE, YcsbWorkload

KEYS = 20  # keys 0..9 live on node 0, 10..19 on node 1
WAIT_S = 20.0
PLAN_FAILED = "bump.plan raised ZeroDivisionError: integer division or modulo by zero"


def _bump_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
    """Add ``100 // d`` to each key's row: planning divides, so ``d == 0`` raises."""
    amount = 100 // params["d"]

    def bump(key: int) -> Piece:
        def run(ctx: PieceContext) -> None:
            ctx.update("kv", key, {"v": ctx.get("kv", key)["v"] + amount})

        return Piece(f"bump{key}", run, reads=(("kv", key),), writes=(("kv", key),))

    return [bump(key) for key in params["keys"]]


def _span_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
    """One piece writing every key: on a cluster it spans nodes when the keys do."""
    keys = tuple(("kv", key) for key in params["keys"])
    return [Piece("all", lambda ctx: None, writes=keys)]


def _registry() -> ProcedureRegistry:
    return ProcedureRegistry(
        [
            Procedure("bump", {"keys": list, "d": int}, _bump_plan),
            Procedure("span", {"keys": list}, _span_plan),
        ]
    )


def _db() -> Database:
    db = Database((Table("kv"),))
    db["kv"].rows.update({key: {"v": 0} for key in range(KEYS)})
    return db


def _bump(keys: list[int], d: int) -> TxnRequest:
    return TxnRequest("bump", {"keys": keys, "d": d})


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_plan_that_raises_fails_its_call_alone(protocol: str) -> None:
    db = _db()
    batch = [_bump([1, 12], 1), _bump([2, 13], 0), _bump([1], 2)]
    outcomes = get_protocol(protocol)(db, _registry()).run_batch(batch)
    assert [outcome.status for outcome in outcomes] == [
        Status.COMMITTED,
        Status.ERROR,
        Status.COMMITTED,
    ]
    assert outcomes[1].reason == PLAN_FAILED
    values = {key: row["v"] for key, row in db["kv"].rows.items() if row["v"]}
    assert values == {1: 150, 12: 100}


def _shaped_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
    """Two pieces on one key, shaped as ``params["shape"]`` says (all but "ok" are bugs)."""
    key, shape = params["keys"][0], params["shape"]

    def bump(ctx: PieceContext) -> None:
        ctx.update("kv", key, {"v": ctx.get("kv", key)["v"] + 1})

    rw = {"reads": (("kv", key),), "writes": (("kv", key),)}
    after = {"ok": ("a",), "later": ("b",), "own": ("b",), "unknown": ("zzz",)}.get(shape, ())
    first_after = ("b",) if shape == "later" else ()
    return [
        Piece("a", bump, after=first_after, **rw),
        Piece(
            "a" if shape == "dup" else "b",
            bump,
            after=() if shape == "later" else after,
            may_abort=shape == "abort_after_write",
            **rw,
        ),
    ]


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_plan_of_a_bad_shape_fails_its_call_alone(protocol: str) -> None:
    """Pieces after later, their own or unknown pieces, duplicate names, or a piece that may
    abort after a write: the call is an ERROR naming the problem under every protocol (DGCC's
    batch graph would stall or half-apply the batch), and the rest of the batch commits."""
    registry = _registry()
    registry.register(Procedure("shaped", {"keys": list, "shape": str}, _shaped_plan))
    shapes = ["ok", "later", "own", "unknown", "dup", "abort_after_write", "ok"]
    batch = [TxnRequest("shaped", {"keys": [k], "shape": s}) for k, s in enumerate(shapes)]
    db = _db()
    outcomes = get_protocol(protocol)(db, registry).run_batch(batch)
    assert [o.status for o in outcomes] == [Status.COMMITTED, *[Status.ERROR] * 5, Status.COMMITTED]
    reasons = [o.reason for o in outcomes[1:-1]]
    assert all(reason.startswith("shaped.plan gave a bad plan: ") for reason in reasons)
    assert "comes after unknown, later or its own pieces ['b']" in reasons[0]
    assert "comes after unknown, later or its own pieces ['b']" in reasons[1]
    assert "['zzz']" in reasons[2] and "duplicate piece name 'a'" in reasons[3]
    assert "piece 'b' may abort after an earlier piece wrote" in reasons[4]
    assert {key: row["v"] for key, row in db["kv"].rows.items() if row["v"]} == {0: 2, 6: 2}


@pytest.mark.parametrize("protocol", ["dgcc", "calvin"])
def test_every_node_fails_a_multi_node_call_of_a_bad_shape_alike(protocol: str) -> None:
    """A plan's shape depends on its pieces alone, so each node that plans a call spanning
    both reaches the same verdict: an ERROR for that call, not a stopped node."""
    run_class = server_class(protocol).epoch_run
    registry = _registry()
    registry.register(Procedure("shaped", {"keys": list, "shape": str}, _shaped_plan))
    router = Router(_TwoNodes(), Placement.round_robin(2))
    batch = [TxnRequest("shaped", {"keys": [3, 12], "shape": "dup"}), _bump([4], 1)]
    runs = [run_class(node, _db(), registry, router, [batch, []]) for node in (0, 1)]
    _run_to_the_end(runs)
    assembler = ResultAssembler(registry, batch, 2)
    for node, run in enumerate(runs):
        assembler.add(node, _wire(run.reports().get(0, [])))
    outcomes = assembler.outcomes()
    assert [o.status for o in outcomes] == [Status.ERROR, Status.COMMITTED]
    assert outcomes[0].reason == "shaped.plan gave a bad plan: duplicate piece name 'a'"


def test_a_procedure_with_params_that_are_not_types_is_refused() -> None:
    with pytest.raises(ProcedureError, match=r"params must map str names to types .*'a': 'int'"):
        Procedure("p", {"a": "int"}, _bump_plan)
    optional = Procedure("p", {"keys": list, "d": int | None}, _bump_plan)  # a union is a type
    outcomes = get_protocol("serial")(_db(), ProcedureRegistry([optional])).run_batch(
        [TxnRequest("p", {"keys": [1], "d": 2}), TxnRequest("p", {"keys": [1], "d": "x"})]
    )
    assert [o.status for o in outcomes] == [Status.COMMITTED, Status.ERROR]
    assert "param 'd' must be int | None, got str 'x'" in outcomes[1].reason


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_result_builder_that_raises_fails_its_answer_alone(protocol: str) -> None:
    registry = _registry()
    registry.register(Procedure("broken", {"keys": list, "d": int}, _bump_plan, lambda out: 1 / 0))
    broken = TxnRequest("broken", {"keys": [3], "d": 1})
    outcomes = get_protocol(protocol)(_db(), registry).run_batch([broken, _bump([4], 1)])
    assert [outcome.status for outcome in outcomes] == [Status.ERROR, Status.COMMITTED]
    assert outcomes[0].reason == "broken.result raised ZeroDivisionError: division by zero"


@pytest.mark.parametrize("protocol", ["dgcc", "calvin"])
def test_a_one_node_cluster_fails_an_unroutable_faulty_call_alone(protocol: str) -> None:
    """With one node, a call nobody can route is planned by that node only: it decides."""

    class _NoRoute(_TwoNodes):
        def route_keys(self, procedure: str, params: Mapping[str, Any]) -> None:
            return None

    run_class = server_class(protocol).epoch_run
    router = Router(_NoRoute(), Placement.round_robin(1))
    run = run_class(0, _db(), _registry(), router, [[_bump([2], 0), _bump([3], 1)]])
    while not run.finished:
        assert run.step(100), "nothing ran"
    assembler = ResultAssembler(_registry(), [_bump([2], 0), _bump([3], 1)], 1)
    assembler.add(0, _wire(run.reports().get(0, [])))
    assert [o.status for o in assembler.outcomes()] == [Status.ERROR, Status.COMMITTED]


class _TwoNodes:
    """The key-value workload's routing over two nodes: keys 0..9 on node 0, 10..19 on 1."""

    def partition_of(self, key: Hashable, partitions: int) -> int:
        return key[1] * partitions // KEYS

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable]:
        return [("kv", key) for key in params["keys"]]


def _wire(message: Any) -> Any:
    return decode(encode(("m", message)))[1]


def _run_to_the_end(runs: list) -> None:
    """Step both nodes' epoch runs, delivering their value messages, until both finish."""
    while not all(run.finished for run in runs):
        moved = sum(run.step(100) for run in runs)
        for run in runs:
            for target, entries in run.take_outbox().items():
                runs[target].deliver(_wire(entries))
                moved += 1
        assert moved, "no piece ran and no value moved"


@pytest.mark.parametrize("protocol", ["dgcc", "calvin"])
def test_every_node_fails_a_faulty_multi_node_call_alike(protocol: str) -> None:
    run_class = server_class(protocol).epoch_run
    registry = _registry()
    router = Router(_TwoNodes(), Placement.round_robin(2))
    dbs = [_db(), _db()]
    batch = [
        _bump([1, 12], 1),
        TxnRequest("span", {"keys": [3, 14]}),  # its piece spans both nodes
        _bump([4], 0),  # the plan raises on node 0, the only one that plans it
        _bump([4], 1),
    ]
    with pytest.raises(ProcedureError, match=f"{PLAN_FAILED} \\(a call planned on several"):
        run_class(0, _db(), registry, router, [[_bump([2, 13], 0)], []])  # a peer may commit
    runs = [run_class(node, dbs[node], registry, router, [batch, []]) for node in (0, 1)]
    _run_to_the_end(runs)
    assembler = ResultAssembler(registry, batch, 2)
    for node, run in enumerate(runs):
        assembler.add(node, _wire(run.reports().get(0, [])))
    outcomes = assembler.outcomes()
    assert [outcome.status for outcome in outcomes] == [
        Status.COMMITTED,
        Status.ERROR,
        Status.ERROR,
        Status.COMMITTED,
    ]
    assert outcomes[1].reason == "span: piece 'all' spans nodes [0, 1]"
    assert outcomes[2].reason == PLAN_FAILED
    assert dbs[0]["kv"].rows[1]["v"] == 100 and dbs[1]["kv"].rows[12]["v"] == 100
    assert dbs[0]["kv"].rows[4]["v"] == 100  # the last call's bump alone


@pytest.mark.parametrize("protocol", ["dgcc", "calvin"])
def test_an_undeclared_abort_or_a_short_route_fails_its_call_on_a_cluster(protocol: str) -> None:
    """Two workload bugs that once stopped a node or half-applied a call: a piece that aborts
    without may_abort (an assertion stopped the node running it), and a route_keys that leaves
    out a partition the pieces touch (the node planning the call alone wrote its share and
    failed on the rows it does not hold). Each is now an ERROR for that call, naming it."""

    class _ShortRoute(_TwoNodes):
        def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable]:
            return [("kv", params["keys"][0])]  # only the first key's partition

    def plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        pieces = _bump_plan(params, view)
        if params["d"] < 0:  # node 1's piece aborts, undeclared
            pieces[-1] = Piece(pieces[-1].name, lambda ctx: ctx.abort("no"), pieces[-1].reads)
        return pieces

    run_class = server_class(protocol).epoch_run
    registry = ProcedureRegistry([Procedure("bump", {"keys": list, "d": int}, plan)])
    dbs = [_db(), _db()]
    batch = [_bump([1, 12], -1), _bump([2, 13], 1)]
    runs = [run_class(n, dbs[n], registry, Router(_TwoNodes(), Placement.round_robin(2)),
                      [batch, []]) for n in (0, 1)]  # fmt: skip
    _run_to_the_end(runs)
    assembler = ResultAssembler(registry, batch, 2)
    for node, run in enumerate(runs):
        assembler.add(node, _wire(run.reports().get(0, [])))
    undeclared, fine = assembler.outcomes()
    assert (undeclared.status, fine.status) == (Status.ERROR, Status.COMMITTED)
    assert "bump.bump12 aborted (no) but is not declared may_abort=True" in undeclared.reason

    short = Router(_ShortRoute(), Placement.round_robin(2))
    db = _db()
    run = run_class(0, db, registry, short, [[_bump([3, 14], 1), _bump([5], 1)], []])
    while not run.finished:
        assert run.step(100), "nothing ran"
    assembler = ResultAssembler(registry, [_bump([3, 14], 1), _bump([5], 1)], 2)
    assembler.add(0, _wire(run.reports().get(0, [])))
    assembler.add(1, [])
    misrouted, fine = assembler.outcomes()
    assert (misrouted.status, fine.status) == (Status.ERROR, Status.COMMITTED)
    assert "pieces on nodes [0, 1] but the route gave [0]" in misrouted.reason
    assert "route_keys must name every partition" in misrouted.reason
    assert db["kv"].rows[3]["v"] == 0 and db["kv"].rows[5]["v"] == 100  # nothing half-applied


@pytest.mark.parametrize("with_a_sender_after", [False, True])
def test_a_call_failing_midway_leaves_the_same_writes_live_and_in_replay(
    with_a_sender_after: bool,
) -> None:
    """Call p: a (node 0, independent), b (node 1, aborts undeclared: ERROR), c (node 0, waits
    on b). Live, a runs before b's error comes; a replay delivers every value first. A value
    carrying an error once failed the whole call at once (a skipped in replay), and a later
    call whose piece reads c's key sent a value, which put c (a sender's ancestor) ahead of a
    in the first pass, so a ran after c failed live but not in replay."""
    from dgcc.wal.node_log import LoggedEpochRun, record_node_epoch, replay_node_epoch

    def bump(key: int) -> Any:
        return lambda ctx: ctx.update("kv", key, {"v": ctx.get("kv", key)["v"] + 1})

    def rw(key: int) -> dict[str, Any]:
        return {"reads": (("kv", key),), "writes": (("kv", key),)}

    def fails(params: Mapping[str, Any], view: object) -> list[Piece]:
        return [
            Piece("a", bump(3), **rw(3)),
            Piece("b", lambda ctx: ctx.abort("no"), (("kv", 12),)),
            Piece("c", bump(1), after=("b",), **rw(1)),
        ]

    def sends(params: Mapping[str, Any], view: object) -> list[Piece]:
        return [
            Piece("s", lambda ctx: ctx.get("kv", 1)["v"], (("kv", 1),)),  # node 0, sends
            Piece("t", bump(13), after=("s",), **rw(13)),  # node 1
        ]

    registry = ProcedureRegistry(
        [Procedure("fails", {"keys": list}, fails), Procedure("sends", {"keys": list}, sends)]
    )
    batch = [TxnRequest("fails", {"keys": [1, 3, 12]})]
    if with_a_sender_after:
        batch.append(TxnRequest("sends", {"keys": [1, 13]}))
    dbs = [_db(), _db()]
    router = Router(_TwoNodes(), Placement.round_robin(2))
    runs = [LoggedEpochRun(n, dbs[n], registry, router, [batch, []]) for n in (0, 1)]
    _run_to_the_end(runs)
    assert dbs[0]["kv"].rows[3]["v"] == 1 and dbs[0]["kv"].rows[1]["v"] == 0  # a ran, c not
    piece, error = runs[0].reports()[0][0][3]  # node 0 fails it too, at c (waiting on b)
    assert piece == 2 and "not declared may_abort=True" in error
    replayed = _db()
    replay_node_epoch(0, replayed, registry, router, record_node_epoch(runs[0]))
    assert {k: r["v"] for k, r in replayed["kv"].rows.items() if k < 10} == {
        k: r["v"] for k, r in dbs[0]["kv"].rows.items() if k < 10
    }


def test_solo_routes_are_checked_by_their_place_in_the_batch() -> None:
    # By the logged input, not a counter of the process's calls: a replay checks the same
    # calls (a counter let a call commit live that recovery then failed).
    assert [slot for slot in range(100) if solo_route_checked(slot)] == [0, 32, 64, 96]


def test_a_partition_of_out_of_range_is_named() -> None:
    class _Beyond(_TwoNodes):
        def partition_of(self, key: Hashable, partitions: int) -> int:
            return 2

    with pytest.raises(ConfigError, match=r"_Beyond.partition_of\(\('kv', 1\), 2\) returned 2: "):
        Router(_Beyond(), Placement.round_robin(2)).node_of_key(("kv", 1))


class _FaultyYcsb(YcsbWorkload):
    """YCSB plus ``ycsb_div``, which reads ``keys`` but first divides by ``d`` when planned."""

    name = "faulty_ycsb"

    def registry(self) -> ProcedureRegistry:
        registry = super().registry()
        registry.register(Procedure("ycsb_div", {"keys": list, "d": int}, _div_plan))
        return registry

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable] | None:
        if procedure == "ycsb_div":
            return [(TABLE, key) for key in params["keys"]]
        return super().route_keys(procedure, params)

    def route_partitions(
        self, procedure: str, params: Mapping[str, Any], partitions: int
    ) -> set[int] | None:
        if procedure == "ycsb_div":
            return None  # routed by its keys
        return super().route_partitions(procedure, params, partitions)


def _div_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
    scale = 100 // params["d"]
    return [
        Piece(f"read{key}", lambda ctx, key=key: ctx.get(TABLE, key)["counter"] * scale,
              reads=((TABLE, key),))
        for key in params["keys"]
    ]  # fmt: skip


@pytest.mark.parametrize("protocol", sorted(SERVERS))
def test_a_node_keeps_serving_after_a_plan_raises(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(WORKLOADS, _FaultyYcsb.name, _FaultyYcsb)
    config = local_config(
        2,
        workload=_FaultyYcsb.name,
        workload_options={"records": 100},
        protocol=protocol,
        epoch_ms=2.0,
    )
    node_class = server_class(protocol)

    async def go() -> tuple[list, list[dict]]:
        nodes = [node_class(config, node) for node in (0, 1)]
        await asyncio.gather(*(node.start() for node in nodes))
        try:
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                calls = [
                    ("ycsb_div", {"keys": [2, 3], "d": 0}),  # node 0's keys: it decides
                    ("ycsb_div", {"keys": [2, 80], "d": 1}),
                    ("ycsb_txn", {"keys": [3, 81], "rmw": [True, True]}),
                ]
                outcomes = []
                for procedure, params in calls:  # one after another: the node must survive
                    outcomes.append(await client.call(procedure, params, timeout_s=WAIT_S))
            statuses = [node.status() for node in nodes]
            assert not any(node.stopped.is_set() for node in nodes)
        finally:
            for node in nodes:
                node.stop()
        return outcomes, statuses

    outcomes, statuses = asyncio.run(go())
    assert [outcome.status for outcome in outcomes] == [
        Status.ERROR,
        Status.COMMITTED,
        Status.COMMITTED,
    ], outcomes
    assert "ycsb_div.plan raised ZeroDivisionError" in outcomes[0].reason
    assert [status["peers_down"] for status in statuses] == [[], []]


def test_dependency_replay_of_an_epoch_with_a_raising_piece_equals_the_live_run() -> None:
    """Which pieces of a failing transaction run depends on the order: live, one executor runs
    the oldest ready piece first, so the raising piece ``r`` (it waits on the write of key 1)
    fails the call before its independent piece ``c`` runs. A replay, with any worker count,
    runs such an epoch in that order (a FIFO walk ran ``c`` first: a write live never made)."""
    from dgcc.protocols.dgcc import DgccProtocol
    from dgcc.wal import dependency

    def write_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        def run(ctx: PieceContext) -> None:
            ctx.update("kv", 1, {"v": 5})

        return [Piece("w", run, writes=(("kv", 1),))]

    def failing_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        def read(ctx: PieceContext) -> None:
            raise RuntimeError(f"bug reading {ctx.get('kv', 1)}")

        def write(ctx: PieceContext) -> None:
            ctx.update("kv", 2, {"v": 99})

        return [Piece("r", read, reads=(("kv", 1),)), Piece("c", write, writes=(("kv", 2),))]

    registry = ProcedureRegistry(
        [Procedure("w", {}, write_plan), Procedure("failing", {}, failing_plan)]
    )
    batch = [TxnRequest("w", {}), TxnRequest("failing", {})]
    live, seen = _db(), []
    protocol = DgccProtocol(live, registry)
    protocol.graph_sink = lambda txns, graph: seen.append((txns, graph))
    outcomes = protocol.run_batch(batch)
    assert [outcome.status for outcome in outcomes] == [Status.COMMITTED, Status.ERROR]
    payload = dependency.record_epoch(batch, *seen[0])
    assert payload["errors"] == [1]
    for workers in (1, 2, 3):
        replayed = _db()
        dependency.replay_epoch(replayed, registry, payload, workers=workers)
        assert replayed["kv"].rows == live["kv"].rows, workers
    assert live["kv"].rows[2] == {"v": 0}  # c never ran live


def test_occ_validates_the_reads_a_raising_piece_saw_before_failing_its_call() -> None:
    """``both`` keeps keys 1 and 2 equal; ``check`` reads them in two pieces and raises when
    they differ, which no serial order lets happen. OCC interleaves the calls: a ``check``
    that saw one key before and one after a ``both`` raised on a view no order had, and used
    to end ERROR at once; it is validated as a logic abort is, and restarts."""
    from dgcc.protocols.occ import OccProtocol

    def both_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        def bump(key: int) -> Piece:
            def run(ctx: PieceContext) -> None:
                ctx.update("kv", key, {"v": ctx.get("kv", key)["v"] + 1})

            return Piece(f"k{key}", run, reads=(("kv", key),), writes=(("kv", key),))

        return [bump(1), bump(2)]

    def check_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        def first(ctx: PieceContext) -> int:
            return ctx.get("kv", 1)["v"]

        def second(ctx: PieceContext) -> None:
            seen = (ctx.input("first"), ctx.get("kv", 2)["v"])
            if seen[0] != seen[1]:
                raise RuntimeError(f"keys 1 and 2 differ: {seen}")

        return [
            Piece("first", first, reads=(("kv", 1),)),
            Piece("second", second, reads=(("kv", 2),), after=("first",)),
        ]

    registry = ProcedureRegistry(
        [Procedure("both", {}, both_plan), Procedure("check", {}, check_plan)]
    )
    batch = [TxnRequest("both" if i % 2 else "check", {}) for i in range(200)]
    db = _db()
    outcomes = OccProtocol(db, registry, seed=3, inflight=16).run_batch(batch)
    assert [o.reason for o in outcomes if o.status is Status.ERROR] == []
    assert db["kv"].rows[1] == db["kv"].rows[2] == {"v": 100}


@pytest.mark.parametrize("protocol", ["no_wait", "wait_die", "occ"])
def test_the_interleaving_protocols_undo_the_writes_of_a_call_that_raises(protocol: str) -> None:
    """``half`` adds 1 to key 1 and then raises when ``fail`` is set. 2PL holds its write
    under an X lock until the call ends, so it can undo it, as OCC (which never installs it)
    and the 2PC cluster do: the ERROR call leaves nothing, and the history checker's serial
    replay (which skips ERROR calls) ends in the same state. It used to keep the write, and
    the checker reported a state no serial order gives."""
    from dgcc.protocols._history import replay

    def half_plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        def bump(ctx: PieceContext) -> None:
            ctx.update("kv", 1, {"v": ctx.get("kv", 1)["v"] + 1})

        def maybe_fail(ctx: PieceContext) -> None:
            if params["fail"]:
                raise RuntimeError("a bug after the write")

        return [
            Piece("bump", bump, reads=(("kv", 1),), writes=(("kv", 1),)),
            Piece("fail", maybe_fail, reads=(("kv", 2),)),
        ]

    registry = ProcedureRegistry([Procedure("half", {"fail": bool}, half_plan)])
    batch = [TxnRequest("half", {"fail": i % 3 == 1}) for i in range(30)]
    db = _db()
    engine = get_protocol(protocol)(db, registry, seed=5, inflight=4, record_history=True)
    outcomes = engine.run_batch(batch)
    statuses = [o.status for o in outcomes]
    assert statuses.count(Status.ERROR) == 10 and statuses.count(Status.COMMITTED) == 20
    assert db["kv"].rows[1] == {"v": 20}
    fresh = _db()
    replay(engine.history, fresh, registry, [outcomes])
    assert fresh["kv"].rows == db["kv"].rows


@pytest.mark.parametrize("protocol", ["dgcc", "calvin"])
@pytest.mark.parametrize("first", [0, 1])
def test_a_call_answers_with_the_failure_of_its_lowest_piece_as_a_serial_run(protocol, first):
    """``check`` (may_abort, key 1 on node 0) aborts; ``peek`` (read-only, key 12 on node 1)
    raises. In serial order the earlier of the two ends the call and the later never runs:
    ABORTED when ``check`` comes first, ERROR when ``peek`` does. Node 1 runs ``peek`` without
    waiting for ``check``'s decision (it writes nothing), and its error used to win even
    where ``check`` came first."""

    def plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        def check(ctx: PieceContext) -> None:
            ctx.abort("too low")

        def peek(ctx: PieceContext) -> None:
            raise RuntimeError("a bug")

        pieces = [
            Piece("check", check, reads=(("kv", 1),), may_abort=True),
            Piece("peek", peek, reads=(("kv", 12),)),
        ]
        return pieces if params["check_first"] else pieces[::-1]

    registry = ProcedureRegistry([Procedure("both", {"check_first": bool, "keys": list}, plan)])
    batch = [TxnRequest("both", {"check_first": first == 0, "keys": [1, 12]})]
    serial = get_protocol("serial")(_db(), registry).run_batch(batch)[0]
    router = Router(_TwoNodes(), Placement.round_robin(2))
    run_class = server_class(protocol).epoch_run
    runs = [run_class(node, _db(), registry, router, [batch, []]) for node in (0, 1)]
    _run_to_the_end(runs)
    assembler = ResultAssembler(registry, batch, 2)
    for node in (1, 0):
        assembler.add(node, _wire(runs[node].reports().get(0, [])))
    assert assembler.outcomes() == [serial]
    assert serial.status is (Status.ABORTED if first == 0 else Status.ERROR)


def test_a_negative_partition_from_route_partitions_is_no_route() -> None:
    """Python took partition -1 as the last node's: a call went to a node chosen by index
    wraparound. It is now a routing error (every node plans the call and fails it alike)."""

    class _Negative(_TwoNodes):
        def route_partitions(self, procedure, params, partitions):
            return params["parts"]

    router = Router(_Negative(), Placement.round_robin(2))
    route = router.route
    assert route(TxnRequest("bump", {"keys": [1], "parts": [1]})) == frozenset({1})
    assert route(TxnRequest("bump", {"keys": [1], "parts": [-1]})) is None
    assert route(TxnRequest("bump", {"keys": [1], "parts": [0, -2]})) is None


@pytest.mark.parametrize("protocol", ["serial", "dgcc", "no_wait", "wait_die", "occ"])
def test_a_row_an_index_cannot_key_fails_its_call_and_changes_nothing(protocol: str) -> None:
    """A piece inserts a row without the field an index keys on (and updates one to an
    unhashable key): the call fails alone, the table and its index stay as they were (the
    row used to be stored before its index entry failed, undeletable after), and OCC fails
    the piece, not the whole batch at commit."""
    from dgcc.storage import Index

    def schema() -> Database:
        by_last = Index("by_last", lambda pk, row: row["last"], frozenset({"last"}))
        return Database((Table("c", indexes=(by_last,)),))

    def plan(params: Mapping[str, Any], view: object) -> list[Piece]:
        def write(ctx: PieceContext) -> None:
            if params["kind"] == "insert":
                ctx.insert("c", 2, {"x": 1})  # no "last"
            else:
                ctx.update("c", 1, {"last": ["unhashable"]})

        key = ("c", 2) if params["kind"] == "insert" else ("c", 1)
        return [Piece("write", write, writes=(key,))]

    registry = ProcedureRegistry([Procedure("write", {"kind": str}, plan)])
    db = schema()
    db["c"].insert(1, {"last": "a", "x": 0})
    engine = get_protocol(protocol)(db, registry)
    outcomes = engine.run_batch([TxnRequest("write", {"kind": k}) for k in ("insert", "update")])
    assert [o.status for o in outcomes] == [Status.ERROR, Status.ERROR]
    assert db["c"].rows == {1: {"last": "a", "x": 0}}
    assert db["c"].indexes["by_last"].lookup("a") == [1]
    db["c"].delete(1)  # its index entry is where it should be
