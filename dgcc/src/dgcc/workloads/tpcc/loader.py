"""TPC-C initial population (clause 4.3.3), deterministic from a seed and fast enough to bench.

Random strings are slices of one random pool at random offsets, so a 100k-row STOCK table costs
a few hundred thousand ``random()`` calls rather than millions of per-character draws.
"""

from __future__ import annotations

import logging
import random
import string
from collections.abc import Callable

from dgcc.storage import Database, Table, collector_paused
from dgcc.workloads.tpcc.schema import (
    C_LAST_LOAD,
    DISTRICTS_PER_WAREHOUSE,
    LOAD_DATE_S,
    NAMES_MAX,
    TpccConfig,
    create_tables,
    last_name,
    nurand,
)

__all__ = ["load"]

logger = logging.getLogger(__name__)

_POOL_CHARS = 1 << 20
_DIST_COLUMNS = tuple(f"s_dist_{d:02d}" for d in range(1, DISTRICTS_PER_WAREHOUSE + 1))


class _Random:
    """Spec draws over one ``random.Random``: uniform ints, a-strings, n-strings."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.random01: Callable[[], float] = self._rng.random
        alnum = string.ascii_letters + string.digits
        self._letters = "".join(self._rng.choices(alnum, k=_POOL_CHARS))
        self._digits = "".join(self._rng.choices(string.digits, k=_POOL_CHARS >> 4))

    def uniform(self, low: int, high: int) -> int:
        return low + int(self.random01() * (high - low + 1))

    def a_string(self, low: int, high: int) -> str:
        length = low + int(self.random01() * (high - low + 1))
        start = int(self.random01() * (_POOL_CHARS - length))
        return self._letters[start : start + length]

    def n_string(self, length: int) -> str:
        start = int(self.random01() * (len(self._digits) - length))
        return self._digits[start : start + length]

    def data(self) -> str:
        """I_DATA / S_DATA: 26..50 chars, 10% with "ORIGINAL" at a random position."""
        text = self.a_string(26, 50)
        if self.random01() < 0.1:
            at = int(self.random01() * (len(text) - 8))
            text = text[:at] + "ORIGINAL" + text[at + 8 :]
        return text

    def permutation(self, count: int) -> list[int]:
        values = list(range(1, count + 1))
        self._rng.shuffle(values)
        return values


def load(config: TpccConfig, seed: int) -> Database:
    """Create the tables and populate W warehouses at ``config``'s scale."""
    db = create_tables()
    draw = _Random(seed)
    # Loading allocates millions of long-lived, acyclic rows; left on, the cyclic GC rescans
    # the growing heap again and again, so load time grows faster than the warehouse count.
    with collector_paused():
        _load_items(db["item"], config, draw)
        for w in range(1, config.warehouses + 1):
            _load_warehouse(db, config, draw, w)
            _load_stock(db["stock"], config, draw, w)
            for d in range(1, DISTRICTS_PER_WAREHOUSE + 1):
                _load_district(db, config, draw, w, d)
                _load_customers(db, config, draw, w, d)
                _load_orders(db, config, draw, w, d)
    logger.debug("tpcc loaded %s", {name: len(table) for name, table in db.tables.items()})
    return db


def _address(draw: _Random, prefix: str) -> dict[str, str]:
    return {
        f"{prefix}_street_1": draw.a_string(10, 20),
        f"{prefix}_street_2": draw.a_string(10, 20),
        f"{prefix}_city": draw.a_string(10, 20),
        f"{prefix}_state": draw.a_string(2, 2).upper(),
        f"{prefix}_zip": draw.n_string(4) + "11111",
    }


def _load_items(table: Table, config: TpccConfig, draw: _Random) -> None:
    for i in range(1, config.items + 1):
        table.insert(
            i,
            {
                "i_id": i,
                "i_im_id": draw.uniform(1, 10_000),
                "i_name": draw.a_string(14, 24),
                "i_price": draw.uniform(100, 10_000),
                "i_data": draw.data(),
            },
        )


def _load_warehouse(db: Database, config: TpccConfig, draw: _Random, w: int) -> None:
    # W_YTD = sum of D_YTD = sum of the initial H_AMOUNTs (10.00 per customer).
    ytd = 1000 * config.customers_per_district * DISTRICTS_PER_WAREHOUSE
    row = {"w_id": w, "w_name": draw.a_string(6, 10), **_address(draw, "w")}
    row.update(w_tax=draw.uniform(0, 2000), w_ytd=ytd)
    db["warehouse"].insert(w, row)


