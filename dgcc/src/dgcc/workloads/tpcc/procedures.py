"""The five TPC-C transactions (clause 2.4-2.8) as stored procedures split into pieces.

Every piece touches one conflict key (see ``schema.create_tables``), except StockLevel's stock
read, which only *reads* several keys, and NewOrder's stock pieces, one per supply warehouse,
each writing that warehouse's stock records of the order. Columns that no transaction ever
changes (W_TAX, W_NAME, D_NAME, C_LAST, C_FIRST, ORDER_LINE.OL_I_ID of an existing order) may be
read at plan time from the batch-start view: they are equal at every point of the batch.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from dgcc.api import Piece, PieceContext, Procedure, ProcedureRegistry
from dgcc.errors import BadParams, brief
from dgcc.storage import Database, ReadView
from dgcc.workloads.tpcc.schema import DISTRICTS_PER_WAREHOUSE, ITEM_KEY, TpccConfig

__all__ = ["make_registry"]

LINES_MAX = 15
QUANTITY_MAX = 10
STOCK_LEVEL_ORDERS = 20
C_DATA_CHARS = 500
H_AMOUNT_MAX = 10**12  # cents; the spec's payments are 1.00..5,000.00
_DIST_COLUMNS = tuple(f"s_dist_{d:02d}" for d in range(1, DISTRICTS_PER_WAREHOUSE + 1))
# a NewOrder's stock piece of its k-th supply warehouse (in the order the lines name them)
_STOCK_PIECE_NAMES = tuple(f"stock_{k}" for k in range(LINES_MAX))
_ITEM_FIELDS = operator.itemgetter("i_price", "i_name", "i_data")  # what NewOrder reads of ITEM


def make_registry(config: TpccConfig) -> ProcedureRegistry:
    """The five procedures, validating parameters against ``config``'s scale."""
    scale = _Scale(config)
    return ProcedureRegistry(
        [
            Procedure(
                "new_order",
                {"w_id": int, "d_id": int, "c_id": int, "lines": list, "entry_d": int},
                scale.plan_new_order,
                lambda outputs: outputs["order"],
                replay=_replay_new_order,
            ),
            Procedure(
                "payment",
                {
                    "w_id": int,
                    "d_id": int,
                    "c_w_id": int,
                    "c_d_id": int,
                    "c_id": int,
                    "c_last": str,
                    "h_amount": int,
                    "h_date": int,
                },
                scale.plan_payment,
                lambda outputs: outputs["customer"],
                replay=_replay_payment,
            ),
            Procedure(
                "order_status",
                {"w_id": int, "d_id": int, "c_id": int, "c_last": str},
                scale.plan_order_status,
                lambda outputs: outputs["status"],
            ),
            Procedure(
                "delivery",
                {"w_id": int, "o_carrier_id": int, "ol_delivery_d": int},
                scale.plan_delivery,
                _delivery_result,
                replay=_replay_delivery,
            ),
            Procedure(
                "stock_level",
                {"w_id": int, "d_id": int, "threshold": int},
                scale.plan_stock_level,
                lambda outputs: outputs["stock"],
            ),
        ]
    )


