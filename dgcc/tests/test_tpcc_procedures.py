"""Each TPC-C transaction's effect on a small database, checked by hand.

Method: load two small warehouses, run one request at a time through the serial executor with
invariants on, and compare every touched row and the client's result with values worked out
from the spec's rules (not from the procedure's code). Bad parameters must fail alone.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgcc import Database, Outcome, Status, TxnRequest, debug, get_protocol
from dgcc.api import plan_batch
from dgcc.errors import BadParams
from dgcc.workloads import get_workload
from dgcc.workloads.tpcc import procedures

ITEMS = 200
DATE = 1_800_000_000


@pytest.fixture
def tpcc() -> tuple[Database, Any]:
    workload = get_workload(
        "tpcc", warehouses=2, items=ITEMS, customers_per_district=30, orders_per_district=30
    )
    db = workload.build(seed=4)
    return db, get_protocol("serial")(db, workload.registry())


def _run(protocol: Any, procedure: str, **params: Any) -> Outcome:
    with debug.invariants():
        [outcome] = protocol.run_batch([TxnRequest(procedure, params)])
    return outcome


def _snapshot(db: Database, table: str, pk: Any) -> dict[str, Any]:
    return dict(db[table].get(pk))


def test_new_order_updates_stock_district_and_inserts_the_order(tpcc) -> None:
    db, protocol = tpcc
    db["stock"].update((1, 11), {"s_quantity": 12})  # 12 - 5 < 10: wraps to 12 - 5 + 91
    db["stock"].update((2, 12), {"s_quantity": 13})  # 13 - 3 = 10 is still enough: no wrap
    stock_local, stock_remote = _snapshot(db, "stock", (1, 11)), _snapshot(db, "stock", (2, 12))
    customer = _snapshot(db, "customer", (1, 3, 7))
    w_tax, d_tax = db["warehouse"].get(1)["w_tax"], db["district"].get((1, 3))["d_tax"]
    prices = [db["item"].get(11)["i_price"], db["item"].get(12)["i_price"]]
    outcome = _run(
        protocol, "new_order", w_id=1, d_id=3, c_id=7, lines=[(11, 1, 5), (12, 2, 3)], entry_d=DATE
    )
    assert outcome.status is Status.COMMITTED, outcome
    result = outcome.result
    assert result["o_id"] == 31
    assert db["district"].get((1, 3))["d_next_o_id"] == 32
    order = db["orders"].get((1, 3, 31))
    assert (order["o_c_id"], order["o_ol_cnt"], order["o_all_local"]) == (7, 2, 0)
    assert order["o_carrier_id"] is None
    assert order["o_entry_d"] == DATE
    assert db["new_order"].get((1, 3, 31)) is not None
    line = db["order_line"].get((1, 3, 31, 1))
    assert (line["ol_i_id"], line["ol_supply_w_id"], line["ol_quantity"]) == (11, 1, 5)
    assert line["ol_amount"] == 5 * prices[0]
    assert line["ol_dist_info"] == stock_local["s_dist_03"]
    assert line["ol_delivery_d"] is None
    assert db["order_line"].get((1, 3, 31, 2))["ol_amount"] == 3 * prices[1]
    local = db["stock"].get((1, 11))
    assert (local["s_quantity"], local["s_ytd"], local["s_order_cnt"]) == (98, 5, 1)
    assert local["s_remote_cnt"] == 0
    remote = db["stock"].get((2, 12))
    assert (remote["s_quantity"], remote["s_ytd"]) == (10, stock_remote["s_ytd"] + 3)
    assert remote["s_remote_cnt"] == 1
    amount = Fraction(5 * prices[0] + 3 * prices[1])
    exact = amount * (1 - Fraction(customer["c_discount"], 10_000))
    exact *= 1 + Fraction(w_tax + d_tax, 10_000)
    assert result["total_cents"] == int(exact + Fraction(1, 2))
    assert result["lines"][0][4] == 98
    assert result["c_last"] == customer["c_last"]
    # and what the spec's NewOrder screen echoes (clause 2.4.3.3)
    assert (result["w_id"], result["d_id"], result["c_id"]) == (1, 3, 7)
    assert (result["o_ol_cnt"], result["o_entry_d"]) == (2, DATE)


def test_new_order_with_an_invalid_item_rolls_back_without_a_trace(tpcc) -> None:
    db, protocol = tpcc
    before = db.dump()
    outcome = _run(
        protocol,
        "new_order",
        w_id=1,
        d_id=3,
        c_id=7,
        lines=[(11, 1, 5), (12, 2, 3), (ITEMS + 1, 1, 1)],
        entry_d=DATE,
    )
    assert outcome.status is Status.ABORTED
    assert "invalid item" in outcome.reason
    assert db.dump() == before


def test_payment_by_id_to_a_remote_bad_credit_customer(tpcc) -> None:
    db, protocol = tpcc
    db["customer"].update((2, 5, 4), {"c_credit": "BC"})
    w_ytd, d_ytd = db["warehouse"].get(1)["w_ytd"], db["district"].get((1, 2))["d_ytd"]
    customer = _snapshot(db, "customer", (2, 5, 4))
    names = db["warehouse"].get(1)["w_name"] + "    " + db["district"].get((1, 2))["d_name"]
    outcome = _run(
        protocol,
        "payment",
        w_id=1,
        d_id=2,
        c_w_id=2,
        c_d_id=5,
        c_id=4,
        c_last="",
        h_amount=12_345,
        h_date=DATE,
    )
    assert outcome.status is Status.COMMITTED, outcome
    assert db["warehouse"].get(1)["w_ytd"] == w_ytd + 12_345
    assert db["district"].get((1, 2))["d_ytd"] == d_ytd + 12_345
    after = db["customer"].get((2, 5, 4))
    assert after["c_balance"] == customer["c_balance"] - 12_345
    assert after["c_ytd_payment"] == customer["c_ytd_payment"] + 12_345
    assert after["c_payment_cnt"] == 2
    assert after["c_data"] == ("4 5 2 2 1 12345|" + customer["c_data"])[:500]
    history = db["history"].get((2, 5, 4, 2))
    assert (history["h_w_id"], history["h_d_id"], history["h_amount"]) == (1, 2, 12_345)
    assert history["h_data"] == names
    assert outcome.result["c_balance"] == after["c_balance"]
    assert outcome.result["c_data"] == after["c_data"][:200]
    shown = {k: outcome.result[k] for k in ("c_middle", "c_since", "c_credit_lim", "c_discount")}
    assert shown == {k: customer[k] for k in shown}  # as the spec's Payment screen (2.5.3.4)
    assert (outcome.result["h_amount"], outcome.result["h_date"]) == (12_345, DATE)


def test_customers_have_keys_of_their_own_in_their_districts_group(tpcc) -> None:
    # A customer and its history rows are one conflict key, ("customer", w, d, c), in the
    # group ("customers", w, d) of its district's customers, apart from the district row's
    # key: Payment and OrderStatus name their customer at plan time (by last name too) and
    # read the group key; Delivery, which finds its customer as it runs, writes the group. A
    # NewOrder (whose customer columns never change and are read at plan time) takes neither,
    # so a remote Payment holds one customer behind its exchange under Calvin's locks.
    db, protocol = tpcc
    registry = get_workload("tpcc", warehouses=2, items=ITEMS).registry()
    line = (1, 1, 5)
    c_last = db["customer"].get((2, 5, 4))["c_last"]
    named = sorted(
        (db["customer"].get(pk)["c_first"], pk)
        for pk in db["customer"].indexes["by_last"].lookup((2, 5, c_last))
    )
    by_name = named[(len(named) - 1) // 2][1][2]
    requests = {
        "new_order": dict(w_id=2, d_id=5, c_id=4, lines=[line], entry_d=DATE),
        "remote payment": dict(_PAY, w_id=1, d_id=2, c_w_id=2, c_d_id=5, c_id=4, h_amount=9),
        "home payment": dict(_PAY, w_id=2, d_id=5, c_w_id=2, c_d_id=5, c_id=4, h_amount=9),
        "named payment": dict(
            _PAY, w_id=1, d_id=2, c_w_id=2, c_d_id=5, c_id=0, c_last=c_last, h_amount=9
        ),
        "order_status": dict(w_id=2, d_id=5, c_id=4, c_last=""),
        "named order_status": dict(w_id=2, d_id=5, c_id=0, c_last=c_last),
        "delivery": dict(w_id=2, o_carrier_id=3, ol_delivery_d=DATE),
    }
    keys: dict[str, set[tuple[str, frozenset, frozenset]]] = {}
    for label, params in requests.items():
        procedure = label.split()[-1]
        [planned] = plan_batch(registry, db, [TxnRequest(procedure, params)])
        keys[label] = {(p.name, frozenset(p.reads), frozenset(p.writes)) for p in planned.pieces}
    group, district = ("customers", 2, 5), ("district", 2, 5)
    customer, named_one = ("customer", 2, 5, 4), ("customer", 2, 5, by_name)
    for _, reads, writes in keys["new_order"]:
        assert not {group, customer} & (reads | writes)
    assert ("order", frozenset(), frozenset({district})) in keys["new_order"]
    assert ("customer", frozenset({group}), frozenset({customer})) in keys["remote payment"]
    assert ("customer", frozenset({group}), frozenset({named_one})) in keys["named payment"]
    assert ("customer", frozenset({group}), frozenset({district, customer})) in keys["home payment"]
    assert keys["order_status"] == {("status", frozenset({customer, group, district}), frozenset())}
    assert keys["named order_status"] == {
        ("status", frozenset({named_one, group, district}), frozenset())
    }
    assert ("d5", frozenset(), frozenset({district, group})) in keys["delivery"]
    # and a NewOrder still answers the customer's columns (read at plan time)
    outcome = _run(protocol, "new_order", **requests["new_order"])
    row = db["customer"].get((2, 5, 4))
    shown = {k: outcome.result[k] for k in ("c_last", "c_credit", "c_discount")}
    assert shown == {k: row[k] for k in shown}


@pytest.mark.parametrize(("count", "expected_c_id"), [(3, 7), (4, 7)])
def test_payment_by_last_name_picks_the_middle_customer_by_first_name(
    tpcc, count: int, expected_c_id: int
) -> None:
    db, protocol = tpcc
    firsts = {5: "CCC", 6: "AAA", 7: "BBB", 8: "DDD"}
    for c_id in list(firsts)[:count]:
        db["customer"].update((1, 1, c_id), {"c_last": "ZZTOP", "c_first": firsts[c_id]})
    balance = db["customer"].get((1, 1, expected_c_id))["c_balance"]
    d_ytd, w_ytd = db["district"].get((1, 1))["d_ytd"], db["warehouse"].get(1)["w_ytd"]
    outcome = _run(
        protocol,
        "payment",
        w_id=1,
        d_id=1,
        c_w_id=1,
        c_d_id=1,
        c_id=0,
        c_last="ZZTOP",
        h_amount=500,
        h_date=DATE,
    )
    assert outcome.result["c_id"] == expected_c_id
    assert db["customer"].get((1, 1, expected_c_id))["c_balance"] == balance - 500
    assert db["district"].get((1, 1))["d_ytd"] == d_ytd + 500  # home customer: one merged piece
    assert db["warehouse"].get(1)["w_ytd"] == w_ytd + 500
    assert db["history"].get((1, 1, expected_c_id, 2))["h_amount"] == 500


def test_order_status_returns_the_customers_last_order(tpcc) -> None:
    db, protocol = tpcc
    placed = _run(
        protocol, "new_order", w_id=1, d_id=3, c_id=7, lines=[(11, 1, 5), (12, 1, 3)], entry_d=DATE
    )
    c_last = db["customer"].get((1, 3, 7))["c_last"]
    by_id = _run(protocol, "order_status", w_id=1, d_id=3, c_id=7, c_last="")
    assert by_id.result["o_id"] == placed.result["o_id"] == 31
    assert by_id.result["o_carrier_id"] is None
    assert by_id.result["c_middle"] == db["customer"].get((1, 3, 7))["c_middle"]
    assert by_id.result["o_entry_d"] == DATE
    assert [line[1] for line in by_id.result["lines"]] == [11, 12]
    assert by_id.result["lines"][0][3] == db["order_line"].get((1, 3, 31, 1))["ol_amount"]
    by_name = _run(protocol, "order_status", w_id=1, d_id=3, c_id=0, c_last=c_last)
    assert by_name.status is Status.COMMITTED
    assert by_name.result["c_last"] == c_last


def test_delivery_delivers_each_districts_oldest_new_order(tpcc) -> None:
    db, protocol = tpcc
    expected = {}
    for d in range(1, 11):
        order = db["orders"].get((1, d, 22))
        lines = [db["order_line"].get((1, d, 22, n)) for n in range(1, order["o_ol_cnt"] + 1)]
        customer = db["customer"].get((1, d, order["o_c_id"]))
        expected[d] = (
            order["o_c_id"],
            customer["c_balance"] + sum(line["ol_amount"] for line in lines),
            customer["c_delivery_cnt"] + 1,
        )
    outcome = _run(protocol, "delivery", w_id=1, o_carrier_id=4, ol_delivery_d=DATE)
    assert outcome.result == {"delivered": [(d, 22) for d in range(1, 11)], "skipped": 0}
    for d, (c_id, balance, deliveries) in expected.items():
        assert db["new_order"].get((1, d, 22)) is None
        assert db["new_order"].get((1, d, 23)) is not None
        order = db["orders"].get((1, d, 22))
        assert order["o_carrier_id"] == 4
        lines = [db["order_line"].get((1, d, 22, n)) for n in range(1, order["o_ol_cnt"] + 1)]
        assert all(line["ol_delivery_d"] == DATE for line in lines)
        customer = db["customer"].get((1, d, c_id))
        assert (customer["c_balance"], customer["c_delivery_cnt"]) == (balance, deliveries)
    assert len(db["new_order"]) == 20 * 9 - 10  # warehouse 2 untouched


def test_delivery_skips_districts_without_new_orders() -> None:
    workload = get_workload(
        "tpcc", warehouses=1, items=ITEMS, customers_per_district=30, orders_per_district=3
    )
    db = workload.build(seed=1)
    assert len(db["new_order"]) == 0
    before = db.dump()
    protocol = get_protocol("serial")(db, workload.registry())
    outcome = _run(protocol, "delivery", w_id=1, o_carrier_id=4, ol_delivery_d=DATE)
    assert outcome.result == {"delivered": [], "skipped": 10}
    assert db.dump() == before


def test_stock_level_counts_distinct_low_items_of_the_last_20_orders(tpcc) -> None:
    db, protocol = tpcc
    recent = {
        line["ol_i_id"]
        for (w, d, o, _n), line in db["order_line"].items()
        if (w, d) == (1, 6) and 11 <= o <= 30
    }
    older = {
        line["ol_i_id"]
        for (w, d, o, _n), line in db["order_line"].items()
        if (w, d, o) == (1, 6, 3)
    }
    for i in range(1, ITEMS + 1):
        db["stock"].update((1, i), {"s_quantity": 50})
    low_recent = sorted(recent)[:2]
    low_elsewhere = sorted(set(range(1, ITEMS + 1)) - recent)[:3]  # not in the last 20 orders
    for i in [*low_recent, *low_elsewhere]:
        db["stock"].update((1, i), {"s_quantity": 5})
    db["stock"].update((2, sorted(recent)[-1]), {"s_quantity": 5})  # another warehouse
    assert older  # the sample district has orders before the window too
    outcome = _run(protocol, "stock_level", w_id=1, d_id=6, threshold=10)
    assert outcome.result["low_stock"] == 2
    assert outcome.result["o_id_range"] == (11, 31)


_PAY = dict(w_id=1, d_id=1, c_w_id=1, c_d_id=1, c_id=1, c_last="", h_date=DATE)


@pytest.mark.parametrize(
    ("procedure", "params", "needle"),
    [
        ("new_order", {"w_id": 3, "d_id": 1, "c_id": 1, "lines": [(1, 1, 1)]}, "w_id=3"),
        ("new_order", {"w_id": 1, "d_id": 1, "c_id": 1, "lines": [(1, 1, 11)]}, "quantity=11"),
        ("new_order", {"w_id": 1, "d_id": 1, "c_id": 1, "lines": [(1, 9, 1)]}, "supply_w_id=9"),
        ("new_order", {"w_id": 1, "d_id": 1, "c_id": 99, "lines": [(1, 1, 1)]}, "c_id=99"),
        ("new_order", {"w_id": 1, "d_id": 1, "c_id": 1, "lines": [(1, 1)]}, "order line"),
        ("new_order", {"w_id": 1, "d_id": 1, "c_id": 1, "lines": [(True, 1, 1)]}, "three ints"),
        ("new_order", {"w_id": 1, "d_id": 1, "c_id": 1, "lines": []}, "0 lines"),
        ("order_status", {"w_id": 1, "d_id": 11, "c_id": 1, "c_last": ""}, "d_id=11"),
        ("order_status", {"w_id": 1, "d_id": 1, "c_id": 1, "c_last": "BAR"}, "exactly one"),
        ("order_status", {"w_id": 1, "d_id": 1, "c_id": 0, "c_last": "NOBODY"}, "NOBODY"),
        ("delivery", {"w_id": 1, "o_carrier_id": 0, "ol_delivery_d": DATE}, "o_carrier_id=0"),
        ("stock_level", {"w_id": 1, "d_id": 1, "threshold": 0}, "threshold=0"),
        ("payment", {**_PAY, "h_amount": 0}, "h_amount=0 outside 1..1,000,000,000,000 cents"),
        ("payment", {**_PAY, "h_amount": 2**64 - 1}, "h_amount=18446744073709551615 outside"),
    ],
)
def test_bad_params_fail_alone(tpcc, procedure: str, params: dict, needle: str) -> None:
    db, protocol = tpcc
    if procedure == "new_order":
        params = {**params, "entry_d": DATE}
    before = db.dump()
    good = TxnRequest(
        "payment",
        dict(w_id=1, d_id=1, c_w_id=1, c_d_id=1, c_id=1, c_last="", h_amount=100, h_date=DATE),
    )
    with debug.invariants():
        bad, ok = protocol.run_batch([TxnRequest(procedure, params), good])
    assert bad.status is Status.ERROR
    assert needle in bad.reason
    assert ok.status is Status.COMMITTED
    assert db.dump() != before


def test_new_order_with_a_repeated_item_updates_its_stock_once_per_line(tpcc) -> None:
    db, protocol = tpcc
    db["stock"].update((1, 11), {"s_quantity": 50, "s_ytd": 0, "s_order_cnt": 0})
    outcome = _run(
        protocol, "new_order", w_id=1, d_id=2, c_id=3, lines=[(11, 1, 5), (11, 1, 3)], entry_d=DATE
    )
    assert [line[4] for line in outcome.result["lines"]] == [45, 42]
    stock = db["stock"].get((1, 11))
    assert (stock["s_quantity"], stock["s_ytd"], stock["s_order_cnt"]) == (42, 8, 2)
    assert db["orders"].get((1, 2, 31))["o_ol_cnt"] == 2


_valid_line = st.tuples(st.integers(1, ITEMS), st.integers(1, 2), st.integers(1, 10))
_changes = [  # one line made invalid at a boundary, or valid but not a tuple
    lambda line: (line[0], 0, line[2]),
    lambda line: (line[0], 3, line[2]),
    lambda line: (line[0], line[1], 0),
    lambda line: (line[0], line[1], 11),
    lambda line: (True, line[1], line[2]),
    lambda line: (line[0], line[1], True),
    lambda line: (line[0], float(line[1]), line[2]),
    lambda line: line[:2],
    lambda line: (*line, 1),
    list,
]
_lines = st.tuples(
    st.lists(_valid_line, min_size=1, max_size=15),
    st.integers(0, 14),
    st.none() | st.sampled_from(_changes),
).map(
    lambda drawn: [
        drawn[2](line) if drawn[2] and k == drawn[1] % len(drawn[0]) else line
        for k, line in enumerate(drawn[0])
    ]
)


def _line_valid(line: object) -> bool:
    """Clause 2.4.1 for one line of a 2-warehouse database: three ints (no bools), a supply
    warehouse that exists and a quantity in 1..10 (a bad item id is a rollback, not an error)."""
    if not isinstance(line, list | tuple) or len(line) != 3:
        return False
    if any(type(value) is not int for value in line):
        return False
    return 1 <= line[1] <= 2 and 1 <= line[2] <= 10


@functools.cache
def _small_scale() -> tuple[Any, Any]:
    workload = get_workload(
        "tpcc", warehouses=2, items=ITEMS, customers_per_district=30, orders_per_district=30
    )
    return procedures._Scale(workload.config), workload.build(seed=1).read_view()


@given(lines=_lines)
def test_new_order_lines_are_checked_exactly(lines: list) -> None:
    # The column-wise fast check (``_lines_ok``) accepts exactly the valid all-tuple orders;
    # the whole plan rejects exactly the orders with a bad line, whichever check decides.
    scale, view = _small_scale()
    valid = all(map(_line_valid, lines))
    assert scale._lines_ok(lines) == (valid and all(type(line) is tuple for line in lines))
    params = {"w_id": 1, "d_id": 1, "c_id": 1, "lines": lines, "entry_d": DATE}
    if valid:
        pieces = scale.plan_new_order(params, view)
        assert len(pieces) == 2 + len({line[1] for line in lines})  # a stock piece a warehouse
    else:
        with pytest.raises(BadParams):
            scale.plan_new_order(params, None)  # type: ignore[arg-type]


def _low_items_by_hand(db: Database, w: int, d: int, threshold: int) -> int:
    """StockLevel's count from the tables alone: distinct items of the district's last 20
    orders whose stock in warehouse ``w`` is below ``threshold``."""
    next_o_id = db["district"].get((w, d))["d_next_o_id"]
    items = {
        line["ol_i_id"]
        for (lw, ld, o, _n), line in db["order_line"].items()
        if (lw, ld) == (w, d) and next_o_id - 20 <= o < next_o_id
    }
    return sum(db["stock"].get((w, i))["s_quantity"] < threshold for i in items)


def test_stock_level_plans_stay_exact_as_orders_arrive_and_databases_change() -> None:
    """StockLevel's plan keeps each order's item ids from one call to the next (without
    invariant checks, which hand plans frozen copies): new orders must enter the window, old
    ones leave it, and another database under the same registry (other orders under the same
    keys) must not see the first one's items."""
    workload = get_workload(
        "tpcc", warehouses=2, items=ITEMS, customers_per_district=30, orders_per_district=30
    )
    registry = workload.registry()
    first, second = workload.build(seed=4), workload.build(seed=5)
    level = {"w_id": 1, "d_id": 6, "threshold": 60}
    for db in (first, second, first):
        serial = get_protocol("serial")(db, registry)
        for round_ in range(4):
            [outcome] = serial.run_batch([TxnRequest("stock_level", dict(level))])
            assert outcome.result["low_stock"] == _low_items_by_hand(db, 1, 6, 60), round_
            lines = [(1 + (round_ * 37 + k * 11) % ITEMS, 1, 5) for k in range(7)]
            orders = [
                TxnRequest(
                    "new_order",
                    {"w_id": 1, "d_id": 6, "c_id": 1 + k, "lines": lines, "entry_d": DATE},
                )
                for k in range(round_ * 3)  # 0, 3, 6, 9 new orders: part of the window moves
            ]
            assert all(o.status is Status.COMMITTED for o in serial.run_batch(orders))
