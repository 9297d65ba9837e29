"""TPC-C consistency conditions 1-10 and 12 (clause 3.3.2), each violation a clear string.

One pass per table builds per-district, per-order and per-customer aggregates; the conditions
are then compared on them. Condition 11 holds only before any Delivery and is not checked.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from dgcc.storage import Database

__all__ = ["check"]

VIOLATIONS_MAX = 100


def check(db: Database) -> list[str]:
    """Violations of the consistency conditions in ``db`` (empty when consistent)."""
    found: list[str] = []
    found += _warehouse_conditions(db)
    found += _district_conditions(db)
    found += _order_conditions(db)
    found += _customer_conditions(db)
    if len(found) > VIOLATIONS_MAX:
        found = [*found[:VIOLATIONS_MAX], f"... and {len(found) - VIOLATIONS_MAX} more"]
    return found


def _warehouse_conditions(db: Database) -> list[str]:
    """1: W_YTD = sum(D_YTD); 8: W_YTD = sum(H_AMOUNT) of its history."""
    d_ytd: Counter[int] = Counter()
    for (w, _d), row in db["district"].items():
        d_ytd[w] += row["d_ytd"]
    h_amount: Counter[int] = Counter()
    for row in db["history"].rows.values():
        h_amount[row["h_w_id"]] += row["h_amount"]
    found = []
    for w, row in db["warehouse"].items():
        if row["w_ytd"] != d_ytd[w]:
            found.append(f"cond 1: warehouse {w} W_YTD={row['w_ytd']} != sum D_YTD {d_ytd[w]}")
        if row["w_ytd"] != h_amount[w]:
            found.append(f"cond 8: warehouse {w} W_YTD={row['w_ytd']} != sum H {h_amount[w]}")
    return found


def _district_conditions(db: Database) -> list[str]:
    """2: D_NEXT_O_ID-1 = max(O_ID) = max(NO_O_ID); 3: new orders contiguous; 4: line counts;
    9: D_YTD = sum(H_AMOUNT) of the district's history."""
    max_o: dict[tuple[int, int], int] = defaultdict(int)
    ol_cnt: Counter[tuple[int, int]] = Counter()
    for (w, d, o), row in db["orders"].items():
        max_o[w, d] = max(max_o[w, d], o)
        ol_cnt[w, d] += row["o_ol_cnt"]
    new_orders: dict[tuple[int, int], list[int]] = defaultdict(list)
    for w, d, o in db["new_order"].rows:
        new_orders[w, d].append(o)
    lines: Counter[tuple[int, int]] = Counter()
    for w, d, _o, _n in db["order_line"].rows:
        lines[w, d] += 1
    h_amount: Counter[tuple[int, int]] = Counter()
    for row in db["history"].rows.values():
        h_amount[row["h_w_id"], row["h_d_id"]] += row["h_amount"]
    found = []
    for key, row in db["district"].items():
        found += _district_orders(key, row, max_o[key], new_orders.get(key, []))
        if ol_cnt[key] != lines[key]:
            found.append(f"cond 4: district {key} sum O_OL_CNT {ol_cnt[key]} != {lines[key]}")
        if row["d_ytd"] != h_amount[key]:
            found.append(f"cond 9: district {key} D_YTD={row['d_ytd']} != sum(H)={h_amount[key]}")
    return found


def _district_orders(key: Any, row: dict[str, Any], max_o: int, new_orders: list[int]) -> list[str]:
    found = []
    if row["d_next_o_id"] - 1 != max_o:
        last = row["d_next_o_id"] - 1
        found.append(f"cond 2: district {key} D_NEXT_O_ID-1={last} != max O_ID={max_o}")
    if new_orders:
        low, high = min(new_orders), max(new_orders)
        if high != max_o:
            found.append(f"cond 2: district {key} max NO_O_ID={high} != max O_ID={max_o}")
        if high - low + 1 != len(new_orders):
            found.append(
                f"cond 3: district {key} new orders {low}..{high} but count={len(new_orders)}"
            )
    return found


def _order_conditions(db: Database) -> list[str]:
    """5: O_CARRIER_ID null iff a new-order row; 6: O_OL_CNT = lines; 7: OL_DELIVERY_D null iff
    O_CARRIER_ID null."""
    orders, new_order = db["orders"].rows, db["new_order"].rows
    lines_per_order: Counter[tuple[int, int, int]] = Counter()
    undelivered_lines: Counter[tuple[int, int, int]] = Counter()
    for (w, d, o, _n), row in db["order_line"].items():
        lines_per_order[w, d, o] += 1
        if row["ol_delivery_d"] is None:
            undelivered_lines[w, d, o] += 1
    found = []
    for pk, row in orders.items():
        pending = row["o_carrier_id"] is None
        if pending != (pk in new_order):
            found.append(f"cond 5: order {pk} O_CARRIER_ID={row['o_carrier_id']} vs new-order")
        if row["o_ol_cnt"] != lines_per_order[pk]:
            found.append(f"cond 6: order {pk} O_OL_CNT={row['o_ol_cnt']} != {lines_per_order[pk]}")
        expected = row["o_ol_cnt"] if pending else 0
        if undelivered_lines[pk] != expected:
            found.append(
                f"cond 7: order {pk} has {undelivered_lines[pk]} undelivered lines, "
                f"O_CARRIER_ID={row['o_carrier_id']}"
            )
    return found


def _customer_conditions(db: Database) -> list[str]:
    """10: C_BALANCE = sum(delivered OL_AMOUNT) - sum(H_AMOUNT);
    12: C_BALANCE + C_YTD_PAYMENT = sum(delivered OL_AMOUNT)."""
    orders = db["orders"].rows
    delivered: Counter[tuple[int, int, int]] = Counter()
    for (w, d, o, _n), row in db["order_line"].items():
        if row["ol_delivery_d"] is not None:
            delivered[w, d, orders[w, d, o]["o_c_id"]] += row["ol_amount"]
    paid: Counter[tuple[int, int, int]] = Counter()
    for row in db["history"].rows.values():
        paid[row["h_c_w_id"], row["h_c_d_id"], row["h_c_id"]] += row["h_amount"]
    found = []
    for pk, row in db["customer"].items():
        balance = row["c_balance"]
        if balance != delivered[pk] - paid[pk]:
            found.append(
                f"cond 10: customer {pk} C_BALANCE={balance} != delivered {delivered[pk]} "
                f"- paid {paid[pk]}"
            )
        if balance + row["c_ytd_payment"] != delivered[pk]:
            found.append(
                f"cond 12: customer {pk} C_BALANCE+C_YTD_PAYMENT="
                f"{balance + row['c_ytd_payment']} != delivered {delivered[pk]}"
            )
    return found
