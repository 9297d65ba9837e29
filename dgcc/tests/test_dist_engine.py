"""DistDGCC epoch logic in one process: N simulated nodes against the serial executor.

Method: every node builds the workload's data, runs each epoch with ``EpochRun``; value
messages and reports go through the real wire codec and are delivered in a seeded random
order, one batch at a time, so a node often runs out of ready pieces and must wait. The
union of the nodes' owned rows and every outcome must equal the serial executor run over the
same global order, epoch by epoch.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgcc import debug
from dgcc.api import Outcome, TxnRequest
from dgcc.net.wire import decode, encode
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.protocols.dist_placement import Placement, Router
from dgcc.protocols.dist_results import ResultAssembler
from dgcc.protocols.serial import SerialProtocol
from dgcc.workloads import get_workload

WORKLOADS = {
    "tpcc": {
        "warehouses": 4,
        "items": 200,
        "customers_per_district": 30,
        "orders_per_district": 30,
        "remote_item_fraction": 0.2,
        "remote_payment_fraction": 0.3,
    },
    "ycsb": {"records": 400, "ops_per_txn": 4, "theta": 0.9},
    "smallbank": {"accounts": 60, "hot_fraction": 0.5},
}


def _wire(message):
    return decode(encode(("m", message)))[1]


def simulate(cluster_sim, workload_name, nodes, epochs, per_node, seed, sparse=False):
    """``EpochRun`` nodes simulated by conftest's ``simulate_cluster``."""
    workload = get_workload(workload_name, **WORKLOADS[workload_name])
    order, outcomes, merged = cluster_sim(
        EpochRun, workload, nodes, epochs, per_node, seed, sparse=sparse
    )
    return workload, order, outcomes, merged


def serial_run(workload, order, seed):
    db = workload.build(seed)
    serial = SerialProtocol(db, workload.registry())
    outcomes: list[Outcome] = []
    for batch in order:
        outcomes.extend(serial.run_batch(batch))
    return outcomes, db.dump()


def _normal(outcome: Outcome):
    return _wire((outcome.status.value, outcome.result, outcome.reason))


@pytest.mark.parametrize("workload_name", sorted(WORKLOADS))
@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_simulated_cluster_equals_serial(cluster_sim, workload_name, nodes):
    with debug.invariants():
        workload, order, outcomes, merged = simulate(
            cluster_sim, workload_name, nodes, 3, 40, seed=nodes
        )
        expected, dump = serial_run(workload, order, seed=nodes)
    assert [_normal(o) for o in outcomes] == [_normal(o) for o in expected]
    assert _wire(merged) == _wire(dump)
    statuses = {o.status.value for o in outcomes}
    assert "committed" in statuses


@pytest.mark.parametrize("workload_name", sorted(WORKLOADS))
def test_sparse_inputs_equal_serial(cluster_sim, workload_name):
    """Nodes given only the peers' calls routed to them (None elsewhere) still match serial."""
    for checks in (True, False):
        with debug.invariants(checks):
            workload, order, outcomes, merged = simulate(
                cluster_sim, workload_name, 3, 3, 40, 11, sparse=True
            )
            expected, dump = serial_run(workload, order, seed=11)
        assert [_normal(o) for o in outcomes] == [_normal(o) for o in expected]
        assert _wire(merged) == _wire(dump)


def test_multi_node_transactions_happen():
    workload = get_workload("ycsb", **WORKLOADS["ycsb"])
    router = Router(workload, Placement.round_robin(2))
    request = TxnRequest("ycsb_txn", {"keys": [1, 399], "rmw": [True, True]})
    assert router.route(request) == frozenset({0, 1})
    assert router.route(TxnRequest("nope", {})) is None