class _Scale:
    """Parameter validation against the loaded scale, and the plan functions."""

    def __init__(self, config: TpccConfig) -> None:
        self.warehouses = config.warehouses
        self.customers = config.customers_per_district
        # StockLevel's plan reads the item ids of a district's last 20 orders: each order's are
        # kept here, by district and order id, with the ORDERS row they were read for.
        self._order_items: dict[tuple[int, int], dict[int, tuple[Any, tuple[int, ...]]]] = {}

    def warehouse(self, name: str, w: int) -> None:
        if not 1 <= w <= self.warehouses:
            raise BadParams(f"{name}={brief(w)} outside 1..{self.warehouses}")

    def district(self, name: str, d: int) -> None:
        if not 1 <= d <= DISTRICTS_PER_WAREHOUSE:
            raise BadParams(f"{name}={brief(d)} outside 1..{DISTRICTS_PER_WAREHOUSE}")

    def customer(self, params: Mapping[str, Any], view: ReadView, w: int, d: int) -> int:
        """The C_ID of the customer that exactly one of c_id (> 0) and c_last (non-empty) names:
        by last name, the middle one (rounded up) in C_FIRST order (clause 2.5.2.2).

        C_LAST and C_FIRST never change and customers are never added, so the plan-time answer
        is exact (and every node's: each keeps the customer table whole for plans)."""
        c_id, c_last = params["c_id"], params["c_last"]
        if (c_id == 0) == (c_last == ""):
            raise BadParams(f"give exactly one of c_id={brief(c_id)} and c_last={brief(c_last)}")
        if not c_last:
            if not 1 <= c_id <= self.customers:
                raise BadParams(f"c_id={brief(c_id)} outside 1..{self.customers}")
            return c_id  # type: ignore[no-any-return]
        c = _named_customer(view, w, d, c_last)
        if c is None:
            raise BadParams(f"no customer named c_last={brief(c_last)} in district {(w, d)}")
        return c

    def plan_new_order(self, params: Mapping[str, Any], view: ReadView) -> list[Piece]:
        w, d, c = params["w_id"], params["d_id"], params["c_id"]
        self.warehouse("w_id", w)
        self.district("d_id", d)
        if not 1 <= c <= self.customers:
            raise BadParams(f"c_id={brief(c)} outside 1..{self.customers}")
        lines = params["lines"]
        if not 1 <= len(lines) <= LINES_MAX:
            raise BadParams(f"new_order has {len(lines)} lines; allowed 1..{LINES_MAX}")
        if not self._lines_ok(lines):  # lists, not tuples, or a bad line: check each in full
            lines = [self._order_line(line) for line in lines]
        w_tax = view.get("warehouse", w)["w_tax"]  # type: ignore[index]
        customer = view.get("customer", (w, d, c))  # (columns no transaction updates)
        return _new_order_pieces(w, d, c, lines, w_tax, customer, params["entry_d"])

    def _lines_ok(self, lines: Sequence[object]) -> bool:
        """Whether every line is a valid ``(i_id, supply_w_id, quantity)`` tuple (the fast
        check of the common case, by columns in C loops; ``_order_line`` names what is wrong).
        """
        if set(map(type, lines)) != {tuple} or set(map(len, lines)) != {3}:  # type: ignore[arg-type]
            return False
        i_ids, supplies, quantities = zip(*lines)  # type: ignore[misc]
        if set(map(type, i_ids + supplies + quantities)) != {int}:  # bool is no int here
            return False
        return (
            min(supplies) >= 1
            and max(supplies) <= self.warehouses
            and min(quantities) >= 1
            and max(quantities) <= QUANTITY_MAX
        )

    def _order_line(self, line: object) -> tuple[int, int, int]:
        if not isinstance(line, list | tuple) or len(line) != 3:
            raise BadParams(f"order line {brief(line)} must be (i_id, supply_w_id, quantity)")
        i_id, supply_w, quantity = line
        if not type(i_id) is type(supply_w) is type(quantity) is int:  # bool is no int here
            raise BadParams(f"order line {brief(line)} must hold three ints")
        if not 1 <= supply_w <= self.warehouses:
            raise BadParams(f"supply_w_id={brief(supply_w)} outside 1..{self.warehouses}")
        if not 1 <= quantity <= QUANTITY_MAX:
            raise BadParams(f"quantity={brief(quantity)} outside 1..{QUANTITY_MAX}")
        return i_id, supply_w, quantity

    def plan_payment(self, params: Mapping[str, Any], view: ReadView) -> list[Piece]:
        w, d, c_w, c_d = params["w_id"], params["d_id"], params["c_w_id"], params["c_d_id"]
        self.warehouse("w_id", w)
        self.district("d_id", d)
        self.warehouse("c_w_id", c_w)
        self.district("c_d_id", c_d)
        c = self.customer(params, view, c_w, c_d)
        if not 0 < params["h_amount"] <= H_AMOUNT_MAX:  # (balances are 64-bit on the wire)
            raise BadParams(f"h_amount={params['h_amount']!r} outside 1..{H_AMOUNT_MAX:,} cents")
        w_name = view.get("warehouse", w)["w_name"]  # type: ignore[index]
        d_name = view.get("district", (w, d))["d_name"]  # type: ignore[index]
        return _payment_pieces(params, c, w_name + "    " + d_name)

    def plan_order_status(self, params: Mapping[str, Any], view: ReadView) -> list[Piece]:
        w, d = params["w_id"], params["d_id"]
        self.warehouse("w_id", w)
        self.district("d_id", d)
        c = self.customer(params, view, w, d)

        def status(ctx: PieceContext) -> dict[str, Any]:
            return _order_status(ctx, w, d, c)

        keys = (("customer", w, d, c), ("customers", w, d), ("district", w, d))
        return [Piece("status", status, reads=keys)]

    def plan_delivery(self, params: Mapping[str, Any], view: ReadView) -> list[Piece]:
        w, carrier, date = params["w_id"], params["o_carrier_id"], params["ol_delivery_d"]
        self.warehouse("w_id", w)
        if not 1 <= carrier <= 10:
            raise BadParams(f"o_carrier_id={brief(carrier)} outside 1..10")
        return [
            Piece(
                f"d{d}",
                _deliver(w, d, carrier, date),
                writes=(("district", w, d), ("customers", w, d)),
            )
            for d in range(1, DISTRICTS_PER_WAREHOUSE + 1)
        ]

    def plan_stock_level(self, params: Mapping[str, Any], view: ReadView) -> list[Piece]:
        w, d, threshold = params["w_id"], params["d_id"], params["threshold"]
        self.warehouse("w_id", w)
        self.district("d_id", d)
        if not 1 <= threshold <= 100:
            raise BadParams(f"threshold={brief(threshold)} outside 1..100")
        next_o_id = view.get("district", (w, d))["d_next_o_id"]  # type: ignore[index]
        first_o_id = max(1, next_o_id - STOCK_LEVEL_ORDERS)
        items = self._recent_items(view, w, d, first_o_id, next_o_id)
        stock_pks = [(w, i) for i in items]

        def stock(ctx: PieceContext) -> dict[str, Any]:
            get = ctx.getter("stock")
            low = sum([get(pk)["s_quantity"] < threshold for pk in stock_pks])  # type: ignore[index]
            return {"low_stock": low, "o_id_range": (first_o_id, next_o_id)}

        # Keys spelled out, not ("stock", *pk): a star builds a list first (~200 keys a call).
        return [Piece("stock", stock, reads=tuple([("stock", w, i) for i in items]))]

    def _recent_items(self, view: ReadView, w: int, d: int, first: int, end: int) -> list[int]:
        """Distinct OL_I_IDs of orders [first, end) of district (w, d), from the batch-start
        view.

        StockLevel needs only level-1 (read-committed) isolation (clause 3.4.1), so the order
        range is fixed at plan time (reconnaissance of D_NEXT_O_ID); the stock quantities are
        then read in the transaction's serial position under declared keys.

        An order's item ids never change (no procedure updates OL_I_ID or O_OL_CNT, nor deletes
        an order), so each order's are read once, not once per StockLevel (each of which read
        ~200 order lines): kept with the very ORDERS row object they were read for, since a
        new object (another database, a recovery's rows, a checked view's frozen copy) may
        hold another order under the same key. A district keeps only its window's orders.
        """
        orders, lines = view.rows("orders"), view.rows("order_line")
        known = self._order_items.setdefault((w, d), {})
        items: set[int] = set()
        for o in range(first, end):
            row = orders[w, d, o]
            entry = known.get(o)
            if entry is None or entry[0] is not row:
                ids = tuple([lines[w, d, o, n]["ol_i_id"] for n in range(1, row["o_ol_cnt"] + 1)])
                entry = known[o] = (row, ids)
            items.update(entry[1])
        if len(known) > 2 * STOCK_LEVEL_ORDERS:
            for o in [o for o in known if not first <= o < end]:
                del known[o]
        return sorted(items)


