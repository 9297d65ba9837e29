"""TPC-C schema: the nine tables, their keys and conflict keys, scale config, and spec constants.

Units: money in integer cents (exact sums), tax and discount rates in 1/10000 (``w_tax=1234`` is
0.1234), dates as integer seconds. Column names are the spec's (TPC-C 5.11, clause 1.3).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from dgcc.errors import ConfigError
from dgcc.storage import Database, Index, Table

__all__ = [
    "DISTRICTS_PER_WAREHOUSE",
    "MIX_STANDARD",
    "PROCEDURES",
    "TpccConfig",
    "create_tables",
    "last_name",
    "nurand",
]

DISTRICTS_PER_WAREHOUSE = 10
LOAD_DATE_S = 1_700_000_000  # C_SINCE, O_ENTRY_D, H_DATE of the initial population
NAMES_MAX = 1000  # distinct last names (syllable triples 000..999)
# NURand C constants (clause 2.1.6): fixed "random" picks; C_LAST run/load delta is 66, which
# lies in [65, 119] and is neither 96 nor 112, as clause 2.1.6.1 requires.
C_LAST_LOAD = 157
C_LAST_RUN = 223
C_ID = 259
C_OL_I_ID = 7911
SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")
PROCEDURES = ("new_order", "payment", "order_status", "delivery", "stock_level")
MIX_STANDARD = {
    "new_order": 45.0,
    "payment": 43.0,
    "order_status": 4.0,
    "delivery": 4.0,
    "stock_level": 4.0,
}


def nurand(random01: Any, a: int, x: int, y: int, c: int) -> int:
    """NURand(A, x, y) of clause 2.1.6, drawing uniforms from ``random01()`` in [0, 1)."""
    first = int(random01() * (a + 1))
    second = x + int(random01() * (y - x + 1))
    return (((first | second) + c) % (y - x + 1)) + x


def last_name(number: int) -> str:
    """C_LAST for ``number`` in 0..999: three syllables by its decimal digits (clause 4.3.2.3)."""
    assert 0 <= number < NAMES_MAX, number
    return SYLLABLES[number // 100] + SYLLABLES[number // 10 % 10] + SYLLABLES[number % 10]


@dataclass(frozen=True)
class TpccConfig:
    """Scale and request-mix options; the defaults are the spec's.

    Args:
        warehouses: number of warehouses (W).
        items: rows of ITEM and, per warehouse, of STOCK (spec 100000).
        customers_per_district: spec 3000.
        orders_per_district: initial orders per district (spec 3000; the last 30% are new).
        home_warehouses: warehouses terminals run on (default all), for partitioned runs.
        mix: percentage per procedure name (default the standard 45/43/4/4/4).
        remote_item_fraction: chance a NewOrder line is supplied by another warehouse (0.01).
        remote_payment_fraction: chance a Payment's customer is in another warehouse (0.15).
        rollback_fraction: chance a NewOrder carries an invalid item and rolls back (0.01).
        by_last_name_fraction: chance Payment and OrderStatus pick the customer by name (0.6).
    """

    warehouses: int = 1
    items: int = 100_000
    customers_per_district: int = 3000
    orders_per_district: int = 3000
    home_warehouses: tuple[int, ...] | None = None
    mix: dict[str, float] | None = None
    remote_item_fraction: float = 0.01
    remote_payment_fraction: float = 0.15
    rollback_fraction: float = 0.01
    by_last_name_fraction: float = 0.6

    def __post_init__(self) -> None:
        for name in ("warehouses", "items", "customers_per_district", "orders_per_district"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"tpcc option {name}={value!r} must be an integer >= 1")
        if self.items < 15:
            raise ConfigError(f"tpcc option items={self.items!r} must be >= 15 (order lines)")
        for name in ("remote_item_fraction", "remote_payment_fraction", "rollback_fraction"):
            _check_fraction(name, getattr(self, name))
        _check_fraction("by_last_name_fraction", self.by_last_name_fraction)
        self._check_home_warehouses()
        self._check_mix()

    def _check_home_warehouses(self) -> None:
        homes = self.home_warehouses
        if homes is None:
            return
        if not isinstance(homes, tuple | list) or not homes:
            raise ConfigError(f"tpcc option home_warehouses={homes!r} must be a non-empty list")
        bad = [w for w in homes if not isinstance(w, int) or not 1 <= w <= self.warehouses]
        if bad:
            raise ConfigError(
                f"tpcc option home_warehouses has {bad!r}; allowed 1..{self.warehouses}"
            )
        object.__setattr__(self, "home_warehouses", tuple(homes))

    def _check_mix(self) -> None:
        mix = self.mix
        if mix is None:
            return
        if not isinstance(mix, dict) or not mix:
            raise ConfigError(f"tpcc option mix={mix!r} must be a non-empty dict")
        unknown = [name for name in mix if name not in PROCEDURES]
        if unknown:
            raise ConfigError(f"tpcc mix names {unknown!r}; choose from {', '.join(PROCEDURES)}")
        weights = list(mix.values())
        if any(not isinstance(v, int | float) or v < 0 for v in weights) or sum(weights) <= 0:
            raise ConfigError(f"tpcc mix={mix!r} needs weights >= 0 with a positive sum")

    @property
    def homes(self) -> tuple[int, ...]:
        return self.home_warehouses or tuple(range(1, self.warehouses + 1))

    @property
    def new_orders_per_district(self) -> int:
        """Initial undelivered orders per district: the last 900 of 3000 at spec scale."""
        return self.orders_per_district * 900 // 3000

    @property
    def names(self) -> int:
        """Distinct last names that exist: all 1000 once a district has that many customers."""
        return min(NAMES_MAX, self.customers_per_district)

    def describe(self) -> dict[str, Any]:
        return {
            "warehouses": self.warehouses,
            "items": self.items,
            "customers_per_district": self.customers_per_district,
            "orders_per_district": self.orders_per_district,
            "home_warehouses": list(self.homes),
            "mix": dict(self.mix or MIX_STANDARD),
            "remote_item_fraction": self.remote_item_fraction,
            "remote_payment_fraction": self.remote_payment_fraction,
            "rollback_fraction": self.rollback_fraction,
            "by_last_name_fraction": self.by_last_name_fraction,
        }


def _check_fraction(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ConfigError(f"tpcc option {name}={value!r} must be a number in [0, 1]")


ITEM_KEY = ("item", 0)  # the read-only ITEM table as one (replicated) virtual record


def _district_key(pk: Any) -> Hashable:
    return ("district", pk[0], pk[1])


def _district_index_key(index: str, index_key: Any) -> Hashable:
    return ("district", index_key[0], index_key[1])


def _customer_key(pk: Any) -> Hashable:  # a customer row, or one of its HISTORY rows
    return ("customer", pk[0], pk[1], pk[2])


def _customers_key(pk: Any) -> Hashable:
    return ("customers", pk[0], pk[1])


def _customers_index_key(index: str, index_key: Any) -> Hashable:
    return ("customers", index_key[0], index_key[1])


def create_tables() -> Database:
    """The nine empty tables with their conflict keys and secondary indexes.

    Conflict keys: ``("warehouse", w)``, ``("district", w, d)`` for the district row and its
    orders, new-orders and order lines (and their index entries), ``("customer", w, d, c)`` for
    a customer and its history rows, in the group ``("customers", w, d)`` of the district's
    customers (which also guards the C_LAST index), ``("stock", w, i)``, and one
    ``ITEM_KEY`` for the whole ITEM table: nothing writes it, so per-item keys would order
    nothing and only cost every NewOrder ten keys to track.
    """
    district_table = {"conflict_key": _district_key, "index_conflict_key": _district_index_key}
    customers_table = {
        "conflict_key": _customer_key,
        "group_key": _customers_key,
        "index_conflict_key": _customers_index_key,
    }
    return Database(
        (
            Table("warehouse", conflict_key=lambda w: ("warehouse", w)),
            Table("district", **district_table),
            Table(
                "customer",
                indexes=(
                    Index(
                        "by_last",
                        lambda pk, row: (pk[0], pk[1], row["c_last"]),
                        frozenset({"c_last"}),
                    ),
                ),
                **customers_table,
            ),
            Table("history", **customers_table),
            Table(
                "orders",
                indexes=(
                    Index(
                        "by_customer",
                        lambda pk, row: (pk[0], pk[1], row["o_c_id"]),
                        frozenset({"o_c_id"}),
                    ),
                ),
                **district_table,
            ),
            Table(
                "new_order",
                indexes=(Index("by_district", lambda pk, row: (pk[0], pk[1]), frozenset()),),
                **district_table,
            ),
            Table("order_line", **district_table),
            Table("item", conflict_key=lambda i: ITEM_KEY),
            Table("stock", conflict_key=lambda pk: ("stock", pk[0], pk[1])),
        )
    )