def test_routes_computed_once_per_kept_batch(monkeypatch):
    """A batch routed with keep=True is not routed again when planned; others are."""
    workload = get_workload("ycsb", **WORKLOADS["ycsb"])
    router = Router(workload, Placement.round_robin(2))
    batch = [TxnRequest("ycsb_txn", {"keys": [k, 399], "rmw": [True, False]}) for k in (1, 2)]
    routed = []
    real_route = router.route
    monkeypatch.setattr(
        router, "route", lambda request: routed.append(request) or real_route(request)
    )
    kept = router.routes(batch, keep=True)
    assert kept == [frozenset({0, 1})] * 2 and len(routed) == 2
    assert router.routes(batch, keep=False) == kept and len(routed) == 2  # taken back
    assert router.routes(batch, keep=False) == kept and len(routed) == 4  # computed again
    assert router.routes(list(batch), keep=False) == kept and len(routed) == 6  # another list
    assert router.routes([None, batch[0]], keep=False) == [None, frozenset({0, 1})]


@pytest.mark.parametrize("workload_name", sorted(WORKLOADS))
def test_fast_path_without_invariant_checks_equals_serial(cluster_sim, workload_name):
    """Single-node transactions skip placement when checks are off; still equal to serial."""
    with debug.invariants(False):
        workload, order, outcomes, merged = simulate(cluster_sim, workload_name, 2, 3, 40, seed=7)
        expected, dump = serial_run(workload, order, seed=7)
    assert [_normal(o) for o in outcomes] == [_normal(o) for o in expected]
    assert _wire(merged) == _wire(dump)


def test_canary_without_cross_node_abort_edges_diverges(cluster_sim, monkeypatch):
    """A planted bug (remote writes not waiting for abort decisions) must be caught."""
    monkeypatch.setattr(EpochRun, "abort_edges", False)
    with debug.invariants():
        workload, order, outcomes, merged = simulate(cluster_sim, "smallbank", 2, 3, 40, seed=5)
        expected, dump = serial_run(workload, order, seed=5)
    same_outcomes = [_normal(o) for o in outcomes] == [_normal(o) for o in expected]
    assert not (same_outcomes and _wire(merged) == _wire(dump))


@settings(max_examples=12)
@given(seed=st.integers(0, 2**20), nodes=st.integers(2, 4), name=st.sampled_from(sorted(WORKLOADS)))
def test_any_message_order_equals_serial(cluster_sim, seed, nodes, name):
    """Property: for any seed (stream, message order, slices), state and results match."""
    with debug.invariants():
        workload, order, outcomes, merged = simulate(cluster_sim, name, nodes, 2, 15, seed=seed)
        expected, dump = serial_run(workload, order, seed=seed)
    assert [_normal(o) for o in outcomes] == [_normal(o) for o in expected]
    assert _wire(merged) == _wire(dump)


def test_answers_are_the_outcomes_in_wire_form():
    """A node answers from ``ResultAssembler.answers`` (no ``Outcome`` per call); they must be
    exactly ``outcomes`` as the wire carries them: commits, logic errors and unknown calls."""
    workload = get_workload("ycsb", records=50, ops_per_txn=2)
    registry, db = workload.registry(), workload.build(1)
    batch = [
        TxnRequest("ycsb_txn", {"keys": [1, 2], "rmw": [True, False]}),
        TxnRequest("ycsb_txn", {"keys": [1, 99], "rmw": [True, False]}),  # key out of range
        TxnRequest("no_such_procedure", {}),
    ]
    router = Router(workload, Placement.round_robin(1))
    run = EpochRun(0, db, registry, router, [batch])
    while not run.finished:
        run.step(10)
    assembler = ResultAssembler(registry, batch, 1)
    assembler.add(0, _wire(run.reports().get(0, [])))
    answers = assembler.answers()
    assert [status for status, _, _ in answers] == ["committed", "error", "error"]
    assert [_wire(answer) for answer in answers] == [_normal(o) for o in assembler.outcomes()]
    assert answers[0][1] == {"read": [(2, 0)], "incremented": [1], "counters": [(1, 1)]}