# -- NewOrder ---------------------------------------------------------------------------------


def _new_order_pieces(
    w: int,
    d: int,
    c: int,
    lines: list[tuple[int, int, int]],
    w_tax: int,
    customer: Mapping[str, Any],
    entry_d: int,
) -> list[Piece]:
    """Item check (may abort, before any write), one piece per supply warehouse updating its
    stock records, then the order. ``customer``'s C_LAST, C_CREDIT and C_DISCOUNT, which no
    transaction updates, are read at plan time, so the order piece needs no customers key.

    A stock piece covers every record of its warehouse (one partition, so one node runs it):
    a piece per record cost a Piece, a scheduling step and an output each (20k TPC-C calls on
    the single-process DGCC engine took 13-20% more CPU that way), for little ordering
    gained: the order piece waits for all of them anyway (a later access to one record now
    follows the whole piece, which only a later conflict on another of its records could
    notice). Built column-wise (``zip``) where it can: a NewOrder is half of the mix.
    """
    item_ids, supplies, quantities = zip(*lines)
    keys = list(zip(supplies, item_ids))  # its stock records, (supply_w, i_id) per line
    stock_lines: dict[tuple[int, int], Sequence[int]]  # stock record -> its lines' quantities
    if len(set(keys)) == len(keys):  # no item twice (the common case): one quantity each
        stock_lines = dict(zip(keys, zip(quantities)))
    else:
        stock_lines = {}
        for key, quantity in zip(keys, quantities):
            stock_lines[key] = (*stock_lines.get(key, ()), quantity)
    groups: dict[int, list[tuple[tuple[int, int], Sequence[int]]]]  # supply_w -> its records
    if supplies.count(w) == len(supplies):  # every line local (the common case)
        groups = {w: list(stock_lines.items())}
    else:
        groups = {}
        for key, key_quantities in stock_lines.items():
            groups.setdefault(key[0], []).append((key, key_quantities))

    def items(ctx: PieceContext) -> list[tuple[int, str, str]]:
        rows = list(map(ctx.getter("item"), item_ids))
        if None in rows:
            ctx.abort(f"invalid item id {item_ids[rows.index(None)]}")  # the spec's 1% rollback
        return list(map(_ITEM_FIELDS, rows))

    dist_column = _DIST_COLUMNS[d - 1]
    names = _STOCK_PIECE_NAMES[: len(groups)]
    pieces = [Piece("items", items, (ITEM_KEY,), may_abort=True)]
    pieces += [
        Piece(
            name,
            partial(_stock_update, group, dist_column, int(supply_w != w)),
            (),
            tuple([("stock", supply_w, i_id) for (_, i_id), _ in group]),
        )
        for name, (supply_w, group) in zip(names, groups.items())
    ]
    group_keys = [[key for key, _ in group] for group in groups.values()]

    def order(ctx: PieceContext) -> dict[str, Any]:
        item_rows = ctx.input("items")
        stock_rows: dict[tuple[int, int], Sequence[Any]] = {}  # (dist, data, levels) each
        for name, records in zip(names, group_keys):
            stock_rows.update(zip(records, ctx.input(name)))
        return _place_order(ctx, w, d, c, lines, item_rows, stock_rows, w_tax, customer, entry_d)

    pieces.append(Piece("order", order, (), (("district", w, d),), ("items", *names)))
    return pieces


