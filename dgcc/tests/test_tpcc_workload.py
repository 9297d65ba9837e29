"""TPC-C loader, request generator, options and partitioning.

Method: load small scales and compare cardinalities with the spec's formulas and dumps across
seeds; draw long request streams and compare the observed mix and remote fractions with the
spec's; feed bad options and expect a ConfigError naming the value. One slow test loads a full
spec-size warehouse within the benchmark's time budget.
"""

from __future__ import annotations

import collections
import itertools
import random
import time

import pytest

from dgcc import ConfigError
from dgcc.workloads import get_workload, tpcc
from dgcc.workloads.tpcc import REPLICATED, TpccWorkload
from dgcc.workloads.tpcc.schema import C_LAST_LOAD, C_LAST_RUN, last_name, nurand

SMALL = {"items": 200, "customers_per_district": 30, "orders_per_district": 30}


def test_public_names() -> None:
    assert sorted(tpcc.__all__) == [
        "MIX_STANDARD",
        "PROCEDURES",
        "REPLICATED",
        "TpccConfig",
        "TpccWorkload",
    ]
    assert all(hasattr(tpcc, name) for name in tpcc.__all__)


def test_registered_under_tpcc() -> None:
    workload = get_workload("tpcc", warehouses=2, **SMALL)
    assert isinstance(workload, TpccWorkload)
    assert workload.describe()["warehouses"] == 2


def test_small_load_cardinalities_follow_the_spec_formulas() -> None:
    db = get_workload("tpcc", warehouses=2, **SMALL).build(seed=1)
    sizes = {name: len(table) for name, table in db.tables.items()}
    assert sizes["warehouse"] == 2
    assert sizes["district"] == 20
    assert sizes["customer"] == sizes["history"] == 20 * 30
    assert sizes["orders"] == 20 * 30
    assert sizes["new_order"] == 20 * 9  # the last 30% of each district's orders
    assert sizes["item"] == 200
    assert sizes["stock"] == 2 * 200
    counts = [row["o_ol_cnt"] for row in db["orders"].rows.values()]
    assert all(5 <= count <= 15 for count in counts)
    assert sizes["order_line"] == sum(counts)
    assert db["district"].get((2, 10))["d_next_o_id"] == 31
    assert {pk[2] for pk in db["new_order"].rows} == set(range(22, 31))


def test_load_is_deterministic_per_seed() -> None:
    workload = get_workload("tpcc", warehouses=1, **SMALL)
    assert workload.build(seed=5).dump() == workload.build(seed=5).dump()
    assert workload.build(seed=5).dump() != workload.build(seed=6).dump()


def test_loaded_rows_respect_the_spec_domains() -> None:
    db = get_workload("tpcc", warehouses=1, items=2000, customers_per_district=1200).build(3)
    customers = list(db["customer"].rows.values())
    assert all(
        row["c_last"] == last_name(row["c_id"] - 1) for row in customers if row["c_id"] <= 1000
    )
    bad_credit = sum(row["c_credit"] == "BC" for row in customers) / len(customers)
    assert 0.07 < bad_credit < 0.13
    original = sum("ORIGINAL" in row["i_data"] for row in db["item"].rows.values()) / 2000
    assert 0.07 < original < 0.13
    stock = db["stock"].get((1, 17))
    assert 10 <= stock["s_quantity"] <= 100
    assert all(len(stock[f"s_dist_{d:02d}"]) == 24 for d in range(1, 11))
    assert all(0 <= row["c_discount"] <= 5000 for row in customers)
    assert 100 <= db["item"].get(5)["i_price"] <= 10_000


def test_last_names_and_nurand() -> None:
    assert last_name(0) == "BARBARBAR"
    assert last_name(371) == "PRICALLYOUGHT"  # the spec's own example
    assert last_name(999) == "EINGEINGEING"
    assert 65 <= abs(C_LAST_RUN - C_LAST_LOAD) <= 119
    assert abs(C_LAST_RUN - C_LAST_LOAD) not in (96, 112)
    draws = random.Random(0).random
    values = [nurand(draws, 1023, 1, 3000, 259) for _ in range(20_000)]
    assert min(values) >= 1
    assert max(values) <= 3000
    top = collections.Counter(values).most_common(1)[0][1]
    assert top > 3 * 20_000 / 3000  # non-uniform: some ids are much hotter than average


def _mix(workload: TpccWorkload, count: int, seed: int = 11) -> list:
    return list(itertools.islice(workload.requests(seed), count))


def test_request_stream_is_deterministic() -> None:
    workload = get_workload("tpcc", warehouses=3, **SMALL)
    assert _mix(workload, 500) == _mix(workload, 500)
    assert _mix(workload, 500) != _mix(workload, 500, seed=12)


