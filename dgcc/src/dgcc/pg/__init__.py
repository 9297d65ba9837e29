"""PostgreSQL as a reference point: a throwaway server, the TPC-C schema and functions, a driver.

Used by ``dgcc/bench/postgres.py``. Needs the PostgreSQL binaries and psycopg 3 (the ``bench``
extra); nothing in the engine imports this package.
"""

from dgcc.pg.driver import CALLS, call, call_parameters, run_closed_loop
from dgcc.pg.functions import ROLLBACK_SQLSTATE, create_functions
from dgcc.pg.schema import COLUMNS, load_database
from dgcc.pg.server import PgServer, PgUnavailable, find_binaries

__all__ = [
    "CALLS",
    "COLUMNS",
    "ROLLBACK_SQLSTATE",
    "PgServer",
    "PgUnavailable",
    "call",
    "call_parameters",
    "create_functions",
    "find_binaries",
    "load_database",
    "run_closed_loop",
]
