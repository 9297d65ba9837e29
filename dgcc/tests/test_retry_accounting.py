"""Retries, give-ups and WAIT_DIE ages are counted and kept as documented.

Goal: ``ATTEMPTS_MAX`` of the 2PC servers is attempts in all (the first included) and the
counted retries are the attempts after the first, with a backoff before each and none after the
last; the in-process protocols' ``retries_max`` is retries (``retries_max + 1`` attempts). A call
given up after its retries is reported apart from logic aborts, by the 2PC node (``txn/gave_up``),
by the cluster load generator and by the in-process bench (``txn/gave_up``,
``txn/gave_up_rate``), so ``txn/abort_rate`` is logic aborts only. In-process WAIT_DIE keeps a
transaction's first-attempt timestamp across restarts, so the oldest active transaction never
dies, and the bench resubmits a given-up call ahead of every fresh one. Method: scripted protocols
and outcomes where the count is the point; real protocols and in-process 2-node clusters
(YCSB, keys 0..49 on node 0) where the behaviour is.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from types import SimpleNamespace

import pytest

from dgcc import Status, TxnRequest, get_protocol
from dgcc.api import Outcome, Piece, Procedure, ProcedureRegistry
from dgcc.bench import RESUBMISSIONS_MAX as BENCH_RESUBMISSIONS
from dgcc.bench import BenchConfig, Runner
from dgcc.cluster import local_config
from dgcc.net import AsyncClient, loadgen
from dgcc.net.servers import server_class, twopc
from dgcc.protocols._locking import Attempt, Verdict
from dgcc.protocols.wait_die import WaitDieProtocol
from dgcc.storage import Database, Table
from dgcc.workloads import get_workload

WAIT_S = 20.0
GIVE_UP = Outcome(Status.ABORTED, reason="retry: no_wait gave up after 1000 attempts")
LOGIC_ABORT = Outcome(Status.ABORTED, reason="insufficient funds")
COMMITTED = Outcome(Status.COMMITTED, {"incremented": []})


# -- item: ATTEMPTS_MAX of the 2PC servers -----------------------------------------------------


@pytest.mark.parametrize("protocol", ["no_wait", "wait_die"])
def test_2pc_retries_max_is_attempts_and_the_retries_counted_are_the_ones_made(
    protocol: str, monkeypatch
) -> None:
    """Key 3 stays locked by an older branch: every attempt of a call on it aborts. With
    ATTEMPTS_MAX = 3 the call makes 3 attempts, 2 retries (2 backoffs), and is answered as a
    give-up, counted under ``txn/gave_up``, not ``txn/aborted``. Before, the retries counted 3
    (one per cc abort, the last included) and a backoff was slept after the last attempt."""
    monkeypatch.setattr(twopc, "ATTEMPTS_MAX", 3)
    config = local_config(2, workload="ycsb", workload_options={"records": 100},
                          protocol=protocol)  # fmt: skip
    nodes = [server_class(protocol)(config, node) for node in (0, 1)]
    request = TxnRequest("ycsb_txn", {"keys": [3], "rmw": [True]})

    async def go() -> tuple[Outcome, dict, int]:
        await asyncio.gather(*(node.start() for node in nodes))
        coordinator = nodes[0]
        draws = []
        uniform = coordinator._backoff.uniform
        coordinator._backoff.uniform = lambda a, b: draws.append(b) or uniform(a, b)
        try:  # a branch node 1 coordinates, older than any call (WAIT_DIE: callers die)
            kind, _ = await coordinator._run_pieces((1, 10**6, 0, 0), (0, 1, 10**6), request,
                                                    [0], {})  # fmt: skip
            assert kind == "ok"
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                outcome = await client.call(request.procedure, request.params, timeout_s=WAIT_S)
            return outcome, dict(coordinator.stats), len(draws)
        finally:
            for node in nodes:
                node.stop()

    outcome, stats, backoffs = asyncio.run(go())
    assert outcome.status is Status.ABORTED and outcome.reason.startswith("retry"), outcome
    assert "after 3 attempts" in outcome.reason
    assert (stats["txn/attempts"], stats["txn/cc_aborts"], stats["txn/retries"]) == (3, 3, 2)
    assert backoffs == 2
    assert (stats["txn/gave_up"], stats["txn/aborted"]) == (1, 0)


# -- item: retries_max of the in-process protocols --------------------------------------------


def _one_piece_registry() -> ProcedureRegistry:
    def plan(params, view):
        return [Piece("touch", lambda ctx: None, reads=(("t", 0),))]

    return ProcedureRegistry([Procedure("touch", {}, plan)])


@pytest.mark.parametrize("retries_max", [0, 2])
@pytest.mark.parametrize("protocol", ["no_wait", "wait_die", "occ"])
def test_in_process_retries_max_is_retries_not_attempts(protocol: str, retries_max: int) -> None:
    """Every attempt is refused: the transaction makes ``retries_max + 1`` attempts, the
    counted retries are ``retries_max``, and it ends a give-up naming its attempts."""
    attempts = []

    class Refusing(get_protocol(protocol)):  # type: ignore[misc, valid-type]
        def before_piece(self, attempt: Attempt) -> tuple[Verdict, str]:
            attempts.append(attempt.tries)
            return Verdict.ABORT, "refused"

    db = Database((Table("t"),))
    db["t"].insert(0, {"n": 0})
    engine = Refusing(db, _one_piece_registry(), retries_max=retries_max)
    (outcome,) = engine.run_batch([TxnRequest("touch", {})])
    assert attempts == list(range(1, retries_max + 2))
    assert engine.stats[f"{protocol}/retries"] == retries_max
    assert engine.stats[f"{protocol}/gave_up"] == 1
    assert outcome.status is Status.ABORTED and outcome.reason.startswith("retry")
    assert outcome.reason.endswith(f"after {retries_max + 1} attempts"), outcome.reason


# -- item: give-ups are not logic aborts ------------------------------------------------------


class _Scripted:
    """Answers each request by the kind it got on first sight, in turn: a give-up (forever), a
    logic abort, a commit. Keeps every batch it ran."""

    def __init__(self) -> None:
        self.kinds: dict[int, Outcome] = {}
        self.batches: list[list[TxnRequest]] = []

    def run_batch(self, batch: list[TxnRequest]) -> list[Outcome]:
        self.batches.append(list(batch))  # also keeps the requests alive: ids stay unique
        cycle = (GIVE_UP, LOGIC_ABORT, COMMITTED)
        return [self.kinds.setdefault(id(r), cycle[len(self.kinds) % 3]) for r in batch]


def test_bench_counts_give_ups_apart_from_logic_aborts() -> None:
    """A call still given up after its resubmissions counts under ``txn/gave_up``; the abort
    rate is logic aborts only. Before, it counted as an abort (``txn/aborts/retry: ...``), and
    ``txn/abort_rate`` mixed concurrency-control give-ups into the logic aborts. A resubmitted
    call leads its next batch (older than every fresh call there, for WAIT_DIE)."""
    config = BenchConfig(workload="ycsb", protocol="serial", batch_size=3, seconds=1,
                         warmup_s=0, workload_options={"records": 50})  # fmt: skip
    runner = Runner(config)
    scripted = runner.protocol = _Scripted()  # type: ignore[assignment]
    for _ in range(BENCH_RESUBMISSIONS + 1):
        runner._run_one_batch(runner.window)
    doomed = scripted.batches[0][0]
    assert all(batch[0] is doomed for batch in scripted.batches)  # resubmitted at the head
    metrics = runner.metrics()
    completed = metrics["txn/committed"] + metrics["txn/aborted"] + metrics["txn/gave_up"]
    assert metrics["txn/gave_up"] == 1
    assert metrics["txn/aborted"] == sum(o is LOGIC_ABORT for o in scripted.kinds.values())
    assert metrics["txn/abort_rate"] == metrics["txn/aborted"] / completed
    assert metrics["txn/gave_up_rate"] == 1 / completed
    assert not [key for key in metrics if key.startswith("txn/aborts/retry")]


class _NoClient:
    in_flight = 0

    def submit(self, procedure, params, callback) -> None:
        pass


def test_loadgen_counts_2pc_give_ups_apart_from_logic_aborts() -> None:
    """Over the wire a give-up is an ABORTED outcome too: the client counts it as ``gave_up``,
    and ``txn/abort_rate`` is logic aborts only. Before, both were ``aborted``."""
    pool = [TxnRequest("ycsb_txn", {"keys": [1], "rmw": [True]})]
    loop = loadgen._ClosedLoop(_NoClient(), pool, measure_from=0.0, until=time.time() + 3600)
    error = Outcome(Status.ERROR, reason="node 1 is lost")
    for outcome in (COMMITTED, LOGIC_ABORT, GIVE_UP, GIVE_UP, error):
        loop._answered(time.time(), outcome)
    assert loop.counts == {"committed": 1, "aborted": 1, "gave_up": 2, "error": 1}
    keys = ["txn/committed", "txn/multi_node", "txn/executed", "timing_s/cpu"]
    keys += ["net/peer_messages", "net/peer_bytes", "timing_s/wait_inputs", "timing_s/wait_values"]
    result = {"counts": loop.counts, "latencies_ms": loop.latencies_ms, "cpu_s": 0.0}
    bench = loadgen.ClusterBenchConfig(workload="ycsb", nodes=1, seconds=1.0)
    record = loadgen._record(bench, SimpleNamespace(workload_options={}), [result],
                             dict.fromkeys(keys, 0), dict.fromkeys(keys, 1))  # fmt: skip
    metrics = record["metrics"]
    assert metrics["txn/abort_rate"] == pytest.approx(1 / 5)
    assert metrics["txn/gave_up_rate"] == pytest.approx(2 / 5)
    assert metrics["txn/gave_up"] == 2 and metrics["txn/txns_per_s"] == 5


# -- item: WAIT_DIE ages across restarts ------------------------------------------------------


class _AgeSpy(WaitDieProtocol):
    """WAIT_DIE recording every timestamp each request ran under, and every death of the
    oldest active transaction."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ages: dict[int, set[tuple[int, int]]] = {}
        self.oldest_died = 0

    def before_piece(self, attempt: Attempt) -> tuple[Verdict, str]:
        self.ages.setdefault(id(attempt.request), set()).add(attempt.ts)
        verdict, cause = super().before_piece(attempt)
        if verdict is Verdict.ABORT and attempt.ts == min(a.ts for a in self._active):
            self.oldest_died += 1
        return verdict, cause


def test_in_process_wait_die_keeps_first_attempt_ages_across_restarts() -> None:
    """Contended Smallbank: transactions die and restart, each under the timestamp of its
    first attempt (its batch and position), so the oldest active one never dies."""
    workload = get_workload("smallbank", accounts=100, hot_accounts=5, hot_fraction=0.8)
    engine = _AgeSpy(workload.build(seed=5), workload.registry(), inflight=16, seed=1)
    stream = workload.requests(seed=6)
    batches = [list(itertools.islice(stream, 50)) for _ in range(3)]
    for batch in batches:
        engine.run_batch(batch)
    assert engine.stats["wait_die/retries"] > 0, "no restart: the check is vacuous"
    for number, batch in enumerate(batches):
        for position, request in enumerate(batch):
            assert engine.ages.get(id(request), {(number, position)}) == {(number, position)}
    assert engine.oldest_died == 0
