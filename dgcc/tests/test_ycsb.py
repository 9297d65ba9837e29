"""YCSB workload: the zipfian generator's distribution, determinism, counters and bad input.

Method: draw many keys and compare frequencies with the exact zipfian probabilities (loose,
seeded bounds); run batches under DGCC and check the counter invariant and that a planted
lost update is reported.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from dgcc import BadParams, ConfigError, Status, TxnRequest, get_protocol
from dgcc.workloads import get_workload
from dgcc.workloads.ycsb import ZipfianGenerator

pytestmark = pytest.mark.usefixtures("invariants")


def test_zipfian_theta_zero_is_uniform() -> None:
    zipf = ZipfianGenerator(10, 0.0, seed=1)
    counts = Counter(zipf.next() for _ in range(20_000))
    assert set(counts) == set(range(10))
    assert all(1_700 < count < 2_300 for count in counts.values()), counts


@pytest.mark.parametrize("theta", [0.5, 0.8, 0.99])
def test_zipfian_matches_exact_probabilities(theta: float) -> None:
    zipf = ZipfianGenerator(1000, theta, seed=2)
    draws = 40_000
    counts = Counter(zipf.next() for _ in range(draws))
    assert all(0 <= key < 1000 for key in counts)
    for item in (0, 1, 2, 5, 20):
        expected = zipf.probability(item) * draws
        # The method is exact for items 0 and 1 and close after; 25% + 4 sigma is generous.
        assert abs(counts[item] - expected) < 0.25 * expected + 4 * expected**0.5, (item, counts)
    top_ten = sum(counts[item] for item in range(10)) / draws
    assert top_ten == pytest.approx(sum(zipf.probability(i) for i in range(10)), abs=0.03)


def test_zipfian_is_deterministic_and_skew_grows_with_theta() -> None:
    def draws(theta: float, seed: int) -> list[int]:
        zipf = ZipfianGenerator(500, theta, seed=seed)
        return [zipf.next() for _ in range(5000)]

    assert draws(0.9, 5) == draws(0.9, 5)
    assert draws(0.9, 5) != draws(0.9, 6)
    hottest = {theta: draws(theta, 3).count(0) for theta in (0.0, 0.5, 0.99)}
    assert hottest[0.0] < hottest[0.5] < hottest[0.99]


@pytest.mark.parametrize(
    ("items", "theta"), [(0, 0.5), (10, 1.0), (10, -0.1), (10, "x"), (True, 0.5)]
)
def test_zipfian_rejects_bad_arguments(items, theta) -> None:
    with pytest.raises(ConfigError):
        ZipfianGenerator(items, theta, seed=0)


@pytest.mark.parametrize(
    "options",
    [
        {"records": 0},
        {"theta": 1.2},
        {"read_ratio": 2},
        {"ops_per_txn": 20, "records": 10},
        {"fields": "3"},
    ],
)
def test_bad_options_raise_config_error(options: dict) -> None:
    with pytest.raises(ConfigError, match="ycsb"):
        get_workload("ycsb", **options)


def test_requests_are_deterministic_with_distinct_keys() -> None:
    workload = get_workload("ycsb", records=50, theta=0.99, ops_per_txn=10)
    first = list(itertools.islice(workload.requests(3), 200))
    assert first == list(itertools.islice(workload.requests(3), 200))
    assert all(len(set(request.params["keys"])) == 10 for request in first)


def test_counters_equal_committed_increments_and_a_lost_update_is_caught() -> None:
    workload = get_workload("ycsb", records=200, theta=0.9, read_ratio=0.3)
    db = workload.build(1)
    engine = get_protocol("dgcc")(db, workload.registry(), executors=3)
    stream = workload.requests(2)
    for _ in range(10):
        batch = list(itertools.islice(stream, 50))
        outcomes = engine.run_batch(batch)
        assert all(outcome.status is Status.COMMITTED for outcome in outcomes)
        workload.observe(batch, outcomes)
    assert workload.check(db) == []
    assert sum(row["counter"] for row in db["usertable"].rows.values()) > 1000
    hot = max(db["usertable"].rows, key=lambda pk: db["usertable"].rows[pk]["counter"])
    db["usertable"].rows[hot]["counter"] -= 1  # a lost update
    problems = workload.check(db)
    assert any(f"record {hot}" in problem for problem in problems)
    assert any("sum of counters" in problem for problem in problems)


def test_bad_params_are_errors() -> None:
    workload = get_workload("ycsb", records=10)
    db = workload.build(1)
    engine = get_protocol("dgcc")(db, workload.registry())
    batch = [
        TxnRequest("ycsb_txn", {"keys": [1, 2], "rmw": [True]}),
        TxnRequest("ycsb_txn", {"keys": [99], "rmw": [True]}),
        TxnRequest("ycsb_txn", {"keys": [1], "rmw": [1]}),
        TxnRequest("ycsb_txn", {"keys": [True], "rmw": [False]}),
        TxnRequest("ycsb_txn", {"keys": [3], "rmw": [True]}),
    ]
    outcomes = engine.run_batch(batch)
    assert [o.status for o in outcomes] == [Status.ERROR] * 4 + [Status.COMMITTED]
    assert outcomes[4].result == {"read": [], "incremented": [3], "counters": [(3, 1)]}
    with pytest.raises(BadParams):
        workload.registry().get("ycsb_txn").plan({"keys": [], "rmw": []}, db.read_view())


def test_partition_of_is_by_key_range() -> None:
    workload = get_workload("ycsb", records=100)
    assert [workload.partition_of(("usertable", pk), 4) for pk in (0, 24, 25, 99)] == [0, 0, 1, 3]
    with pytest.raises(ConfigError):
        workload.partition_of(("other", 1), 4)


def test_route_partitions_agree_with_route_keys() -> None:
    workload = get_workload("ycsb", records=100, ops_per_txn=5, theta=0.9)
    for request in itertools.islice(workload.requests(3), 200):
        keys = workload.route_keys(request.procedure, request.params)
        expected = {workload.partition_of(key, 3) for key in keys}
        assert workload.route_partitions(request.procedure, request.params, 3) == expected
    skipping = {"keys": [90, 1], "rmw": [True, False]}  # partitions 2 and 0, none in between
    assert workload.route_partitions("ycsb_txn", skipping, 3) == {0, 2}
    for bad in ([-1, 5], [5, 100]):
        with pytest.raises(ValueError, match="outside"):
            workload.route_partitions("ycsb_txn", {"keys": bad, "rmw": [True, True]}, 3)
    assert workload.route_partitions("other", {}, 3) is None


def test_a_long_call_keeps_its_results_in_access_order() -> None:
    workload = get_workload("ycsb", records=100)
    engine = get_protocol("dgcc")(workload.build(1), workload.registry())
    keys = list(range(99, 59, -1))  # 40 accesses: more positions than any earlier call
    rmw = [position % 3 == 0 for position in range(40)]
    (outcome,) = engine.run_batch([TxnRequest("ycsb_txn", {"keys": keys, "rmw": rmw})])
    assert outcome.result["incremented"] == [k for k, w in zip(keys, rmw, strict=True) if w]
    assert outcome.result["read"] == [(k, 0) for k, w in zip(keys, rmw, strict=True) if not w]
