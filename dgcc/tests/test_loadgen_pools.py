"""The cluster bench's request pools: ``--distributed-fraction`` is the share of calls that
cross nodes, whatever part of the workload's mix can cross."""

from __future__ import annotations

import pytest

from dgcc.cluster import local_config
from dgcc.errors import ConfigError
from dgcc.net.loadgen import request_pool

TPCC = {"warehouses": 2, "items": 200, "customers_per_district": 30, "orders_per_district": 30}
CALLS = 6000


def _crosses(request, home: int) -> bool:
    params = request.params
    if request.procedure == "new_order":
        return any(supply != home for _, supply, _ in params["lines"])
    return request.procedure == "payment" and params["c_w_id"] != home


def _home(request) -> int:
    return request.params["w_id"]


@pytest.mark.parametrize("fraction", [0.1, 0.5])
def test_a_tpcc_fraction_is_the_share_of_all_calls_that_cross(fraction: float) -> None:
    """Only NewOrder and Payment can touch another warehouse (88% of the standard mix), so
    each crosses with fraction / 0.88: 10% asked is 10% of all calls, not 8.8%."""
    config = local_config(2, workload="tpcc", workload_options=TPCC)
    pool = request_pool(config, 0, fraction, seed=5, count=CALLS)
    crossed = sum(_crosses(request, _home(request)) for request in pool) / CALLS
    assert fraction - 0.01 < crossed < fraction + 0.01, crossed  # 6000 draws: sd <= 0.65%
    assert {_home(request) for request in pool} == {1}  # node 0's warehouse (of 1, 2)


def test_a_tpcc_fraction_above_what_can_cross_makes_every_neworder_and_payment_cross() -> None:
    config = local_config(2, workload="tpcc", workload_options=TPCC)
    pool = request_pool(config, 1, 1.0, seed=5, count=CALLS)
    can_cross = [r for r in pool if r.procedure in ("new_order", "payment")]
    assert all(_crosses(request, 2) for request in can_cross)
    assert 0.85 < len(can_cross) / CALLS < 0.91  # 45% + 43% of the standard mix


def test_a_tpcc_fraction_with_no_call_that_can_cross_is_a_config_error() -> None:
    options = TPCC | {"mix": {"order_status": 50.0, "stock_level": 50.0}}
    config = local_config(2, workload="tpcc", workload_options=options)
    with pytest.raises(ConfigError, match="needs new_order or payment in the mix"):
        request_pool(config, 0, 0.1, seed=5, count=10)
    assert len(request_pool(config, 0, 0.0, seed=5, count=10)) == 10  # none asked: fine


@pytest.mark.parametrize(
    ("workload", "options", "fraction", "needle"),
    [
        # each of 4 partitions holds 5 keys: a call's 10 distinct keys were drawn forever
        ("ycsb", {"records": 20, "ops_per_txn": 10}, 0.0, "leave 5 in one, fewer than ops_per"),
        # one key cannot be on its own node and another: the calls only moved node
        ("ycsb", {"records": 1000, "ops_per_txn": 1}, 0.5, "needs ops_per_txn >= 2, got 1"),
        # 3 accounts over 4 partitions left one empty: a ZeroDivisionError
        ("smallbank", {"accounts": 3}, 0.0, "leave 0 in one, and a call takes 2 accounts"),
    ],
)
def test_partitions_too_small_for_a_pools_calls_are_refused(workload, options, fraction, needle):
    from dgcc.net.loadgen import ClusterBenchConfig, bench_cluster_config

    config = local_config(4, workload=workload, workload_options=options)
    with pytest.raises(ConfigError, match=needle):
        request_pool(config, 0, fraction, seed=1, count=5)
    bench = ClusterBenchConfig(workload, 4, fraction, options)
    with pytest.raises(ConfigError, match=needle):  # before any process starts
        bench_cluster_config(bench, None)


def test_ycsb_draws_every_key_of_a_longer_partition():
    """41 records on 2 nodes: ranges of 21 and 20 keys. One Zipf draw over the shorter length
    served both, so node 0 never drew its key 20."""
    config = local_config(
        2, workload="ycsb", workload_options={"records": 41, "ops_per_txn": 2, "theta": 0.0}
    )
    drawn = {
        key for request in request_pool(config, 0, 0.0, 1, 3000) for key in request.params["keys"]
    }
    assert drawn == set(range(21))


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.6])
def test_a_smallbank_fraction_crosses_through_two_customer_calls_and_keeps_the_mix(fraction):
    """Only Amalgamate and SendPayment name a second customer (40% of the mix): each crosses
    with fraction / 0.4 (capped at all of them), and the mix stays the standard one."""
    from collections import Counter

    from dgcc.workloads import get_workload

    config = local_config(2, workload="smallbank", workload_options={"accounts": 1000})
    workload = get_workload("smallbank", accounts=1000)
    pool = request_pool(config, 0, fraction, seed=3, count=CALLS)
    crossing = [
        r for r in pool if any(key[1] >= 500 for key in workload.route_keys(r.procedure, r.params))
    ]
    assert len(crossing) / CALLS == pytest.approx(min(fraction, 0.4), abs=0.03)
    assert {r.procedure for r in crossing} <= {"amalgamate", "send_payment"}
    mix = Counter(r.procedure for r in pool)
    assert mix["send_payment"] / CALLS == pytest.approx(0.25, abs=0.03)
    assert mix["balance"] / CALLS == pytest.approx(0.15, abs=0.03)


def test_ycsb_hot_keys_are_spread_over_the_range_partitions():
    """The workload's own stream scatters the zipfian's ranks, so at theta 0.99 no range
    partition takes most of the accesses (the hottest ranks all sat on the first one)."""
    import itertools
    from collections import Counter

    from dgcc.workloads import get_workload

    workload = get_workload("ycsb", records=100_000, theta=0.99)
    shares = Counter()
    for request in itertools.islice(workload.requests(1), 4000):
        shares.update(key * 4 // 100_000 for key in request.params["keys"])
    total = sum(shares.values())
    assert all(0.15 < shares[p] / total < 0.4 for p in range(4)), shares
