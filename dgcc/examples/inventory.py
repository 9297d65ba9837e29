"""Your own stored procedures on dgcc: a small inventory, in-process or on a cluster.

Wherever dgcc takes a workload name it also takes ``package.module:Class``. This file is a
complete workload; run it from the repository root with ``dgcc/examples`` importable (a
cluster's node processes import it too, so they need the same ``PYTHONPATH``):

    PYTHONPATH=dgcc/examples .venv/bin/dgcc bench --workload inventory:Inventory -o items=500
    PYTHONPATH=dgcc/examples .venv/bin/dgcc bench --nodes 2 --workload inventory:Inventory

One table, ``stock``: a row per item, ``{"on_hand": units on the shelf, "sold": units sold}``,
conflict key ``("stock", item)``. Items ``0 .. items - 1`` are spread over partitions by range,
so on a cluster a ``move`` between two items may cross nodes; DistDGCC then sends the source's
abort decision to the destination's node, and no node ever sees a dirty write.

Procedures (each a list of pieces with the keys they touch):

* ``sell(item, qty)``: aborts when fewer than ``qty`` units are on hand.
* ``restock(item, qty)``: adds ``qty`` units.
* ``move(src, dst, qty)``: moves units from one item's shelf to another's; aborts when the
  source has too few.
* ``count(item)``: the item's units on hand and sold.

Invariants: no shelf is negative, and the units on hand plus sold equal the initial units plus
every committed restock (``observe`` counts those).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

from dgcc.api import Outcome, Piece, PieceContext, Procedure, ProcedureRegistry, TxnRequest
from dgcc.errors import BadParams, ConfigError, brief
from dgcc.storage import Database, ReadView, Table
from dgcc.workloads import Workload

__all__ = ["Inventory"]

MIX = (("sell", 50), ("restock", 15), ("move", 20), ("count", 15))


def _key(item: int) -> tuple[str, int]:
    return ("stock", item)


class Inventory(Workload):
    """Shelves of ``items`` items holding ``units`` units each at the start.

    Raises:
        ConfigError: an option that is not a positive int (``items`` needs at least 2).
    """

    name = "inventory"

    def __init__(self, *, items: int = 1_000, units: int = 50) -> None:
        for option, value, least in (("items", items, 2), ("units", units, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"inventory {option} must be an int >= {least}, got {value!r}")
        self.items, self.units = items, units
        self._restocked = 0  # units added by committed restocks, seen through ``observe``

    def describe(self) -> dict[str, Any]:
        return {"items": self.items, "units": self.units}

    def schema(self) -> Database:
        return Database((Table("stock"),))

    def build(self, seed: int) -> Database:
        del seed  # every shelf starts alike
        db = self.schema()
        db["stock"].rows.update({i: {"on_hand": self.units, "sold": 0} for i in range(self.items)})
        self._restocked = 0
        return db

    def registry(self) -> ProcedureRegistry:
        qty = {"qty": int}
        return ProcedureRegistry(
            [
                Procedure("sell", {"item": int, **qty}, self._plan(_sell)),
                Procedure("restock", {"item": int, **qty}, self._plan(_restock)),
                Procedure("move", {"src": int, "dst": int, **qty}, self._plan(_move)),
                Procedure("count", {"item": int}, self._plan(_count), lambda out: out["count"]),
            ]
        )

    def _plan(self, plan):
        """``plan`` after the checks every procedure shares: known items, a positive qty."""
        items = self.items

        def checked(params: Mapping[str, Any], view: ReadView) -> list[Piece]:
            del view  # no reconnaissance: every key is in the parameters
            for name in ("item", "src", "dst"):
                if name in params and not 0 <= params[name] < items:
                    raise BadParams(f"inventory: unknown {name} {brief(params[name])}")
            if params.get("qty", 1) <= 0:
                raise BadParams(f"inventory: qty must be positive, got {brief(params['qty'])}")
            if "src" in params and params["src"] == params["dst"]:
                raise BadParams(f"inventory: move from item {params['src']} to itself")
            return plan(params)

        return checked

    def requests(self, seed: int) -> Iterator[TxnRequest]:
        rng = random.Random(seed)
        names, weights = zip(*MIX, strict=True)
        while True:
            (name,) = rng.choices(names, weights)
            item, qty = rng.randrange(self.items), rng.randint(1, 5)
            if name == "restock":  # about as many units in as sales take out
                qty = rng.randint(5, 15)
            if name == "move":
                dst = rng.randrange(self.items - 1)
                yield TxnRequest(name, {"src": item, "dst": dst + (dst >= item), "qty": qty})
            elif name == "count":
                yield TxnRequest(name, {"item": item})
            else:
                yield TxnRequest(name, {"item": item, "qty": qty})

    def observe(self, batch: Sequence[object], outcomes: Sequence[Outcome]) -> None:
        for request, outcome in zip(batch, outcomes, strict=True):
            restock = isinstance(request, TxnRequest) and request.procedure == "restock"
            if restock and outcome.committed:
                self._restocked += request.params["qty"]

    def check(self, db: Database) -> list[str]:
        problems = self.check_state(db)
        total = sum(row["on_hand"] + row["sold"] for row in db["stock"].rows.values())
        expected = self.items * self.units + self._restocked
        if total != expected:
            problems.append(f"units not conserved: {total} on hand and sold != {expected}")
        return problems

    def check_state(self, db: Database) -> list[str]:
        stock, problems = db["stock"], []
        if len(stock) != self.items:
            problems.append(f"stock has {len(stock)} rows, expected {self.items}")
        negative = sorted(item for item, row in stock.rows.items() if row["on_hand"] < 0)
        if negative:
            problems.append(f"negative stock on items {negative[:10]}")
        return problems

    def partition_of(self, key: Hashable, partitions: int) -> int:
        """By item range: item ``i`` lives on partition ``i * partitions // items``."""
        if not isinstance(key, tuple) or len(key) != 2 or not isinstance(key[1], int):
            raise ConfigError(f"inventory: not an item conflict key: {key!r}")
        return key[1] * partitions // self.items

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable] | None:
        """The items a call names (one, or a move's two)."""
        return [_key(params[name]) for name in ("item", "src", "dst") if name in params]


