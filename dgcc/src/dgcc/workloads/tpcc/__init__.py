"""TPC-C (TPC-C 5.11): nine tables, five transactions at the standard mix, consistency checks.

Conflict granularity (a design decision). A piece touches one record or one coarse virtual
record, and its keys are known from the parameters before the batch runs:

  * ``("district", w, d)`` covers the district row *and* that district's orders, new-orders,
    order lines and their index entries. Every NewOrder writes the district row anyway, so
    little concurrency is lost, and it makes the data-dependent keys safe without
    reconnaissance: NewOrder's O_ID (D_NEXT_O_ID) and Delivery's oldest new order.
  * ``("customer", w, d, c)`` covers a customer and its history rows, in the group
    ``("customers", w, d)`` of the district's customers (see ``storage.Table``'s
    ``group_key``), which also guards the C_LAST index. Payment and OrderStatus name their
    customer at plan time (a by-last-name one through the C_LAST index: C_LAST and C_FIRST
    never change, and the customer table is kept whole on every node for plan-time reads),
    declare its key and read the group key. Delivery finds the customer it charges (its oldest
    order's) only as it runs, so it writes the group key. Two Payments order only on one
    customer, and none orders against the district's NewOrders (whose customer columns, never
    updated, are read at plan time): a remote Payment holds one customer across its exchange
    under a lock-holding protocol such as Calvin, as a row-locking one would.
  * ``("warehouse", w)``, ``("stock", w, i)``: one record each.
  * ``("item", 0)``: the whole ITEM table, read-only, never written; replicated on every
    partition.

Columns no transaction changes (W_TAX, W_NAME, D_NAME, C_LAST, C_CREDIT, C_DISCOUNT) are read
or checked at plan time. StockLevel, which the spec allows at read-committed isolation, fixes
its 20-order range at plan time and reads the stock in its serial position; see
``procedures``.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

from dgcc.api import ProcedureRegistry, TxnRequest
from dgcc.errors import ConfigError, brief
from dgcc.storage import Database
from dgcc.workloads import REPLICATED, Workload, register_workload
from dgcc.workloads.tpcc.checks import check
from dgcc.workloads.tpcc.generator import requests
from dgcc.workloads.tpcc.loader import load
from dgcc.workloads.tpcc.procedures import make_registry
from dgcc.workloads.tpcc.schema import (
    DISTRICTS_PER_WAREHOUSE,
    MIX_STANDARD,
    PROCEDURES,
    TpccConfig,
    create_tables,
)

__all__ = ["MIX_STANDARD", "PROCEDURES", "REPLICATED", "TpccConfig", "TpccWorkload"]

ORDER_LINES_MEAN = 10  # lines of a loaded order: 5..15, uniform
TPCC_ROW_BYTES = 720  # a loaded row, measured (tracemalloc) over the whole initial database
_SUPPLY_W_ID = operator.itemgetter(1)  # of an order line (i_id, supply_w_id, quantity)
_WAREHOUSE_ID_TYPES = frozenset({int, bool})  # what partition_of's isinstance(key[1], int) takes


@register_workload
class TpccWorkload(Workload):
    """TPC-C over ``TpccConfig`` options (``warehouses=4``, ``items=1000`` ...)."""

    name = "tpcc"
    # W_TAX, W_NAME, D_NAME, NewOrder's customer columns (never updated) and the C_LAST index
    # (customers never change name nor get added) are read at plan time by every participant.
    plan_tables = ("warehouse", "district", "customer")

    def __init__(self, **options: Any) -> None:
        try:
            self.config = TpccConfig(**options)
        except TypeError as error:
            raise ConfigError(f"bad tpcc options {sorted(options)}: {error}") from None

    def schema(self) -> Database:
        return create_tables()

    def data_bytes(self) -> tuple[int, str]:
        c = self.config
        districts = DISTRICTS_PER_WAREHOUSE * c.warehouses
        orders = districts * c.orders_per_district
        rows = c.items * (1 + c.warehouses) + districts * 2 * c.customers_per_district
        rows += orders * (1 + ORDER_LINES_MEAN)  # ORDERS and ORDER_LINE (NEW_ORDER: a 30% tail)
        return rows * TPCC_ROW_BYTES, f"warehouses={c.warehouses}, items={c.items}"

    def build(self, seed: int) -> Database:
        self.check_fits_memory()
        return load(self.config, seed)  # loads into create_tables(), the same as schema()

    def registry(self) -> ProcedureRegistry:
        return make_registry(self.config)

    def requests(self, seed: int) -> Iterator[TxnRequest]:
        return requests(self.config, seed)

    def check(self, db: Database) -> list[str]:
        """The scale's row counts (the tables no transaction grows), then the spec's
        consistency conditions."""
        c = self.config
        districts = DISTRICTS_PER_WAREHOUSE * c.warehouses
        expected = {
            "warehouse": (c.warehouses, "warehouses"),
            "district": (districts, "warehouses"),
            "customer": (districts * c.customers_per_district, "customers_per_district"),
            "item": (c.items, "items"),
            "stock": (c.warehouses * c.items, "warehouses and items"),
        }
        found = [
            f"{table} has {len(db[table]):,} rows, expected {count:,} (options: {options})"
            for table, (count, options) in expected.items()
            if len(db[table]) != count
        ]
        return found + check(db)

    def partition_of(self, key: Hashable, partitions: int) -> int:
        """Warehouse w lives on partition (w - 1) % partitions; ITEM keys are ``REPLICATED``."""
        if not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"partitions={partitions!r} must be an integer >= 1")
        if isinstance(key, tuple) and len(key) >= 2 and isinstance(key[1], int):
            if key[0] in ("warehouse", "district", "customer", "customers", "stock"):
                return (key[1] - 1) % partitions
            if key[0] == "item":
                return REPLICATED
        raise ConfigError(f"not a tpcc conflict key: {key!r}")

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable] | None:
        """The warehouses a call touches: its home, remote supply and remote customer ones."""
        if procedure == "new_order":
            return [("warehouse", params["w_id"])] + [
                ("warehouse", line[1]) for line in params["lines"]
            ]
        if procedure == "payment":
            return [("warehouse", params["w_id"]), ("warehouse", params["c_w_id"])]
        if procedure in PROCEDURES:
            return [("warehouse", params["w_id"])]
        return None

    def route_partitions(
        self, procedure: str, params: Mapping[str, Any], partitions: int
    ) -> set[int] | None:
        """The partitions of ``route_keys`` by ``partition_of``'s arithmetic: no key tuple to
        build and hash per order line (every call is routed on its origin, and again on each
        peer it is sent to)."""
        if procedure == "new_order":
            warehouses = {params["w_id"], *map(_SUPPLY_W_ID, params["lines"])}
        elif procedure == "payment":
            warehouses = {params["w_id"], params["c_w_id"]}
        elif procedure in PROCEDURES:
            warehouses = {params["w_id"]}
        else:
            return None
        if not _WAREHOUSE_ID_TYPES.issuperset(map(type, warehouses)):  # as partition_of checks
            raise TypeError(f"{procedure}: warehouse ids {brief(list(warehouses))} are not ints")
        return {(w - 1) % partitions for w in warehouses}

    def describe(self) -> dict[str, Any]:
        return {"workload": self.name, **self.config.describe()}
