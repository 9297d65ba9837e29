"""The TPC-C request stream (clause 2.4.1-2.8.1 inputs), endless and deterministic from a seed.

Each request comes from a terminal whose home warehouse is uniform over ``config.homes``; the
procedure is drawn from the mix. Dates are a counter from the load date, never the wall clock,
so one seed always yields the same stream.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator
from typing import Any

from dgcc.api import TxnRequest
from dgcc.workloads.tpcc.schema import (
    C_ID,
    C_LAST_RUN,
    C_OL_I_ID,
    DISTRICTS_PER_WAREHOUSE,
    LOAD_DATE_S,
    MIX_STANDARD,
    TpccConfig,
    last_name,
    nurand,
)

__all__ = ["requests"]

_REDRAWS_MAX = 100  # bound on redraws for distinct item ids within one order


def requests(config: TpccConfig, seed: int) -> Iterator[TxnRequest]:
    """Endless requests in the configured mix; the same seed gives the same stream."""
    stream = _Stream(config, seed)
    mix = config.mix or MIX_STANDARD
    names = [name for name, weight in mix.items() if weight > 0]
    cumulative = list(itertools.accumulate(mix[name] for name in names))
    makers = {
        "new_order": stream.new_order,
        "payment": stream.payment,
        "order_status": stream.order_status,
        "delivery": stream.delivery,
        "stock_level": stream.stock_level,
    }
    random01, homes = stream.random01, config.homes
    for date in itertools.count(LOAD_DATE_S + 1):
        name = names[bisect.bisect_right(cumulative, random01() * cumulative[-1])]
        w = homes[int(random01() * len(homes))]
        yield TxnRequest(name, makers[name](w, date))


class _Stream:
    def __init__(self, config: TpccConfig, seed: int) -> None:
        self.config = config
        self.random01 = random.Random(seed).random

    def uniform(self, low: int, high: int) -> int:
        return low + int(self.random01() * (high - low + 1))

    def customer_id(self) -> int:
        return nurand(self.random01, 1023, 1, self.config.customers_per_district, C_ID)

    def other_warehouse(self, w: int) -> int:
        """A warehouse other than ``w`` (uniform), or ``w`` itself when it is the only one."""
        count = self.config.warehouses
        if count == 1:
            return w
        other = self.uniform(1, count - 1)
        return other + 1 if other >= w else other

    def customer(self) -> tuple[int, str]:
        """(c_id, "") or (0, c_last): 60% by last name (clause 2.5.1.2)."""
        if self.random01() < self.config.by_last_name_fraction:
            number = nurand(self.random01, 255, 0, self.config.names - 1, C_LAST_RUN)
            return 0, last_name(number)
        return self.customer_id(), ""

    def new_order(self, w: int, date: int) -> dict[str, Any]:
        config, random01 = self.config, self.random01
        count = self.uniform(5, 15)
        item_ids: list[int] = []
        for _ in range(count):
            for _attempt in range(_REDRAWS_MAX):
                i_id = nurand(random01, 8191, 1, config.items, C_OL_I_ID)
                if i_id not in item_ids:
                    break
            item_ids.append(i_id)
        if random01() < config.rollback_fraction:
            item_ids[-1] = config.items + 1  # an unused item id: the transaction rolls back
        lines = []
        for i_id in item_ids:
            remote = config.warehouses > 1 and random01() < config.remote_item_fraction
            lines.append((i_id, self.other_warehouse(w) if remote else w, self.uniform(1, 10)))
        return {
            "w_id": w,
            "d_id": self.uniform(1, DISTRICTS_PER_WAREHOUSE),
            "c_id": self.customer_id(),
            "lines": lines,
            "entry_d": date,
        }

    def payment(self, w: int, date: int) -> dict[str, Any]:
        d = self.uniform(1, DISTRICTS_PER_WAREHOUSE)
        c_w, c_d = w, d
        remote = self.config.warehouses > 1
        if remote and self.random01() < self.config.remote_payment_fraction:
            c_w, c_d = self.other_warehouse(w), self.uniform(1, DISTRICTS_PER_WAREHOUSE)
        c_id, c_last = self.customer()
        return {
            "w_id": w,
            "d_id": d,
            "c_w_id": c_w,
            "c_d_id": c_d,
            "c_id": c_id,
            "c_last": c_last,
            "h_amount": self.uniform(100, 500_000),
            "h_date": date,
        }

    def order_status(self, w: int, date: int) -> dict[str, Any]:
        c_id, c_last = self.customer()
        d = self.uniform(1, DISTRICTS_PER_WAREHOUSE)
        return {"w_id": w, "d_id": d, "c_id": c_id, "c_last": c_last}

    def delivery(self, w: int, date: int) -> dict[str, Any]:
        return {"w_id": w, "o_carrier_id": self.uniform(1, 10), "ol_delivery_d": date}

    def stock_level(self, w: int, date: int) -> dict[str, Any]:
        d = self.uniform(1, DISTRICTS_PER_WAREHOUSE)
        return {"w_id": w, "d_id": d, "threshold": self.uniform(10, 20)}