def test_request_stream_follows_the_standard_mix_and_remote_fractions() -> None:
    workload = get_workload("tpcc", warehouses=4, **SMALL)
    requests = _mix(workload, 30_000)
    share = collections.Counter(request.procedure for request in requests)
    expected = {"new_order": 45, "payment": 43, "order_status": 4, "delivery": 4, "stock_level": 4}
    for name, percent in expected.items():
        assert abs(100 * share[name] / len(requests) - percent) < 1.0, (name, share)
    payments = [r.params for r in requests if r.procedure == "payment"]
    remote = sum(p["c_w_id"] != p["w_id"] for p in payments) / len(payments)
    assert 0.13 < remote < 0.17
    by_name = sum(p["c_last"] != "" for p in payments) / len(payments)
    assert 0.57 < by_name < 0.63
    orders = [r.params for r in requests if r.procedure == "new_order"]
    lines = [(line, p["w_id"]) for p in orders for line in p["lines"]]
    remote_lines = sum(line[1] != w for line, w in lines) / len(lines)
    assert 0.005 < remote_lines < 0.015
    rollbacks = sum(p["lines"][-1][0] == SMALL["items"] + 1 for p in orders) / len(orders)
    assert 0.005 < rollbacks < 0.016
    assert all(5 <= len(p["lines"]) <= 15 for p in orders)
    assert all(len({line[0] for line in p["lines"]}) == len(p["lines"]) for p in orders)


def test_single_warehouse_never_goes_remote_and_homes_restrict_terminals() -> None:
    single = _mix(get_workload("tpcc", warehouses=1, **SMALL), 3000)
    assert all(r.params.get("c_w_id", 1) == 1 for r in single)
    assert all(
        line[1] == 1 for r in single if r.procedure == "new_order" for line in r.params["lines"]
    )
    homed = _mix(get_workload("tpcc", warehouses=4, home_warehouses=[2, 3], **SMALL), 3000)
    assert {r.params["w_id"] for r in homed} == {2, 3}


def test_custom_mix() -> None:
    workload = get_workload("tpcc", mix={"payment": 1.0}, **SMALL)
    assert {r.procedure for r in _mix(workload, 200)} == {"payment"}


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"warehouses": 0}, "warehouses=0"),
        ({"items": "many"}, "items='many'"),
        ({"customers_per_district": True}, "customers_per_district=True"),
        ({"remote_payment_fraction": 1.5}, "remote_payment_fraction=1.5"),
        ({"home_warehouses": [5]}, "[5]"),
        ({"mix": {"new_ordr": 1}}, "new_ordr"),
        ({"mix": {"payment": -1}}, "-1"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_options_raise_config_error_naming_the_value(options: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        get_workload("tpcc", **options)


def test_partition_of_maps_by_warehouse_and_replicates_items() -> None:
    workload = get_workload("tpcc", warehouses=4, **SMALL)
    assert workload.partition_of(("warehouse", 3), 2) == 0
    assert workload.partition_of(("district", 4, 7), 2) == 1
    assert workload.partition_of(("stock", 1, 99), 4) == 0
    assert workload.partition_of(("item", 99), 4) == REPLICATED
    with pytest.raises(ConfigError, match="'acct'"):
        workload.partition_of(("acct", 1), 2)
    with pytest.raises(ConfigError, match="partitions=0"):
        workload.partition_of(("warehouse", 1), 0)


def test_route_partitions_agree_with_route_keys() -> None:
    workload = get_workload("tpcc", warehouses=5, remote_item_fraction=0.3, **SMALL)
    procedures = collections.Counter()
    for request in itertools.islice(workload.requests(4), 400):
        procedures[request.procedure] += 1
        keys = workload.route_keys(request.procedure, request.params)
        for partitions in (1, 2, 3):
            expected = {workload.partition_of(key, partitions) for key in keys}
            got = workload.route_partitions(request.procedure, request.params, partitions)
            assert got == expected, (request, partitions)
    assert len(procedures) == 5, procedures
    assert workload.route_partitions("other", {}, 2) is None
    bad = {"w_id": 1, "d_id": 1, "c_id": 1, "lines": [(1, "2", 1)], "entry_d": 0}
    with pytest.raises(TypeError, match="not ints"):  # the router then lets every node plan it
        workload.route_partitions("new_order", bad, 2)


@pytest.mark.slow
def test_full_spec_warehouse_loads_quickly() -> None:
    workload = get_workload("tpcc", warehouses=1)
    started_s = time.perf_counter()
    db = workload.build(seed=1)
    load_s = time.perf_counter() - started_s
    assert len(db["item"]) == len(db["stock"]) == 100_000
    assert len(db["customer"]) == len(db["orders"]) == 30_000
    assert len(db["new_order"]) == 9000
    assert 250_000 < len(db["order_line"]) < 350_000
    assert load_s < 20.0, f"loading one warehouse took {load_s:.1f} s"
    assert workload.check(db) == []