# -- the procedures, as pieces ----------------------------------------------------------------


def _sell(params: Mapping[str, Any]) -> list[Piece]:
    item, qty = params["item"], params["qty"]

    def sell(ctx: PieceContext) -> int:
        row = ctx.get("stock", item)
        if row["on_hand"] < qty:
            ctx.abort("not enough on hand")  # one reason for all items: reports group by it
        ctx.update("stock", item, {"on_hand": row["on_hand"] - qty, "sold": row["sold"] + qty})
        return qty

    return [Piece("sell", sell, writes=(_key(item),), may_abort=True)]


def _restock(params: Mapping[str, Any]) -> list[Piece]:
    item, qty = params["item"], params["qty"]

    def restock(ctx: PieceContext) -> int:
        on_hand = ctx.get("stock", item)["on_hand"] + qty
        ctx.update("stock", item, {"on_hand": on_hand})
        return on_hand

    return [Piece("restock", restock, writes=(_key(item),))]


def _move(params: Mapping[str, Any]) -> list[Piece]:
    """A check that may abort, then the two writes: DGCC runs neither write until the check
    passed, whichever nodes the two items live on."""
    src, dst, qty = params["src"], params["dst"], params["qty"]

    def check(ctx: PieceContext) -> int:
        on_hand = ctx.get("stock", src)["on_hand"]
        if on_hand < qty:
            ctx.abort("not enough on hand to move")
        return on_hand

    def take(ctx: PieceContext) -> None:
        ctx.update("stock", src, {"on_hand": ctx.get("stock", src)["on_hand"] - qty})

    def put(ctx: PieceContext) -> None:
        ctx.update("stock", dst, {"on_hand": ctx.get("stock", dst)["on_hand"] + qty})

    return [
        Piece("check", check, reads=(_key(src),), may_abort=True),
        Piece("take", take, writes=(_key(src),)),
        Piece("put", put, writes=(_key(dst),)),
    ]


def _count(params: Mapping[str, Any]) -> list[Piece]:
    item = params["item"]

    def count(ctx: PieceContext) -> dict[str, int]:
        row = ctx.get("stock", item)
        return {"on_hand": row["on_hand"], "sold": row["sold"]}

    return [Piece("count", count, reads=(_key(item),))]