def _stock_update(
    group: list[tuple[tuple[int, int], Sequence[int]]],
    dist_column: str,
    remote: int,
    ctx: PieceContext,
) -> list[tuple[str, str, list[int]]]:
    """A NewOrder's stock piece of one supply warehouse (bound with ``partial``, cheaper than
    a closure): ``group`` holds each of its records' key (supply_w, i_id) with the quantities
    of the lines naming it; ``remote`` is 1 when that is not the home warehouse. Per record,
    in ``group``'s order: its S_DIST_xx, S_DATA and stock level after each line."""
    get, update = ctx.getter("stock"), ctx.updater("stock")
    out = []
    for key, quantities in group:
        row = get(key)
        level, after_levels = row["s_quantity"], []
        for quantity in quantities:
            level = level - quantity if level - quantity >= 10 else level - quantity + 91
            after_levels.append(level)
        count = len(quantities)
        update(
            key,
            {
                "s_quantity": level,
                "s_ytd": row["s_ytd"] + sum(quantities),
                "s_order_cnt": row["s_order_cnt"] + count,
                "s_remote_cnt": row["s_remote_cnt"] + remote * count,
            },
        )
        out.append((row[dist_column], row["s_data"], after_levels))
    return out


def _place_order(
    ctx: PieceContext,
    w: int,
    d: int,
    c: int,
    lines: list[tuple[int, int, int]],
    item_rows: list[tuple[int, str, str]],
    stock_rows: dict[tuple[int, int], Sequence[Any]],
    w_tax: int,
    customer: Mapping[str, Any],
    entry_d: int,
) -> dict[str, Any]:
    district = ctx.get("district", (w, d))
    o_id, d_tax = district["d_next_o_id"], district["d_tax"]
    ctx.update("district", (w, d), {"d_next_o_id": o_id + 1})
    all_local = int(all(supply_w == w for _, supply_w, _ in lines))
    ctx.insert(
        "orders",
        (w, d, o_id),
        {
            "o_id": o_id,
            "o_d_id": d,
            "o_w_id": w,
            "o_c_id": c,
            "o_entry_d": entry_d,
            "o_carrier_id": None,
            "o_ol_cnt": len(lines),
            "o_all_local": all_local,
        },
    )
    ctx.insert("new_order", (w, d, o_id), {"no_o_id": o_id, "no_d_id": d, "no_w_id": w})
    out_lines, amount_sum = _insert_order_lines(ctx, (w, d, o_id), lines, item_rows, stock_rows)
    discount = customer["c_discount"]
    # Rates are in 1/10000: total = sum * (1 - discount) * (1 + w_tax + d_tax), rounded.
    total = (amount_sum * (10_000 - discount) * (10_000 + w_tax + d_tax) + 50_000_000) // (
        100_000_000
    )
    return {
        "w_id": w,
        "d_id": d,
        "c_id": c,
        "o_id": o_id,
        "o_ol_cnt": len(lines),
        "o_entry_d": entry_d,
        "total_cents": total,
        "c_last": customer["c_last"],
        "c_credit": customer["c_credit"],
        "c_discount": discount,
        "w_tax": w_tax,
        "d_tax": d_tax,
        "lines": out_lines,
    }


