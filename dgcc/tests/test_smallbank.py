"""Smallbank workload: money conservation over a long skewed run, logic aborts, bad input.

Method: run many batches of the standard mix with a hotspot under DGCC (several executors) and
check conservation against the flows reported by committed results; then plant a leak and
check that the checker reports it.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from dgcc import ConfigError, Status, TxnRequest, get_protocol
from dgcc.workloads import get_workload

pytestmark = pytest.mark.usefixtures("invariants")


@pytest.mark.slow
def test_money_is_conserved_over_a_long_skewed_run() -> None:
    workload = get_workload("smallbank", accounts=500, hot_accounts=20, hot_fraction=0.8)
    db = workload.build(4)
    engine = get_protocol("dgcc")(db, workload.registry(), executors=4, shuffle_seed=9)
    stream = workload.requests(5)
    statuses: Counter[str] = Counter()
    for _ in range(40):
        batch = list(itertools.islice(stream, 250))
        outcomes = engine.run_batch(batch)
        workload.observe(batch, outcomes)
        statuses.update(f"{o.status.value}:{o.reason}" for o in outcomes)
    assert workload.check(db) == []
    assert statuses["committed:"] > 7000
    assert statuses["aborted:insufficient funds"] > 0
    assert statuses["aborted:savings would go negative"] > 0
    assert not any(key.startswith("error") for key in statuses)
    db["checking"].rows[0]["bal"] += 1  # money from nowhere
    assert any("money not conserved" in problem for problem in workload.check(db))


def test_each_transaction_and_its_aborts() -> None:
    workload = get_workload("smallbank", accounts=10)
    db = workload.build(1)
    for table in ("savings", "checking"):
        for customer in range(10):
            db[table].rows[customer]["bal"] = 1000
    engine = get_protocol("dgcc")(db, workload.registry(), executors=2)
    batch = [
        TxnRequest("balance", {"customer": 0}),
        TxnRequest("deposit_checking", {"customer": 0, "amount": 50}),
        TxnRequest("deposit_checking", {"customer": 0, "amount": -5}),
        TxnRequest("transact_savings", {"customer": 1, "amount": -1001}),
        TxnRequest("transact_savings", {"customer": 1, "amount": -1000}),
        TxnRequest("write_check", {"customer": 2, "amount": 2500}),  # overdraft: penalty
        TxnRequest("send_payment", {"source": 3, "target": 4, "amount": 1001}),
        TxnRequest("send_payment", {"source": 3, "target": 4, "amount": 1000}),
        TxnRequest("amalgamate", {"source": 5, "target": 6}),
        TxnRequest("balance", {"customer": 6}),
    ]
    outcomes = engine.run_batch(batch)
    workload.observe(batch, outcomes)
    assert [o.reason for o in outcomes if o.status is Status.ABORTED] == [
        "negative deposit",
        "savings would go negative",
        "insufficient funds",
    ]
    assert outcomes[0].result == {"balance_cents": 2000, "flow_cents": 0}
    assert outcomes[5].result == {"flow_cents": -2600}
    assert outcomes[9].result["balance_cents"] == 4000
    assert db["checking"].rows[2]["bal"] == -1600
    assert (db["checking"].rows[3]["bal"], db["checking"].rows[4]["bal"]) == (0, 2000)
    flows = sum(o.result["flow_cents"] for o in outcomes if o.committed)
    assert flows == 50 - 1000 - 2600
    total = sum(row["bal"] for t in ("savings", "checking") for row in db[t].rows.values())
    assert total == 20 * 1000 + flows


@pytest.mark.parametrize(
    "options",
    [{"accounts": 1}, {"hot_accounts": 1}, {"hot_fraction": 1.5}, {"accounts": "9"}],
)
def test_bad_options_raise_config_error(options: dict) -> None:
    with pytest.raises(ConfigError, match="smallbank"):
        get_workload("smallbank", **options)


def test_unknown_customers_and_bad_amounts_are_errors() -> None:
    workload = get_workload("smallbank", accounts=10)
    db = workload.build(1)
    engine = get_protocol("serial")(db, workload.registry())
    outcomes = engine.run_batch(
        [
            TxnRequest("balance", {"customer": 10}),
            TxnRequest("send_payment", {"source": 1, "target": -1, "amount": 5}),
            TxnRequest("send_payment", {"source": 1, "target": 2, "amount": 0}),
            TxnRequest("write_check", {"customer": 1, "amount": 1.5}),
            TxnRequest("write_check", {"customer": 1, "amount": 2**64 - 1}),
            TxnRequest("deposit_checking", {"customer": 1, "amount": -(10**12) - 1}),
        ]
    )
    assert [o.status for o in outcomes] == [Status.ERROR] * 6
    assert "unknown customer 10" in outcomes[0].reason
    assert "amount=18446744073709551615 outside -1,000,000,000,000..1,000,000" in outcomes[4].reason
    assert "amount=-1000000000001 outside" in outcomes[5].reason


def test_hotspot_skews_requests_and_partitioning_is_by_customer() -> None:
    workload = get_workload("smallbank", accounts=1000, hot_accounts=10, hot_fraction=0.9)
    customers = Counter()
    for request in itertools.islice(workload.requests(1), 2000):
        customers.update(v for k, v in request.params.items() if k != "amount")
    hot_set = {workload.hot_customer(j) for j in range(10)}
    assert hot_set == set(range(0, 1000, 100))  # spread over the range partitions
    hot = sum(count for customer, count in customers.items() if customer in hot_set)
    assert hot > 0.8 * sum(customers.values())
    assert workload.partition_of(("savings", 999), 4) == 3
    assert workload.partition_of(("checking", 0), 4) == 0
