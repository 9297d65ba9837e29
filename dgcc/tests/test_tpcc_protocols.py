"""TPC-C under every registered protocol: piece contract, consistency, serial equivalence.

Method: run a few thousand mixed requests (two warehouses, remote lines and payments boosted so
cross-warehouse pieces are common) in batches with ``debug.invariants()`` on, so every access is
checked against the declared conflict keys. The spec's consistency checks must pass after the
run and must fail after each of several planted corruptions. Deterministic protocols must match
the serial executor in every outcome and the final state; others must stay consistent.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

import pytest

from dgcc import PROTOCOLS, Database, Status, debug, get_protocol
from dgcc.workloads import get_workload
from dgcc.workloads.tpcc import TpccWorkload

OPTIONS = {
    "warehouses": 2,
    "items": 500,
    "customers_per_district": 60,
    "orders_per_district": 60,
    "remote_item_fraction": 0.1,
    "remote_payment_fraction": 0.3,
}
REQUESTS = 3000
BATCH = 150


def _run(protocol_name: str, **kwargs: Any) -> tuple[TpccWorkload, Database, list]:
    workload = get_workload("tpcc", **OPTIONS)
    db = workload.build(seed=2)
    protocol = get_protocol(protocol_name)(db, workload.registry(), **kwargs)
    stream = workload.requests(seed=9)
    outcomes = []
    with debug.invariants():
        for _ in range(REQUESTS // BATCH):
            outcomes += protocol.run_batch(list(itertools.islice(stream, BATCH)))
    return workload, db, outcomes


@pytest.fixture(scope="module")
def serial_run() -> tuple[TpccWorkload, Database, list]:
    return _run("serial")


def test_mixed_run_keeps_the_contract_and_consistency(serial_run) -> None:
    workload, db, outcomes = serial_run
    statuses = collections.Counter(outcome.status for outcome in outcomes)
    assert statuses[Status.ERROR] == 0, [o.reason for o in outcomes if o.status is Status.ERROR]
    assert 5 <= statuses[Status.ABORTED] <= 40  # ~1% of ~1350 NewOrders
    assert all("invalid item" in o.reason for o in outcomes if o.status is Status.ABORTED)
    assert workload.check(db) == []
    assert len(db["history"]) > 2 * 10 * 60  # payments landed


def _corruptions() -> dict[str, Any]:
    def bump_d_ytd(db: Database) -> None:
        db["district"].update((1, 4), {"d_ytd": db["district"].get((1, 4))["d_ytd"] + 1})

    def lose_new_order(db: Database) -> None:
        pks = sorted(pk for pk in db["new_order"].rows if pk[:2] == (2, 3))
        db["new_order"].delete(pks[len(pks) // 2])

    def lose_order_line(db: Database) -> None:
        db["order_line"].delete((1, 7, 5, 1))

    def skew_balance(db: Database) -> None:
        db["customer"].update(
            (2, 2, 2), {"c_balance": db["customer"].get((2, 2, 2))["c_balance"] - 1}
        )

    def skip_next_o_id(db: Database) -> None:
        db["district"].update(
            (2, 9), {"d_next_o_id": db["district"].get((2, 9))["d_next_o_id"] + 1}
        )

    def half_deliver(db: Database) -> None:
        db["order_line"].update((1, 1, 60, 1), {"ol_delivery_d": 1})

    return {
        "cond 1:": bump_d_ytd,
        "cond 3:": lose_new_order,
        "cond 4:": lose_order_line,
        "cond 10:": skew_balance,
        "cond 2:": skip_next_o_id,
        "cond 7:": half_deliver,
    }


@pytest.mark.parametrize("condition", list(_corruptions()))
def test_checks_catch_planted_corruption(condition: str) -> None:
    workload = get_workload("tpcc", **OPTIONS)
    db = workload.build(seed=2)
    assert workload.check(db) == []
    _corruptions()[condition](db)
    violations = workload.check(db)
    assert any(v.startswith(condition) for v in violations), violations


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_protocol_matches_serial_or_stays_consistent(name: str, serial_run) -> None:
    workload, db, outcomes = _run(name)
    _, serial_db, serial_outcomes = serial_run
    assert workload.check(db) == []
    if PROTOCOLS[name].deterministic:
        assert outcomes == serial_outcomes
        assert db.dump() == serial_db.dump()


def test_dgcc_in_shuffled_orders_matches_serial(serial_run) -> None:
    _, db, outcomes = _run("dgcc", executors=4, shuffle_seed=5)
    _, serial_db, serial_outcomes = serial_run
    assert outcomes == serial_outcomes
    assert db.dump() == serial_db.dump()