def _insert_order_lines(
    ctx: PieceContext,
    order_pk: tuple[int, int, int],
    lines: list[tuple[int, int, int]],
    item_rows: list[tuple[int, str, str]],
    stock_rows: dict[tuple[int, int], Sequence[Any]],
) -> tuple[list[tuple[Any, ...]], int]:
    """Insert the order's lines; returns the client's per-line results and the amount sum.

    Each line's row is built inline, as ``_replay_new_order`` builds the same (a call per line
    costs this hot loop measurably)."""
    w, d, o_id = order_pk
    insert = ctx.inserter("order_line")
    used: dict[tuple[int, int], int] = {}  # lines seen per stock record (duplicate items)
    repeats = len(stock_rows) < len(lines)
    out_lines, amount_sum = [], 0
    for number, ((i_id, supply_w, quantity), (price, i_name, i_data)) in enumerate(
        zip(lines, item_rows), start=1
    ):
        key = (supply_w, i_id)
        dist_info, s_data, levels = stock_rows[key]
        seen = 0
        if repeats:
            seen = used.get(key, 0)
            used[key] = seen + 1
        amount = quantity * price
        amount_sum += amount
        insert(
            (w, d, o_id, number),
            {
                "ol_o_id": o_id,
                "ol_d_id": d,
                "ol_w_id": w,
                "ol_number": number,
                "ol_i_id": i_id,
                "ol_supply_w_id": supply_w,
                "ol_delivery_d": None,
                "ol_quantity": quantity,
                "ol_amount": amount,
                "ol_dist_info": dist_info,
            },
        )
        brand = "B" if "ORIGINAL" in i_data and "ORIGINAL" in s_data else "G"
        out_lines.append((supply_w, i_id, i_name, quantity, levels[seen], brand, price, amount))
    return out_lines, amount_sum


# -- Payment and OrderStatus ------------------------------------------------------------------


