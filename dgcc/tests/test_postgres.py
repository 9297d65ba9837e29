"""PostgreSQL anchor: the PL/pgSQL TPC-C functions match dgcc's procedures on the same input.

Method: start a throwaway PostgreSQL server, COPY in the rows of dgcc's TPC-C loader (2 small
warehouses, so remote payments and supply lines occur), and run one seeded request stream both
through the functions (one client, in order) and through dgcc's serial executor on its own copy
of the data. Every result must match (NewOrder's order id and total, Payment's customer and
balance, OrderStatus, Delivery's delivered orders, StockLevel's count, the 1% rollback), and
so must the aggregate state afterwards. Skipped only when no PostgreSQL binaries exist.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from dgcc.api import Outcome, Status, TxnRequest
from dgcc.pg.server import find_binaries

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries on this machine"),
]
psycopg = pytest.importorskip("psycopg", reason="psycopg 3 (the dgcc[bench] extra) is missing")

from dgcc.pg import PgServer, PgUnavailable, call, create_functions, load_database  # noqa: E402
from dgcc.pg.schema import check_consistency  # noqa: E402
from dgcc.protocols import get_protocol  # noqa: E402
from dgcc.workloads.tpcc import TpccWorkload  # noqa: E402

SCALE = {"warehouses": 2, "items": 200, "customers_per_district": 30, "orders_per_district": 30}
REQUESTS = 400
STATE_SQL = {
    "w_ytd": "SELECT sum(w_ytd) FROM warehouse",
    "d_ytd": "SELECT sum(d_ytd) FROM district",
    "d_next_o_id": "SELECT sum(d_next_o_id) FROM district",
    "c_balance": "SELECT sum(c_balance) FROM customer",
    "c_payment_cnt": "SELECT sum(c_payment_cnt) FROM customer",
    "c_delivery_cnt": "SELECT sum(c_delivery_cnt) FROM customer",
    "c_data_chars": "SELECT sum(length(c_data)) FROM customer",
    "s_quantity": "SELECT sum(s_quantity) FROM stock",
    "s_remote_cnt": "SELECT sum(s_remote_cnt) FROM stock",
    "orders": "SELECT count(*) FROM orders",
    "new_order": "SELECT count(*) FROM new_order",
    "order_line": "SELECT count(*) FROM order_line",
    "ol_amount": "SELECT sum(ol_amount) FROM order_line",
    "history": "SELECT count(*) FROM history",
}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[PgServer, TpccWorkload]]:
    workload = TpccWorkload(**SCALE, rollback_fraction=0.05)
    with PgServer(install=False) as running:
        with psycopg.connect(running.conninfo, autocommit=True) as connection:
            load_database(connection, workload.build(1))
            create_functions(connection)
        yield running, workload


def _comparable(request: TxnRequest, outcome: Outcome) -> tuple[Any, ...]:
    """dgcc's outcome in the shape of the PostgreSQL function's result row (its JSON arrays
    as lists): every field dgcc gives its client, so both systems do the same reads."""
    if outcome.status is not Status.COMMITTED:
        return (outcome.status.value, outcome.reason)
    result = outcome.result
    if request.procedure == "new_order":
        lines = [list(line) for line in result["lines"]]
        return (result["o_id"], result["total_cents"], result["c_last"], result["c_credit"], lines)
    if request.procedure == "payment":
        keys = ("c_first", "c_middle", "c_last", "c_since", "c_credit", "c_credit_lim",
                "c_discount", "c_data")  # fmt: skip
        return (result["c_id"], result["c_balance"], [result[k] for k in keys])
    if request.procedure == "order_status":
        keys = ("c_id", "c_first", "c_middle", "c_last", "c_balance", "o_id", "o_entry_d",
                "o_carrier_id")  # fmt: skip
        lines = [list(line) for line in result["lines"]]
        return (*(result.get(k) for k in keys), lines)
    if request.procedure == "delivery":
        delivered = dict(result["delivered"])
        return ([delivered.get(d, 0) for d in range(1, 11)],)
    return (result["low_stock"],)


def _pg_comparable(outcome: Outcome) -> tuple[Any, ...]:
    if outcome.status is not Status.COMMITTED:
        return (outcome.status.value, outcome.reason)
    return tuple(outcome.result)


def _dgcc_state(db: Any) -> dict[str, int]:
    rows = {name: list(row for _, row in db[name].items()) for name in db.tables}

    def total(table: str, column: str, measure=lambda value: value) -> int:
        return sum(measure(row[column]) for row in rows[table])

    return {
        "w_ytd": total("warehouse", "w_ytd"),
        "d_ytd": total("district", "d_ytd"),
        "d_next_o_id": total("district", "d_next_o_id"),
        "c_balance": total("customer", "c_balance"),
        "c_payment_cnt": total("customer", "c_payment_cnt"),
        "c_delivery_cnt": total("customer", "c_delivery_cnt"),
        "c_data_chars": total("customer", "c_data", len),
        "s_quantity": total("stock", "s_quantity"),
        "s_remote_cnt": total("stock", "s_remote_cnt"),
        "orders": len(rows["orders"]),
        "new_order": len(rows["new_order"]),
        "order_line": len(rows["order_line"]),
        "ol_amount": total("order_line", "ol_amount"),
        "history": len(rows["history"]),
    }


def test_functions_match_dgcc_serial_executor(server: tuple[PgServer, TpccWorkload]) -> None:
    running, workload = server
    requests = list(itertools.islice(workload.requests(2), REQUESTS))
    kinds = Counter(request.procedure for request in requests)
    assert set(kinds) == {"new_order", "payment", "order_status", "delivery", "stock_level"}

    async def run_on_postgres() -> list[Outcome]:
        connection = await psycopg.AsyncConnection.connect(running.conninfo, autocommit=True)
        async with connection:
            return [await call(connection, request) for request in requests]

    on_postgres = asyncio.run(run_on_postgres())
    db = workload.build(1)
    serial = get_protocol("serial")(db, workload.registry())
    on_dgcc = [serial.run_batch([request])[0] for request in requests]
    rollbacks = 0
    for number, (request, dgcc, pg) in enumerate(zip(requests, on_dgcc, on_postgres)):
        assert _pg_comparable(pg) == _comparable(request, dgcc), (number, request)
        rollbacks += dgcc.status is Status.ABORTED
    assert rollbacks > 0, "the stream held no NewOrder rollback; raise rollback_fraction"
    with psycopg.connect(running.conninfo, autocommit=True) as connection:
        state = {name: connection.execute(sql).fetchone()[0] for name, sql in STATE_SQL.items()}
        assert state == _dgcc_state(db)
        assert check_consistency(connection) == []
        connection.execute("UPDATE warehouse SET w_ytd = w_ytd + 1 WHERE w_id = 1")
        assert check_consistency(connection) == ["condition 1: W_YTD = sum(D_YTD) fails for 1 rows"]
        connection.execute("UPDATE warehouse SET w_ytd = w_ytd - 1 WHERE w_id = 1")
        # a NewOrder that lost its NEW_ORDER row: the newest one of district (1, 1) goes
        connection.execute(
            "DELETE FROM new_order WHERE no_w_id = 1 AND no_d_id = 1 AND no_o_id = "
            "(SELECT max(no_o_id) FROM new_order WHERE no_w_id = 1 AND no_d_id = 1)"
        )
        assert check_consistency(connection) == [
            "condition 2: D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID) fails for 1 rows"
        ]


def test_server_cpu_is_counted(server: tuple[PgServer, TpccWorkload]) -> None:
    running, _ = server
    assert running.cpu_s() > 0.0


def test_a_server_that_fails_to_start_is_removed() -> None:
    server = PgServer(install=False, settings={"max_connections": "-5"})
    with pytest.raises(PgUnavailable, match="postgres exited"):
        server.start()
    assert server.process is None
    assert server.directory is None


def test_newest_major_version_is_found_first() -> None:
    from dgcc.pg.server import _major_version

    found = [
        "/usr/lib/postgresql/9.6/bin",
        "/usr/lib/postgresql/16/bin",
        "/usr/lib/postgresql/15/bin",
    ]
    newest = sorted(found, key=_major_version, reverse=True)
    assert newest[0] == "/usr/lib/postgresql/16/bin" and newest[-1].endswith("9.6/bin")
