"""The TPC-C schema in PostgreSQL, and a loader that COPYs dgcc's own generated rows into it.

The rows come from ``dgcc.workloads.tpcc.loader.load`` with the same config and seed as a
dgcc run, so both systems start from identical data. Column names and units are dgcc's (money
in integer cents, rates in 1/10000, dates in integer seconds). HISTORY has no primary key, as in
the spec. Indexes are built after the COPY, then the tables are analysed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from dgcc.storage import Database

__all__ = [
    "COLUMNS",
    "CONSISTENCY_SQL",
    "check_consistency",
    "column_names",
    "create_schema",
    "load_database",
]

logger = logging.getLogger(__name__)

_ADDRESS = (
    "street_1 varchar(20), street_2 varchar(20), city varchar(20), state char(2), zip char(9)"
)
_DISTS = ", ".join(f"s_dist_{d:02d} char(24)" for d in range(1, 11))


def _address(prefix: str) -> str:
    return ", ".join(f"{prefix}_{column.strip()}" for column in _ADDRESS.split(","))


# table -> SQL column definitions, in COPY order. The loader reads each column by name from
# dgcc's row dicts, so a missing or misspelt column fails the load loudly.
COLUMNS: dict[str, str] = {
    "warehouse": f"w_id int, w_name varchar(10), {_address('w')}, w_tax int, w_ytd bigint",
    "district": f"""d_id int, d_w_id int, d_name varchar(10), {_address("d")}, d_tax int,
        d_ytd bigint, d_next_o_id int""",
    "customer": f"""c_id int, c_d_id int, c_w_id int, c_first varchar(16), c_middle char(2),
        c_last varchar(16), {_address("c")}, c_phone char(16), c_since bigint, c_credit char(2),
        c_credit_lim bigint, c_discount int, c_balance bigint, c_ytd_payment bigint,
        c_payment_cnt int, c_delivery_cnt int, c_data varchar(500)""",
    "history": """h_c_id int, h_c_d_id int, h_c_w_id int, h_d_id int, h_w_id int,
        h_date bigint, h_amount bigint, h_data varchar(24)""",
    "orders": """o_id int, o_d_id int, o_w_id int, o_c_id int, o_entry_d bigint,
        o_carrier_id int, o_ol_cnt int, o_all_local int""",
    "new_order": "no_o_id int, no_d_id int, no_w_id int",
    "order_line": """ol_o_id int, ol_d_id int, ol_w_id int, ol_number int, ol_i_id int,
        ol_supply_w_id int, ol_delivery_d bigint, ol_quantity int, ol_amount bigint,
        ol_dist_info char(24)""",
    "item": "i_id int, i_im_id int, i_name varchar(24), i_price int, i_data varchar(50)",
    "stock": f"""s_i_id int, s_w_id int, s_quantity int, {_DISTS}, s_ytd bigint,
        s_order_cnt int, s_remote_cnt int, s_data varchar(50)""",
}


def column_names(table: str) -> list[str]:
    """The column names of ``table`` in COPY order."""
    return [column.split()[0] for column in COLUMNS[table].split(",")]


_KEYS = {
    "warehouse": "PRIMARY KEY (w_id)",
    "district": "PRIMARY KEY (d_w_id, d_id)",
    "customer": "PRIMARY KEY (c_w_id, c_d_id, c_id)",
    "orders": "PRIMARY KEY (o_w_id, o_d_id, o_id)",
    "new_order": "PRIMARY KEY (no_w_id, no_d_id, no_o_id)",
    "order_line": "PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)",
    "item": "PRIMARY KEY (i_id)",
    "stock": "PRIMARY KEY (s_w_id, s_i_id)",
}
_INDEXES = (
    "CREATE INDEX customer_by_last ON customer (c_w_id, c_d_id, c_last, c_first, c_id)",
    "CREATE INDEX orders_by_customer ON orders (o_w_id, o_d_id, o_c_id, o_id)",
)


def create_schema(connection: Any) -> None:
    """Drop and create the nine tables (no indexes yet: they are built after the load)."""
    with connection.cursor() as cursor:
        for table, columns in COLUMNS.items():
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
            cursor.execute(f"CREATE TABLE {table} ({columns})")


def _build_indexes(connection: Any) -> None:
    with connection.cursor() as cursor:
        for table, key in _KEYS.items():
            cursor.execute(f"ALTER TABLE {table} ADD {key}")
        for statement in _INDEXES:
            cursor.execute(statement)


def load_database(
    connection: Any, db: Database, progress: Callable[[str], None] | None = None
) -> dict[str, int]:
    """Create the schema and COPY every row of dgcc's ``db`` into it; rows per table.

    ``connection`` is a psycopg connection in autocommit mode. Raises ``KeyError`` when a dgcc
    row lacks a column of ``COLUMNS`` (the two schemas drifted apart).
    """
    started_s = time.perf_counter()
    create_schema(connection)
    counts = {}
    for table in COLUMNS:
        if progress is not None:
            progress(f"COPY {table}")
        names = column_names(table)
        counts[table] = 0
        statement = f"COPY {table} ({', '.join(names)}) FROM STDIN"
        with connection.cursor() as cursor, cursor.copy(statement) as copy:
            for _pk, row in db[table].items():
                copy.write_row([row[name] for name in names])
                counts[table] += 1
        assert counts[table] == len(db[table]), (table, counts[table], len(db[table]))
    if progress is not None:
        progress("indexes and ANALYZE")
    _build_indexes(connection)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    logger.info("loaded %s rows in %.1f s", counts, time.perf_counter() - started_s)
    return counts


# TPC-C consistency conditions 1-4 (clause 3.3.2), each as a query counting violating districts
# or warehouses; the same conditions dgcc's ``workloads.tpcc.checks`` tests.
CONSISTENCY_SQL = {
    "1: W_YTD = sum(D_YTD)": """SELECT count(*) FROM warehouse
        WHERE w_ytd <> (SELECT sum(d_ytd) FROM district WHERE d_w_id = w_id)""",
    "2: D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)": """SELECT count(*) FROM district
        WHERE d_next_o_id - 1 <> (SELECT max(o_id) FROM orders WHERE o_w_id = d_w_id
                                  AND o_d_id = d_id)
           OR d_next_o_id - 1 <> coalesce((SELECT max(no_o_id) FROM new_order
                                           WHERE no_w_id = d_w_id AND no_d_id = d_id),
                                          d_next_o_id - 1)""",
    "3: max(NO_O_ID) - min(NO_O_ID) + 1 = count(NEW_ORDER)": """SELECT count(*) FROM (
        SELECT max(no_o_id) - min(no_o_id) + 1 AS span, count(*) AS rows FROM new_order
        GROUP BY no_w_id, no_d_id) AS districts WHERE span <> rows""",
    "4: sum(O_OL_CNT) = count(ORDER_LINE)": """SELECT count(*) FROM district
        WHERE (SELECT sum(o_ol_cnt) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id)
           <> (SELECT count(*) FROM order_line WHERE ol_w_id = d_w_id AND ol_d_id = d_id)""",
}


def check_consistency(connection: Any) -> list[str]:
    """The TPC-C consistency conditions that fail, with the number of rows violating each."""
    violations = []
    for condition, query in CONSISTENCY_SQL.items():
        count = connection.execute(query).fetchone()[0]
        if count:
            violations.append(f"condition {condition} fails for {count} rows")
    return violations