def _load_stock(table: Table, config: TpccConfig, draw: _Random, w: int) -> None:
    random01, a_string, data = draw.random01, draw.a_string, draw.data
    dists = _DIST_COLUMNS
    for i in range(1, config.items + 1):
        row = {"s_i_id": i, "s_w_id": w, "s_quantity": 10 + int(random01() * 91)}
        # One 240-char slice cut in ten: the ten S_DIST_xx strings for one draw.
        block = a_string(240, 240)
        for number, column in enumerate(dists):
            row[column] = block[24 * number : 24 * number + 24]
        row.update(s_ytd=0, s_order_cnt=0, s_remote_cnt=0, s_data=data())
        table.insert((w, i), row)


def _load_district(db: Database, config: TpccConfig, draw: _Random, w: int, d: int) -> None:
    row = {"d_id": d, "d_w_id": w, "d_name": draw.a_string(6, 10), **_address(draw, "d")}
    row.update(
        d_tax=draw.uniform(0, 2000),
        d_ytd=1000 * config.customers_per_district,
        d_next_o_id=config.orders_per_district + 1,
    )
    db["district"].insert((w, d), row)


def _load_customers(db: Database, config: TpccConfig, draw: _Random, w: int, d: int) -> None:
    customers, history = db["customer"], db["history"]
    random01 = draw.random01
    for c in range(1, config.customers_per_district + 1):
        number = c - 1 if c <= NAMES_MAX else nurand(random01, 255, 0, NAMES_MAX - 1, C_LAST_LOAD)
        row = {
            "c_id": c,
            "c_d_id": d,
            "c_w_id": w,
            "c_first": draw.a_string(8, 16),
            "c_middle": "OE",
            "c_last": last_name(number),
            **_address(draw, "c"),
        }
        row.update(
            c_phone=draw.n_string(16),
            c_since=LOAD_DATE_S,
            c_credit="BC" if random01() < 0.1 else "GC",
            c_credit_lim=5_000_000,
            c_discount=draw.uniform(0, 5000),
            c_balance=-1000,
            c_ytd_payment=1000,
            c_payment_cnt=1,
            c_delivery_cnt=0,
            c_data=draw.a_string(300, 500),
        )
        customers.insert((w, d, c), row)
        # History is keyed (customer, C_PAYMENT_CNT at insert): unique, and it lies in the
        # customer's district conflict key. The spec gives HISTORY no primary key.
        history.insert(
            (w, d, c, 1),
            {
                "h_c_id": c,
                "h_c_d_id": d,
                "h_c_w_id": w,
                "h_d_id": d,
                "h_w_id": w,
                "h_date": LOAD_DATE_S,
                "h_amount": 1000,
                "h_data": draw.a_string(12, 24),
            },
        )


def _load_orders(db: Database, config: TpccConfig, draw: _Random, w: int, d: int) -> None:
    orders, new_orders, lines = db["orders"], db["new_order"], db["order_line"]
    random01, a_string = draw.random01, draw.a_string
    customers = config.customers_per_district
    permutation = draw.permutation(customers)
    first_new = config.orders_per_district - config.new_orders_per_district + 1
    for o in range(1, config.orders_per_district + 1):
        delivered = o < first_new
        count = 5 + int(random01() * 11)
        orders.insert(
            (w, d, o),
            {
                "o_id": o,
                "o_d_id": d,
                "o_w_id": w,
                "o_c_id": permutation[(o - 1) % customers],
                "o_entry_d": LOAD_DATE_S,
                "o_carrier_id": 1 + int(random01() * 10) if delivered else None,
                "o_ol_cnt": count,
                "o_all_local": 1,
            },
        )
        if not delivered:
            new_orders.insert((w, d, o), {"no_o_id": o, "no_d_id": d, "no_w_id": w})
        for number in range(1, count + 1):
            lines.insert(
                (w, d, o, number),
                {
                    "ol_o_id": o,
                    "ol_d_id": d,
                    "ol_w_id": w,
                    "ol_number": number,
                    "ol_i_id": 1 + int(random01() * config.items),
                    "ol_supply_w_id": w,
                    "ol_delivery_d": LOAD_DATE_S if delivered else None,
                    "ol_quantity": 5,
                    "ol_amount": 0 if delivered else 1 + int(random01() * 999_999),
                    "ol_dist_info": a_string(24, 24),
                },
            )
