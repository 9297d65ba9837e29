"""Closed-loop TPC-C driver for PostgreSQL: N client connections, one call in flight each.

The clients share dgcc's own request stream (``dgcc.workloads.tpcc.generator``), so PostgreSQL
sees the same transactions in the same mix as dgcc. All clients run on one asyncio loop with
psycopg 3 (prepared statements, autocommit: one function call is one transaction). NewOrder's
invalid-item rollback is a logic abort (counted, not retried); deadlocks and serialization
failures are retried, at most ``RETRIES_MAX`` times, and counted. Metrics use the same slash keys
as ``dgcc.bench.Runner.metrics``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dgcc.api import Outcome, Status, TxnRequest
from dgcc.errors import ConfigError
from dgcc.pg.functions import ROLLBACK_SQLSTATE
from dgcc.stats import percentile

__all__ = ["CALLS", "call", "call_parameters", "run_closed_loop"]

RETRIES_MAX = 10
RETRY_SQLSTATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock detected
CLIENTS_MAX = 512

CALLS = {
    "new_order": "SELECT * FROM new_order(%s, %s, %s, %s::int[], %s::int[], %s::int[], %s)",
    "payment": "SELECT * FROM payment(%s, %s, %s, %s, %s, %s, %s, %s)",
    "order_status": "SELECT * FROM order_status(%s, %s, %s, %s)",
    "delivery": "SELECT * FROM delivery(%s, %s, %s)",
    "stock_level": "SELECT * FROM stock_level(%s, %s, %s)",
}


def call_parameters(request: TxnRequest) -> tuple[str, tuple[Any, ...]]:
    """The SQL call and its parameters for one dgcc TPC-C request.

    Raises:
        ConfigError: a procedure that is not one of the five TPC-C transactions.
    """
    params, name = request.params, request.procedure
    if name == "new_order":
        lines = params["lines"]
        items, supply, quantities = ([line[k] for line in lines] for k in range(3))
        values = (params["w_id"], params["d_id"], params["c_id"], items, supply, quantities)
        return CALLS[name], (*values, params["entry_d"])
    if name == "payment":
        keys = ("w_id", "d_id", "c_w_id", "c_d_id", "c_id", "c_last", "h_amount", "h_date")
    elif name == "order_status":
        keys = ("w_id", "d_id", "c_id", "c_last")
    elif name == "delivery":
        keys = ("w_id", "o_carrier_id", "ol_delivery_d")
    elif name == "stock_level":
        keys = ("w_id", "d_id", "threshold")
    else:
        raise ConfigError(f"no PostgreSQL function for procedure {name!r}; use {sorted(CALLS)}")
    return CALLS[name], tuple(params[key] for key in keys)


async def call(connection: Any, request: TxnRequest) -> Outcome:
    """Run one request as one transaction; ``Outcome`` with the function's result row.

    A rollback (SQLSTATE ``DG001``) is ABORTED with the reason dgcc gives (``invalid item id
    N``); a deadlock or
    serialization failure is ABORTED with a reason starting ``retry``. Other errors propagate.
    """
    import psycopg

    query, parameters = call_parameters(request)
    try:
        cursor = await connection.execute(query, parameters, prepare=True)
        row = await cursor.fetchone()
    except psycopg.Error as error:
        if error.sqlstate == ROLLBACK_SQLSTATE:
            return Outcome(Status.ABORTED, reason=error.diag.message_primary or "rollback")
        if error.sqlstate in RETRY_SQLSTATES:
            return Outcome(Status.ABORTED, reason=f"retry: {error.sqlstate}")
        raise
    return Outcome(Status.COMMITTED, result=row)


@dataclass
class _Window:
    """What the clients saw: counts and latencies of calls that completed in the window."""

    measuring: bool = False
    committed: int = 0
    aborted: Counter[str] = field(default_factory=Counter)  # logic aborts (rollbacks)
    retried: int = 0
    gave_up: int = 0  # still a deadlock or serialization failure after RETRIES_MAX retries
    latencies_ms: list[float] = field(default_factory=list)


async def _client(
    conninfo: str, stream: Iterator[TxnRequest], window: _Window, stop: asyncio.Event
) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as connection:
        while not stop.is_set():
            request = next(stream)
            started_s = time.perf_counter()
            for tries in range(RETRIES_MAX + 1):
                outcome = await call(connection, request)
                if not outcome.gave_up or tries == RETRIES_MAX:
                    break
                if window.measuring:
                    window.retried += 1
            if not window.measuring:
                continue
            window.latencies_ms.append((time.perf_counter() - started_s) * 1e3)
            if outcome.committed:
                window.committed += 1
            elif outcome.gave_up:  # apart from logic aborts, as the dgcc benches count them
                window.gave_up += 1
            else:
                window.aborted[outcome.reason.split(":")[0]] += 1


async def _run(
    conninfo: str,
    stream: Iterator[TxnRequest],
    clients: int,
    warmup_s: float,
    seconds: float,
    server_cpu_s: Callable[[], float],
) -> dict[str, float]:
    window, stop = _Window(), asyncio.Event()
    tasks = [asyncio.create_task(_client(conninfo, stream, window, stop)) for _ in range(clients)]
    try:
        # The clients run while this coroutine sleeps through the warm-up and the window.
        await asyncio.wait(tasks, timeout=warmup_s, return_when=asyncio.FIRST_EXCEPTION)
        _raise_failed(tasks)
        server_s = server_cpu_s()  # its /proc walk blocks this loop: done before the window
        window.measuring = True
        started_s, started_cpu_s = time.perf_counter(), time.process_time()
        await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
        window.measuring = False
        elapsed_s = time.perf_counter() - started_s
        client_cpu_s = time.process_time() - started_cpu_s
        server_s = server_cpu_s() - server_s
        _raise_failed(tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return _metrics(window, elapsed_s, client_cpu_s, server_s)


def _raise_failed(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _metrics(
    window: _Window, elapsed_s: float, client_cpu_s: float, server_cpu_s: float
) -> dict[str, float]:
    aborted = sum(window.aborted.values())
    completed = window.committed + aborted + window.gave_up
    latencies = sorted(window.latencies_ms)
    metrics = {
        "txn/commits_per_s": window.committed / elapsed_s,
        "txn/completed_per_s": completed / elapsed_s,
        "txn/committed": window.committed,
        "txn/aborted": aborted,
        "txn/retried": window.retried,
        "txn/abort_rate": aborted / completed if completed else 0.0,
        "txn/gave_up": window.gave_up,
        "txn/gave_up_rate": window.gave_up / completed if completed else 0.0,
        "txn/latency_ms_p50": percentile(latencies, 0.50),
        "txn/latency_ms_p99": percentile(latencies, 0.99),
        "timing_s/window": elapsed_s,
        "timing_s/client_cpu": client_cpu_s,
        "timing_s/server_cpu": server_cpu_s,
        "cpu/client_cores": client_cpu_s / elapsed_s,
        "cpu/server_cores": server_cpu_s / elapsed_s,
        "cpu/total_cores": (client_cpu_s + server_cpu_s) / elapsed_s,
        "txn/commits_per_cpu_s": window.committed / max(client_cpu_s + server_cpu_s, 1e-9),
    }
    for reason, count in sorted(window.aborted.items()):
        metrics[f"txn/aborts/{reason}"] = count
    return metrics


def run_closed_loop(
    conninfo: str,
    stream: Iterator[TxnRequest],
    *,
    clients: int,
    warmup_s: float,
    seconds: float,
    server_cpu_s: Callable[[], float] = lambda: 0.0,
) -> dict[str, float]:
    """Drive ``clients`` connections closed-loop for a warm-up, then measure ``seconds``.

    ``server_cpu_s()`` returns the server's CPU seconds so far (``PgServer.cpu_s``). Returns the
    window's metrics (commits/s, aborts, retries, p50/p99 latency, client and server CPU).

    Raises:
        ConfigError: clients outside 1..CLIENTS_MAX or a non-positive window.
    """
    if isinstance(clients, bool) or not isinstance(clients, int) or not 1 <= clients <= CLIENTS_MAX:
        raise ConfigError(f"clients={clients!r} must be an int in 1..{CLIENTS_MAX}")
    if not seconds > 0 or not warmup_s >= 0:
        raise ConfigError(f"need seconds > 0 and warmup_s >= 0, got {seconds!r}, {warmup_s!r}")
    return asyncio.run(_run(conninfo, stream, clients, warmup_s, seconds, server_cpu_s))
