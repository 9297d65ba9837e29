"""TPC-C soak: run the standard mix for minutes and check the spec's consistency as it goes.

Usage: ``python -O dgcc/bench/tpcc_soak.py [--quick] [--minutes 3] [--protocol dgcc]
[--warehouses 1] [--check-every-s 30] [--shadow serial] [--report-dir docs/bench] [--canary]``
(``make bench`` and ``dgcc report`` run it with ``--shadow serial``)

Batches of ``--batch`` requests run back to back under one protocol (dgcc by default, serial if
dgcc is not registered); every ``--check-every-s`` seconds the consistency conditions run, and
with ``--shadow serial`` a second copy runs every batch under the serial executor and must give
the same outcomes (and the same state at each check). Exits 1 on any violation or mismatch;
``--canary`` plants one to prove it. Writes ``tpcc_soak.md`` and ``tpcc_soak.json`` to
``--report-dir`` unless it is empty. ``--quick``: 15 s on a small database, checking every 5 s,
writing no report (the scale and timing flags it sets override the ones given).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dgcc import PROTOCOLS, Protocol, get_protocol
from dgcc.bench import git_commit, host_facts, make_console
from dgcc.errors import ConfigError
from dgcc.workloads import get_workload
from dgcc.workloads.tpcc import TpccWorkload

logger = logging.getLogger("tpcc_soak")

REPO = Path(__file__).resolve().parents[2]
BATCHES_MAX = 10_000_000  # bound on the batch loop


@dataclass
class _Totals:
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)  # (procedure, status)
    batches: int = 0
    checks: int = 0
    check_s: float = 0.0
    run_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    console = make_console()
    protocol_name = args.protocol if args.protocol in PROTOCOLS else "serial"
    if protocol_name != args.protocol:
        console.print(f"protocol {args.protocol!r} is not registered; falling back to serial")
    try:
        workload = get_workload("tpcc", **_scale(args))
        assert isinstance(workload, TpccWorkload)
        protocol, shadow = _build(workload, protocol_name, args, console)
    except ConfigError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    try:
        totals = _soak(workload, protocol, shadow, args, console)
    finally:
        gc.unfreeze()  # matters only when main() runs inside a longer process (tests)
    _print_table(console, totals, protocol_name, args)
    record = _record(workload, totals, protocol_name, args)
    print("[summary] " + " ".join(f"{k}={v}" for k, v in record["summary"].items()))
    if args.report_dir:
        _write_report(Path(args.report_dir), record)
    return 1 if totals.problems else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15 s on a small database, no report")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--protocol", default="dgcc")
    parser.add_argument("--shadow", default="", help="a protocol to compare every batch with")
    parser.add_argument("--warehouses", type=int, default=1)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--customers", type=int, default=3000, help="per district")
    parser.add_argument("--orders", type=int, default=3000, help="initial orders per district")
    parser.add_argument("--batch", type=int, default=1000, help="requests per batch (epoch)")
    parser.add_argument("--check-every-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report-dir", default=str(REPO / "docs/bench"))
    parser.add_argument(
        "--canary", action="store_true", help="plant a D_YTD corruption: the run must fail"
    )
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    args.command = " ".join(["python -O dgcc/bench/tpcc_soak.py", *given])  # as the report says
    if args.quick:
        args.minutes, args.check_every_s, args.report_dir = 0.25, 5.0, ""
        args.items, args.customers, args.orders = 10_000, 300, 300
    if not 0 < args.minutes <= 24 * 60:
        parser.error(f"--minutes={args.minutes} must be in (0, 1440]")
    if not 1 <= args.batch <= 1_000_000:
        parser.error(f"--batch={args.batch} must be in 1..1000000")
    if args.check_every_s <= 0:
        parser.error(f"--check-every-s={args.check_every_s} must be > 0")
    from dgcc.protocols import PROTOCOLS

    for flag, name in (("--protocol", args.protocol), ("--shadow", args.shadow)):
        if name and name not in PROTOCOLS:
            parser.error(f"{flag} {name!r} is not a protocol; choose one of {sorted(PROTOCOLS)}")
    return args


def _scale(args: argparse.Namespace) -> dict[str, int]:
    return {
        "warehouses": args.warehouses,
        "items": args.items,
        "customers_per_district": args.customers,
        "orders_per_district": args.orders,
    }


def _build(
    workload: TpccWorkload, protocol_name: str, args: argparse.Namespace, console: Console
) -> tuple[Protocol, Protocol | None]:
    started_s = time.perf_counter()
    protocol = get_protocol(protocol_name)(workload.build(args.seed), workload.registry())
    console.print(
        f"loaded {args.warehouses} warehouse(s) in {time.perf_counter() - started_s:.1f} s"
    )
    shadow = None
    if args.shadow:
        shadow = get_protocol(args.shadow)(workload.build(args.seed), workload.registry())
    # The loaded tables are millions of long-lived objects; freezing them keeps the cyclic GC
    # from rescanning them on every collection (about 1.6x throughput at spec scale).
    gc.freeze()
    return protocol, shadow


def _soak(
    workload: TpccWorkload,
    protocol: Protocol,
    shadow: Protocol | None,
    args: argparse.Namespace,
    console: Console,
) -> _Totals:
    totals, stream = _Totals(), workload.requests(args.seed)
    duration_s = args.minutes * 60
    started_s = next_check_s = time.perf_counter()
    next_check_s += args.check_every_s
    columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
    with Progress(*columns, TextColumn("{task.fields[info]}"), console=console) as progress:
        task = progress.add_task("soak", total=duration_s, info="")
        for _ in range(BATCHES_MAX):
            now_s = time.perf_counter()
            if now_s - started_s >= duration_s:
                break
            _run_batch(list(itertools.islice(stream, args.batch)), protocol, shadow, totals)
            if args.canary and totals.batches == 1:
                ytd = protocol.db["district"].get((1, 1))["d_ytd"]
                protocol.db["district"].update((1, 1), {"d_ytd": ytd + 1})
            if time.perf_counter() >= next_check_s:
                _check(workload, protocol, shadow, totals)
                next_check_s = time.perf_counter() + args.check_every_s
            info = (
                f"{totals.requests / max(totals.run_s, 1e-9):,.0f} txn/s  "
                f"checks={totals.checks}  problems={len(totals.problems)}"
            )
            progress.update(task, completed=time.perf_counter() - started_s, info=info)
    _check(workload, protocol, shadow, totals)
    return totals


def _run_batch(batch: list, protocol: Protocol, shadow: Protocol | None, totals: _Totals) -> None:
    started_s = time.perf_counter()
    outcomes = protocol.run_batch(batch)
    totals.run_s += time.perf_counter() - started_s
    totals.batches += 1
    for request, outcome in zip(batch, outcomes):
        totals.statuses[request.procedure, outcome.status.value] += 1
    if shadow is not None and shadow.run_batch(batch) != outcomes:
        totals.problems.append(f"batch {totals.batches}: outcomes differ from {shadow.name}")


def _check(
    workload: TpccWorkload, protocol: Protocol, shadow: Protocol | None, totals: _Totals
) -> None:
    started_s = time.perf_counter()
    violations = workload.check(protocol.db)
    if shadow is not None and shadow.db.dump() != protocol.db.dump():
        violations.append(f"state differs from {shadow.name} after batch {totals.batches}")
    totals.checks += 1
    totals.check_s += time.perf_counter() - started_s
    for violation in violations:
        logger.error("check %d: %s", totals.checks, violation)
    totals.problems += violations


def _print_table(console: Console, totals: _Totals, protocol_name: str, args: Any) -> None:
    table = Table(title=f"TPC-C soak: {protocol_name}, {args.warehouses} warehouse(s)")
    for column in ("procedure", "committed", "aborted", "error", "share %"):
        table.add_column(column, justify="right")
    procedures = sorted({procedure for procedure, _ in totals.statuses})
    for procedure in procedures:
        counts = [totals.statuses[procedure, s] for s in ("committed", "aborted", "error")]
        share = 100 * sum(counts) / max(totals.requests, 1)
        table.add_row(procedure, *(f"{c:,}" for c in counts), f"{share:.1f}")
    console.print(table)
    verdict = "[red]FAILED[/red]" if totals.problems else "[green]consistent[/green]"
    console.print(
        f"{totals.requests:,} txns in {totals.batches:,} batches, "
        f"{totals.requests / max(totals.run_s, 1e-9):,.0f} txn/s (execution time only), "
        f"{totals.checks} checks ({totals.check_s:.1f} s): {verdict}"
    )
    for problem in totals.problems[:20]:
        console.print(f"  [red]{problem}[/red]")


def _record(workload: TpccWorkload, totals: _Totals, protocol_name: str, args: Any) -> dict:
    committed = sum(n for (_, s), n in totals.statuses.items() if s == "committed")
    summary = {
        "protocol": protocol_name,
        "shadow": args.shadow or "none",
        "minutes": args.minutes,
        "batch": args.batch,
        "txns": totals.requests,
        "committed": committed,
        "txn_per_s": round(totals.requests / max(totals.run_s, 1e-9), 1),
        "checks": totals.checks,
        "problems": len(totals.problems),
    }
    return {
        "summary": summary,
        "command": args.command,
        "workload": workload.describe(),
        "statuses": {f"{p}/{s}": n for (p, s), n in sorted(totals.statuses.items())},
        "problems": totals.problems[:100],
        "host": host_facts(),
        "git_commit": git_commit(),
        "seed": args.seed,
        "optimized": not __debug__,
    }


def _write_report(report_dir: Path, record: dict) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "tpcc_soak.json").write_text(json.dumps(record, indent=2) + "\n")
    summary = record["summary"]
    lines = [
        "## TPC-C consistency soak",
        "",
        f"`{record['command']}` "
        f"({record['workload']['warehouses']} warehouse(s), batches of {summary['batch']}, "
        f"protocol `{summary['protocol']}`, shadow `{summary['shadow']}`; "
        f"{record['host']['cpus']} CPUs, commit {record['git_commit']}).",
        "",
        "| txns | committed | txn/s | checks | problems |",
        "|---:|---:|---:|---:|---:|",
        f"| {summary['txns']:,} | {summary['committed']:,} | {summary['txn_per_s']:,.0f} "
        f"| {summary['checks']} | {summary['problems']} |",
        "",
        "Checks are the spec's consistency conditions 1-10 and 12 (clause 3.3.2) on the whole",
        "database; txn/s counts execution time only (not the checks).",
        "",
    ]
    (report_dir / "tpcc_soak.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