def _named_customer(view: ReadView, w: int, d: int, c_last: str) -> int | None:
    """The C_ID of district (w, d)'s middle customer (rounded up) named ``c_last``, in C_FIRST
    order (clause 2.5.2.2); None if none is."""
    pks = view.lookup("customer", "by_last", (w, d, c_last))
    if not pks:
        return None
    rows = view.rows("customer")
    named = sorted((rows[pk]["c_first"], pk) for pk in pks)
    return named[(len(named) - 1) // 2][1][2]  # type: ignore[no-any-return]


def _payment_pieces(params: Mapping[str, Any], c: int, h_data: str) -> list[Piece]:
    """Warehouse and district YTD, then customer ``c``; a home customer's piece does its
    district too (both keys lie in one partition, and the district piece would come first
    anyway)."""
    w, d, c_w, c_d = params["w_id"], params["d_id"], params["c_w_id"], params["c_d_id"]
    amount = params["h_amount"]

    def warehouse(ctx: PieceContext) -> None:
        ctx.update("warehouse", w, {"w_ytd": ctx.get("warehouse", w)["w_ytd"] + amount})

    def district(ctx: PieceContext) -> None:
        ctx.update("district", (w, d), {"d_ytd": ctx.get("district", (w, d))["d_ytd"] + amount})

    def customer(ctx: PieceContext) -> dict[str, Any]:
        return _pay_customer(ctx, params, c, h_data)

    def district_and_customer(ctx: PieceContext) -> dict[str, Any]:
        district(ctx)
        return _pay_customer(ctx, params, c, h_data)

    group = (("customers", c_w, c_d),)  # read: ordered after a Delivery in the district
    pieces = [Piece("warehouse", warehouse, writes=(("warehouse", w),))]
    if (c_w, c_d) == (w, d):  # a home customer: one piece does both (one partition)
        both = (("district", w, d), ("customer", w, d, c))
        pieces.append(Piece("customer", district_and_customer, reads=group, writes=both))
    else:
        pieces.append(Piece("district", district, writes=(("district", w, d),)))
        mine = (("customer", c_w, c_d, c),)
        pieces.append(Piece("customer", customer, reads=group, writes=mine))
    return pieces


def _pay_customer(
    ctx: PieceContext, params: Mapping[str, Any], c: int, h_data: str
) -> dict[str, Any]:
    """Charge customer ``c``, prepend to a bad-credit C_DATA, and record the HISTORY row."""
    w, d, c_w, c_d = params["w_id"], params["d_id"], params["c_w_id"], params["c_d_id"]
    amount = params["h_amount"]
    pk = (c_w, c_d, c)
    row: Mapping[str, Any] = ctx.get("customer", pk)  # type: ignore[assignment]
    count = row["c_payment_cnt"] + 1
    changes: dict[str, Any] = {
        "c_balance": row["c_balance"] - amount,
        "c_ytd_payment": row["c_ytd_payment"] + amount,
        "c_payment_cnt": count,
    }
    if row["c_credit"] == "BC":
        entry = f"{pk[2]} {c_d} {c_w} {d} {w} {amount}|"
        changes["c_data"] = (entry + row["c_data"])[:C_DATA_CHARS]
    result = {
        "c_id": pk[2],
        "c_first": row["c_first"],
        "c_middle": row["c_middle"],
        "c_last": row["c_last"],
        "c_since": row["c_since"],
        "c_credit": row["c_credit"],
        "c_credit_lim": row["c_credit_lim"],
        "c_discount": row["c_discount"],
        "c_balance": changes["c_balance"],
        "c_data": changes["c_data"][:200] if "c_data" in changes else "",
        "h_amount": amount,
        "h_date": params["h_date"],
    }
    ctx.update("customer", pk, changes)
    history = {
        "h_c_id": pk[2],
        "h_c_d_id": c_d,
        "h_c_w_id": c_w,
        "h_d_id": d,
        "h_w_id": w,
        "h_date": params["h_date"],
        "h_amount": amount,
        "h_data": h_data,
    }
    ctx.insert("history", (c_w, c_d, pk[2], count), history)
    return result


def _order_status(ctx: PieceContext, w: int, d: int, c: int) -> dict[str, Any]:
    pk = (w, d, c)
    row: Mapping[str, Any] = ctx.get("customer", pk)  # type: ignore[assignment]
    result: dict[str, Any] = {
        "c_id": pk[2],
        "c_first": row["c_first"],
        "c_middle": row["c_middle"],
        "c_last": row["c_last"],
        "c_balance": row["c_balance"],
        "o_id": None,
        "o_carrier_id": None,
        "lines": [],
    }
    o_pk = ctx.last("orders", "by_customer", (w, d, pk[2]))
    if o_pk is None:  # possible only when a scaled-down district has fewer orders than customers
        return result
    order = ctx.get("orders", o_pk)
    result.update(o_id=o_pk[2], o_entry_d=order["o_entry_d"], o_carrier_id=order["o_carrier_id"])
    for number in range(1, order["o_ol_cnt"] + 1):
        line = ctx.get("order_line", (w, d, o_pk[2], number))  # o_pk is (w, d, o_id)
        result["lines"].append(
            (
                line["ol_supply_w_id"],
                line["ol_i_id"],
                line["ol_quantity"],
                line["ol_amount"],
                line["ol_delivery_d"],
            )
        )
    return result


# -- Delivery ---------------------------------------------------------------------------------


def _deliver(w: int, d: int, carrier: int, date: int) -> Any:
    def deliver(ctx: PieceContext) -> int | None:
        """Deliver the district's oldest new order; None when it has none (skipped)."""
        no_pk = ctx.first("new_order", "by_district", (w, d))
        if no_pk is None:
            return None
        ctx.delete("new_order", no_pk)
        order = ctx.get("orders", no_pk)
        ctx.update("orders", no_pk, {"o_carrier_id": carrier})
        total = 0
        line_of, update_line = ctx.getter("order_line"), ctx.updater("order_line")
        delivered = {"ol_delivery_d": date}  # read, never kept, by each update
        o_id = no_pk[2]  # no_pk is (w, d, o_id); spelled out below, a star builds a list
        for number in range(1, order["o_ol_cnt"] + 1):
            line_pk = (w, d, o_id, number)
            total += line_of(line_pk)["ol_amount"]  # type: ignore[index]
            update_line(line_pk, delivered)
        c_pk = (w, d, order["o_c_id"])
        customer = ctx.get("customer", c_pk)
        ctx.update(
            "customer",
            c_pk,
            {
                "c_balance": customer["c_balance"] + total,
                "c_delivery_cnt": customer["c_delivery_cnt"] + 1,
            },
        )
        return no_pk[2]

    return deliver


def _delivery_result(outputs: dict[str, Any]) -> dict[str, Any]:
    delivered = []
    for d in range(1, DISTRICTS_PER_WAREHOUSE + 1):
        o_id = outputs.get(f"d{d}")
        if o_id is not None:
            delivered.append((d, o_id))
    return {"delivered": delivered, "skipped": DISTRICTS_PER_WAREHOUSE - len(delivered)}


# -- Replay of committed calls (dependency-log recovery) --------------------------------------


class _Direct(ReadView):
    """The record access ``_pay_customer`` needs, straight on the tables: a ``ReadView``'s
    reads plus writes, for replaying a committed Payment whole (its keys were checked when it
    first ran)."""

    __slots__ = ()

    def update(self, table: str, pk: Any, changes: Mapping[str, Any]) -> None:
        self._db.tables[table].update(pk, changes)

    def insert(self, table: str, pk: Any, row: dict[str, Any]) -> None:
        self._db.tables[table].insert(pk, row)


def _replay_new_order(db: Database, params: Mapping[str, Any]) -> None:
    """NewOrder's writes once its item check passed: the stock pieces' updates line by line
    (the same totals as per stock record) and ``_place_order``'s rows, without its result.

    Rows change in place (``Table.changer``) and the lines go in with one ``insert_many``;
    each line's row is the one ``_insert_order_lines`` builds, built inline here too.
    D_NEXT_O_ID is read first: no stock write changes it.
    """
    w, d, lines = params["w_id"], params["d_id"], params["lines"]
    tables = db.tables
    stock, item_rows, district = tables["stock"], tables["item"].rows, tables["district"]
    stock_row = stock.changer(("s_quantity", "s_ytd", "s_order_cnt", "s_remote_cnt"))
    dist_column = _DIST_COLUMNS[d - 1]
    d_row = district.changer(("d_next_o_id",))((w, d))
    o_id = d_row["d_next_o_id"]
    d_row["d_next_o_id"] = o_id + 1
    new_lines = {}
    remote_lines = 0
    for number, (i_id, supply_w, quantity) in enumerate(lines, start=1):
        row = stock_row((supply_w, i_id))
        level = row["s_quantity"] - quantity
        remote = 0 if supply_w == w else 1
        row["s_quantity"] = level if level >= 10 else level + 91
        row["s_ytd"] += quantity
        row["s_order_cnt"] += 1
        row["s_remote_cnt"] += remote
        remote_lines += remote
        new_lines[(w, d, o_id, number)] = {
            "ol_o_id": o_id,
            "ol_d_id": d,
            "ol_w_id": w,
            "ol_number": number,
            "ol_i_id": i_id,
            "ol_supply_w_id": supply_w,
            "ol_delivery_d": None,
            "ol_quantity": quantity,
            "ol_amount": quantity * item_rows[i_id]["i_price"],
            "ol_dist_info": row[dist_column],
        }
    order = {
        "o_id": o_id,
        "o_d_id": d,
        "o_w_id": w,
        "o_c_id": params["c_id"],
        "o_entry_d": params["entry_d"],
        "o_carrier_id": None,
        "o_ol_cnt": len(lines),
        "o_all_local": 0 if remote_lines else 1,
    }
    tables["orders"].insert((w, d, o_id), order)
    tables["new_order"].insert((w, d, o_id), {"no_o_id": o_id, "no_d_id": d, "no_w_id": w})
    tables["order_line"].insert_many(new_lines)


def _replay_payment(db: Database, params: Mapping[str, Any]) -> None:
    """Payment's three pieces in order (the YTDs changed in place); W_NAME and D_NAME never
    change, nor does a by-last-name customer's choice, so they are read now."""
    w, d, amount = params["w_id"], params["d_id"], params["h_amount"]
    warehouse, district = db.tables["warehouse"], db.tables["district"]
    w_row, d_row = warehouse.changer(("w_ytd",))(w), district.changer(("d_ytd",))((w, d))
    w_row["w_ytd"] += amount
    d_row["d_ytd"] += amount
    direct = _Direct(db)
    c = params["c_id"] or _named_customer(
        direct, params["c_w_id"], params["c_d_id"], params["c_last"]
    )
    _pay_customer(direct, params, c, w_row["w_name"] + "    " + d_row["d_name"])  # type: ignore[arg-type]


def _replay_delivery(db: Database, params: Mapping[str, Any]) -> None:
    """Delivery's ten district pieces in order (``_deliver``), on the tables directly: rows
    whose changed fields no index depends on change in place (``Table.changer``)."""
    w, carrier, date = params["w_id"], params["o_carrier_id"], params["ol_delivery_d"]
    tables = db.tables
    new_orders, orders, lines, customers = (
        tables["new_order"],
        tables["orders"],
        tables["order_line"],
        tables["customer"],
    )
    oldest = new_orders.indexes["by_district"].first
    order_row, line_row = orders.changer(("o_carrier_id",)), lines.changer(("ol_delivery_d",))
    customer_row = customers.changer(("c_balance", "c_delivery_cnt"))
    for d in range(1, DISTRICTS_PER_WAREHOUSE + 1):
        no_pk = oldest((w, d))
        if no_pk is None:
            continue
        new_orders.delete(no_pk)
        order = order_row(no_pk)
        order["o_carrier_id"] = carrier
        total = 0
        for number in range(1, order["o_ol_cnt"] + 1):
            line = line_row((*no_pk, number))
            total += line["ol_amount"]
            line["ol_delivery_d"] = date
        c_pk = (w, d, order["o_c_id"])
        customer = customer_row(c_pk)
        customer["c_balance"] += total
        customer["c_delivery_cnt"] += 1
