"""dgcc vs PostgreSQL on the TPC-C mix at equal durability (fsync per commit / per epoch).

Usage: ``python dgcc/bench/postgres.py [--quick] [--warehouses 1 4] [--clients 2 4 8 16]``

In ONE run: starts a throwaway PostgreSQL server (apt-get installs it if absent), loads the
rows of dgcc's own TPC-C loader (same scale, same seed), defines the five transactions as
PL/pgSQL functions, and drives them with dgcc's request stream (same mix, same seed) from N
closed-loop client connections. Then it runs dgcc's single-process ``DurableEngine`` (DGCC with
dependency logging: one write + fsync per epoch before any acknowledgement) on the same data
and the same stream, closed-loop with the same N in flight and with ``--dgcc-inflight``, and
DistDGCC node processes (1 and 2 nodes splitting the W warehouses) with dependency logging on
every node.
Writes ``dgcc_postgres.{json,md,png}`` to ``docs/bench`` (a temp folder with ``--quick``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress
from rich.table import Table

from dgcc.bench import git_commit, host_facts, make_console
from dgcc.durable import DurableConfig, DurableEngine
from dgcc.net.loadgen import ClusterBenchConfig, run_bench
from dgcc.pg import PgServer, create_functions, load_database, run_closed_loop
from dgcc.pg.schema import check_consistency
from dgcc.stats import percentile
from dgcc.storage import Database
from dgcc.workloads.tpcc import TpccWorkload

REPO = Path(__file__).resolve().parents[2]
SPEC_SCALE = {"items": 100_000, "customers_per_district": 3000, "orders_per_district": 3000}
QUICK_SCALE = {"items": 2000, "customers_per_district": 300, "orders_per_district": 300}
CLUSTER_NODES = (1, 2)
# Tuning that a PostgreSQL user would apply on this machine and that leaves durability at its
# defaults (check_settings refuses any that weaken it): buffers that hold the whole data set,
# and WAL room so no checkpoint starts inside a measured window (the engine checkpoints only
# before its first window). max_connections is added per run (the largest --clients + 10).
PG_SETTINGS = {
    "shared_buffers": "2GB",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "1h",
}
EPOCHS_MAX = 10_000_000  # bound on one window's epoch loop
FSYNC_PROBES = 100


def _fdatasync_ms() -> float:
    """Median time of an 8 kB write + fdatasync in the temp folder (where both logs live)."""
    times_ms = []
    with tempfile.NamedTemporaryFile() as probe:
        for _ in range(FSYNC_PROBES):
            started_s = time.perf_counter()
            os.pwrite(probe.fileno(), b"x" * 8192, 0)
            os.fdatasync(probe.fileno())
            times_ms.append((time.perf_counter() - started_s) * 1e3)
    return statistics.median(times_ms)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    console = make_console()
    if args.rerender is not None:
        return _rerender(args.rerender, console)
    out_dir = args.out_dir or (
        Path(tempfile.gettempdir()) / "dgcc_postgres_quick" if args.quick else REPO / "docs/bench"
    )
    scale = QUICK_SCALE if args.quick else SPEC_SCALE
    results: list[dict[str, Any]] = []
    steps = sum(2 * len(args.clients) + 3 + len(_node_counts(w)) for w in args.warehouses)
    signal.signal(signal.SIGTERM, _terminated)  # a killed run still stops its server
    settings = {**PG_SETTINGS, "max_connections": str(max(args.clients) + 10)}
    with (
        PgServer(settings=settings) as server,
        Progress(console=console, transient=True) as progress,
    ):
        task = progress.add_task("starting", total=steps)

        def step(text: str, advance: int = 1) -> None:
            progress.update(task, description=text, advance=advance)

        for warehouses in args.warehouses:
            workload = TpccWorkload(warehouses=warehouses, **scale)
            results += _run_warehouses(server, workload, args, step)
            gc.collect()  # this W's data goes before the cluster nodes load theirs
            results += _run_cluster(workload, args, step)
        version = server.version
    document = _document(results, args, scale, version)
    document["postgres_settings"] = settings
    document["fdatasync_ms_p50"] = _fdatasync_ms()
    console.print(_table(results))
    for line in _summary_lines(document):
        print(line)
    _write(document, out_dir)
    console.print(f"wrote {out_dir}/dgcc_postgres.{{json,md,png}}")
    return 0


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"postgres.py: stopped by signal {signum}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, 1 warehouse, 2 s windows")
    parser.add_argument("--warehouses", type=int, nargs="+", default=None)
    parser.add_argument("--clients", type=int, nargs="+", default=None)
    parser.add_argument("--dgcc-inflight", type=int, default=1000, help="dgcc's own best load")
    parser.add_argument("--cluster-inflight", type=int, default=400, help="calls per node")
    parser.add_argument("--seconds", type=float, default=None, help="measured s per point")
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument(
        "--rerender",
        type=Path,
        default=None,
        metavar="JSON",
        help="redo the derived columns, ratios, table and plot of a recorded run (its "
        "dgcc_postgres.json, rewritten in place with its .md and .png) without measuring",
    )
    args = parser.parse_args(argv)
    args.warehouses = args.warehouses or ([1] if args.quick else [1, 4])
    args.clients = args.clients or ([2, 8] if args.quick else [2, 4, 8, 16, 32])
    args.seconds = args.seconds or (2.0 if args.quick else 10.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (0.5 if args.quick else 2.0)
    for name in ("warehouses", "clients"):
        bad = [value for value in getattr(args, name) if value < 1]
        if bad:
            parser.error(f"--{name} must be >= 1, got {bad}")
    if (
        args.cluster_inflight < 1
        or args.dgcc_inflight < 1
        or args.seconds <= 0
        or args.warmup_s < 0
    ):
        parser.error("--dgcc-inflight >= 1, --seconds > 0 and --warmup-s >= 0 are required")
    return args


def _run_warehouses(
    server: PgServer, workload: TpccWorkload, args: argparse.Namespace, step: Any
) -> list[dict[str, Any]]:
    """PostgreSQL and dgcc on W warehouses, alternating point by point (noise hits both)."""
    import psycopg

    warehouses = workload.config.warehouses
    step(f"W={warehouses}: generating data (dgcc loader, seed {args.seed})", 0)
    db = workload.build(args.seed)
    step(f"W={warehouses}: loading PostgreSQL")
    started_s = time.perf_counter()
    with psycopg.connect(server.conninfo, autocommit=True) as connection:
        load_database(connection, db)
        create_functions(connection)
        connection.execute("CHECKPOINT")  # the load's WAL is flushed before any window
    load_s = time.perf_counter() - started_s
    step(f"W={warehouses}: loaded in {load_s:.0f} s; dgcc initial checkpoint")
    # Millions of long-lived rows: keep the cyclic GC from rescanning them in every full
    # collection, which would stall whichever system allocates (as dgcc.bench.Runner does).
    gc.collect()
    gc.freeze()
    directory = Path(tempfile.mkdtemp(prefix="dgcc_pg_bench_"))
    try:
        config = DurableConfig(directory=directory, mode="dependency", protocol="dgcc")
        engine = DurableEngine(config, workload.registry(), workload.schema, lambda: db)
        # One request stream per system, continued across its points (as its data is).
        pg_stream, dgcc_stream = workload.requests(args.seed + 1), workload.requests(args.seed + 1)
        results = []
        for clients in args.clients:
            step(f"W={warehouses}: PostgreSQL, {clients} clients")
            metrics = run_closed_loop(
                server.conninfo,
                pg_stream,
                clients=clients,
                warmup_s=args.warmup_s,
                seconds=args.seconds,
                server_cpu_s=server.cpu_s,
            )
            results.append(_record("postgres", warehouses, clients, metrics, load_s=load_s))
            step(f"W={warehouses}: dgcc, {clients} in flight")
            results.append(_dgcc_point(engine, dgcc_stream, warehouses, clients, args))
        step(f"W={warehouses}: dgcc, {args.dgcc_inflight} in flight")
        results.append(_dgcc_point(engine, dgcc_stream, warehouses, args.dgcc_inflight, args))
        engine.close()
        _check(workload, engine.db, server)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        gc.unfreeze()
    return results


def _node_counts(warehouses: int) -> list[int]:
    """Cluster sizes that split ``warehouses`` evenly (the same data as the other systems)."""
    return [nodes for nodes in CLUSTER_NODES if warehouses % nodes == 0]


def _run_cluster(
    workload: TpccWorkload, args: argparse.Namespace, step: Any
) -> list[dict[str, Any]]:
    """DistDGCC node processes with dependency logging: 1 and 2 nodes holding the W warehouses."""
    warehouses, results = workload.config.warehouses, []
    options = workload.config.describe()
    scale = {
        key: options[key] for key in ("items", "customers_per_district", "orders_per_district")
    }
    for nodes in _node_counts(warehouses):
        step(f"W={warehouses}: DistDGCC, {nodes} node(s), durable")
        bench = ClusterBenchConfig(
            workload="tpcc",
            nodes=nodes,
            workload_options={**scale, "warehouses": warehouses // nodes},  # per node
            seconds=args.seconds,
            warmup_s=args.warmup_s,
            inflight=args.cluster_inflight,
            seed=args.seed,
            durable=True,
        )
        metrics = run_bench(bench)["metrics"]
        metrics["txn/retried"] = metrics.get("txn/retried", 0)
        _cluster_cpu(metrics, nodes)
        system = f"distdgcc-{nodes}n"
        results.append(_record(system, warehouses, nodes * args.cluster_inflight, metrics))
    return results


def _cluster_cpu(metrics: dict[str, Any], nodes: int) -> None:
    """The cluster's CPU in cores, and its commits per CPU second: the load generator reports
    node and client CPU per node (averages), so the totals are those times ``nodes``."""
    metrics["cpu/client_cores"] = metrics["client/cpu_s_per_s"] * nodes
    metrics["cpu/server_cores"] = metrics["node/cpu_s_per_s"] * nodes
    metrics["cpu/total_cores"] = metrics["cpu/client_cores"] + metrics["cpu/server_cores"]
    cores = max(metrics["cpu/total_cores"], 1e-9)
    metrics["txn/commits_per_cpu_s"] = metrics["txn/commits_per_s"] / cores


def _dgcc_point(
    engine: DurableEngine, stream: Any, warehouses: int, inflight: int, args: argparse.Namespace
) -> dict[str, Any]:
    _durable_window(engine, stream, inflight, args.warmup_s)
    metrics = _durable_window(engine, stream, inflight, args.seconds)
    return _record("dgcc", warehouses, inflight, metrics)


def _check(workload: TpccWorkload, db: Database, server: PgServer) -> None:
    """Both systems still satisfy TPC-C's consistency conditions after the run."""
    import psycopg

    violations = [f"dgcc: {v}" for v in workload.check(db)]
    with psycopg.connect(server.conninfo, autocommit=True) as connection:
        violations += [f"postgres: {v}" for v in check_consistency(connection)]
    if violations:
        raise AssertionError(f"TPC-C consistency broken: {violations[:3]}")


def _durable_window(
    engine: DurableEngine, stream: Any, inflight: int, seconds: float
) -> dict[str, float]:
    """Closed loop with ``inflight`` requests per epoch; each epoch is acked after its fsync."""
    committed, aborted, latencies_ms = 0, 0, []
    started_s, started_cpu_s = time.perf_counter(), time.process_time()
    for _ in range(EPOCHS_MAX):
        admitted_s = time.perf_counter()
        if admitted_s - started_s >= seconds:
            break
        batch = [next(stream) for _ in range(inflight)]
        outcomes = engine.run_epoch(batch)
        latency_ms = (time.perf_counter() - admitted_s) * 1e3
        latencies_ms += [latency_ms] * len(outcomes)
        done = sum(outcome.committed for outcome in outcomes)
        committed, aborted = committed + done, aborted + len(outcomes) - done
    elapsed_s = time.perf_counter() - started_s
    cpu_s = time.process_time() - started_cpu_s
    latencies_ms.sort()
    completed = max(committed + aborted, 1)
    return {
        "txn/commits_per_s": committed / elapsed_s,
        "txn/committed": committed,
        "txn/aborted": aborted,
        "txn/retried": 0,
        "txn/abort_rate": aborted / completed,
        "txn/latency_ms_p50": percentile(latencies_ms, 0.50),
        "txn/latency_ms_p99": percentile(latencies_ms, 0.99),
        "timing_s/window": elapsed_s,
        "cpu/client_cores": cpu_s / elapsed_s,  # driver and engine share one process here
        "cpu/server_cores": cpu_s / elapsed_s,
        "cpu/total_cores": cpu_s / elapsed_s,
        "txn/commits_per_cpu_s": committed / max(cpu_s, 1e-9),
    }


def _record(system: str, warehouses: int, clients: int, metrics: dict, **extra: Any) -> dict:
    return {
        "system": system,
        "warehouses": warehouses,
        "clients": clients,
        "metrics": metrics,
        **extra,
    }


def _best(results: list[dict[str, Any]], postgres: bool, warehouses: int) -> dict[str, Any]:
    """The fastest PostgreSQL point, or the fastest dgcc one (any engine, any load)."""
    rows = [
        r
        for r in results
        if (r["system"] == "postgres") == postgres and r["warehouses"] == warehouses
    ]
    return max(rows, key=lambda r: r["metrics"]["txn/commits_per_s"])


def _equal_load(results: list[dict[str, Any]], postgres: dict[str, Any]) -> float | None:
    """The single-process engine over PostgreSQL at PostgreSQL's best client count (the same
    number of calls in flight), or None when that point is missing (an old record)."""
    for row in results:
        if (
            row["system"] == "dgcc"
            and row["warehouses"] == postgres["warehouses"]
            and row["clients"] == postgres["clients"]
        ):
            return row["metrics"]["txn/commits_per_s"] / max(
                postgres["metrics"]["txn/commits_per_s"], 1e-9
            )
    return None


def _best_per_cpu(results: list[dict[str, Any]], postgres: bool, warehouses: int) -> float:
    return max(
        r["metrics"]["txn/commits_per_cpu_s"]
        for r in results
        if (r["system"] == "postgres") == postgres and r["warehouses"] == warehouses
    )


def _document(
    results: list[dict[str, Any]], args: argparse.Namespace, scale: dict, version: str
) -> dict[str, Any]:
    ratios = {}
    for warehouses in args.warehouses:
        dgcc, postgres = _best(results, False, warehouses), _best(results, True, warehouses)
        ratios[f"w{warehouses}"] = {
            "dgcc_best_commits_per_s": dgcc["metrics"]["txn/commits_per_s"],
            "dgcc_best_inflight": dgcc["clients"],
            "dgcc_best_system": dgcc["system"],
            "postgres_best_commits_per_s": postgres["metrics"]["txn/commits_per_s"],
            "postgres_best_clients": postgres["clients"],
            "ratio": dgcc["metrics"]["txn/commits_per_s"]
            / max(postgres["metrics"]["txn/commits_per_s"], 1e-9),
            "ratio_per_cpu": _best_per_cpu(results, False, warehouses)
            / max(_best_per_cpu(results, True, warehouses), 1e-9),
            "ratio_equal_load": _equal_load(results, postgres),
        }
    return {
        "benchmark": "dgcc_postgres",
        "quick": args.quick,
        "scale": scale,
        "warehouses": args.warehouses,
        "clients": args.clients,
        "dgcc_inflight": args.dgcc_inflight,
        "cluster_inflight": args.cluster_inflight,
        "seconds": args.seconds,
        "warmup_s": args.warmup_s,
        "seed": args.seed,
        "postgres_version": version,
        "dgcc_side": "DurableEngine (one process) and DistDGCC node processes, both DGCC with "
        "dependency logging (fsync per epoch before acknowledging)",
        "ratios": ratios,
        "results": results,
        "git_commit": git_commit(),
        "host": host_facts(),
    }


def _rerender(path: Path, console: Any) -> int:
    """``--rerender``: the recorded measurements, their derived columns computed again (the
    cluster's CPU was once taken per node, not in all: `_cluster_cpu`)."""
    try:
        document = json.loads(path.read_text())
        results = document["results"]
        for record in results:
            if record["system"].startswith("distdgcc-"):
                nodes = int(record["system"].removeprefix("distdgcc-").removesuffix("n"))
                _cluster_cpu(record["metrics"], nodes)
        args = argparse.Namespace(**{key: document[key] for key in _RECORDED_ARGS})
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"postgres.py: --rerender {path}: not a recorded run ({error})") from None
    redone = _document(results, args, document["scale"], document["postgres_version"])
    redone["git_commit"] = document["git_commit"]  # measured there; derived columns redone
    redone["host"] = document["host"]
    redone["fdatasync_ms_p50"] = document.get("fdatasync_ms_p50")
    if "postgres_settings" in document:
        redone["postgres_settings"] = document["postgres_settings"]
    redone["rerendered_at"] = git_commit()
    console.print(_table(results))
    for line in _summary_lines(redone):
        print(line)
    _write(redone, path.parent)
    console.print(f"rewrote {path.parent}/dgcc_postgres.{{json,md,png}}")
    return 0


_RECORDED_ARGS = ("quick", "warehouses", "clients", "dgcc_inflight", "cluster_inflight",
                  "seconds", "warmup_s", "seed")  # fmt: skip


def _settings_text(settings: dict[str, str] | None) -> str:
    if not settings:
        return "other settings at their defaults, "
    return "tuned with " + ", ".join(f"{k}={v}" for k, v in settings.items()) + ", "


def _table(results: list[dict[str, Any]]) -> Table:
    table = Table(title="dgcc vs PostgreSQL, TPC-C mix, durable commits")
    columns = ("W", "system", "in flight", "commits/s", "abort", "retries", "p50 ms", "p99 ms",
               "client CPU", "server CPU", "commits/CPU s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "system" else "right")
    for row in results:
        table.add_row(*_cells(row))
    return table


def _cells(row: dict[str, Any]) -> list[str]:
    metrics = row["metrics"]
    return [
        str(row["warehouses"]),
        row["system"],
        str(row["clients"]),
        f"{metrics['txn/commits_per_s']:,.0f}",
        f"{metrics['txn/abort_rate']:.1%}",
        f"{int(metrics['txn/retried'])}",
        f"{metrics['txn/latency_ms_p50']:.1f}",
        f"{metrics['txn/latency_ms_p99']:.1f}",
        f"{metrics['cpu/client_cores']:.2f}",
        f"{metrics['cpu/server_cores']:.2f}",
        f"{metrics['txn/commits_per_cpu_s']:,.0f}",
    ]


def _summary_lines(document: dict[str, Any]) -> list[str]:
    return [
        f"[summary] warehouses={key[1:]} dgcc_commits_per_s={ratio['dgcc_best_commits_per_s']:.1f}"
        f" postgres_commits_per_s={ratio['postgres_best_commits_per_s']:.1f}"
        f" dgcc_over_postgres={ratio['ratio']:.3f}"
        for key, ratio in document["ratios"].items()
    ]


def _write(document: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "dgcc_postgres.json").write_text(json.dumps(document, indent=2) + "\n")
    (out_dir / "dgcc_postgres.md").write_text(_markdown(document))
    _plot(document, out_dir / "dgcc_postgres.png")


def _markdown(document: dict[str, Any]) -> str:
    host = document["host"]
    lines = [
        "## dgcc vs PostgreSQL (TPC-C mix, durable commits)",
        "",
        "| W | system | clients in flight | commits/s | abort rate | retries | p50 ms | p99 ms "
        "| client CPU (cores) | server CPU (cores) | commits per CPU s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in document["results"]]
    lines.append("")
    lines += _ratio_lines(document["ratios"])
    lines += ["", _how_measured(document)]
    lines += [
        "",
        f"Machine: {host['platform']}, {host['machine']}, {host['cpus']} CPUs, "
        f"{host['implementation']} {host['python']}; commit {document['git_commit']}."
        + (
            f" The derived columns (the cluster rows' CPU, which was once taken per node "
            f"instead of in all, and commits per CPU second) were computed again from the "
            f"recorded measurements at commit {document['rerendered_at']} "
            "(`python dgcc/bench/postgres.py --rerender docs/bench/dgcc_postgres.json`)."
            if document.get("rerendered_at")
            else ""
        ),
        "",
        "![dgcc vs PostgreSQL](dgcc_postgres.png)",
        "",
    ]
    return "\n".join(lines)


def _ratio_lines(ratios: dict[str, Any]) -> list[str]:
    """Per warehouse count: the best dgcc over the best PostgreSQL, against the 3x target."""
    lines: list[str] = []
    for key, ratio in ratios.items():
        verdict = "meets" if ratio["ratio"] >= 3 else "misses"
        lines.append(
            f"- {key[1:]} warehouse(s): best dgcc {ratio['dgcc_best_commits_per_s']:,.0f} "
            f"commits/s ({ratio['dgcc_best_system']}, {ratio['dgcc_best_inflight']} in flight) "
            "vs best PostgreSQL "
            f"{ratio['postgres_best_commits_per_s']:,.0f} ({ratio['postgres_best_clients']} "
            f"clients): **{ratio['ratio']:.2f}x** ({verdict} the 3x target of issue 9); "
            f"best commits per CPU second: {ratio['ratio_per_cpu']:.2f}x"
            + (
                f"; at equal load ({ratio['postgres_best_clients']} in flight, the one-process "
                f"engine): {ratio['ratio_equal_load']:.2f}x."
                if ratio.get("ratio_equal_load") is not None
                else "."
            )
        )
    return lines


def _how_measured(document: dict[str, Any]) -> str:
    """The paragraph on how the section was measured."""
    scale = document["scale"]
    return (
        "How measured: `python dgcc/bench/postgres.py"
        + (" --quick" if document["quick"] else "")
        + f"` in one run (seed {document['seed']}; {document['warmup_s']:g} s warm-up and "
        f"{document['seconds']:g} s measured per point; scale {scale}). "
        f"{document['postgres_version']} in a fresh cluster on loopback, durability at its "
        "defaults (fsync on, synchronous_commit on, full_page_writes on, default wal_level), "
        + _settings_text(document.get("postgres_settings"))
        + "READ COMMITTED, the read-only functions STABLE (one snapshot per call), a "
        "CHECKPOINT after the load; the five "
        "transactions as PL/pgSQL functions with dgcc's semantics (checked equal to dgcc's "
        "serial executor by `dgcc/tests/test_postgres.py`), loaded with dgcc's own generated "
        "rows, driven by dgcc's request stream from N psycopg 3 connections on one asyncio loop, "
        "one call in flight each (client CPU: the driver process; server CPU: the postmaster "
        "and its backends). dgcc: the single-process `DurableEngine` running DGCC with "
        "dependency logging (one write + fsync per epoch, outcomes returned only after it), "
        "closed-loop with N requests per epoch, and with "
        f"{document['dgcc_inflight']} in flight (its natural operating point); its CPU is the "
        "one process that runs both driver and engine. PostgreSQL and dgcc alternate point by "
        "point (PostgreSQL at N, then dgcc at N), each on its own data and request stream "
        "carried over from its previous point; at the end both pass TPC-C's consistency "
        "conditions 1-4. distdgcc-1n/-2n: DistDGCC node processes on loopback with the W "
        "warehouses split evenly over the nodes, every node logging each epoch (dependency "
        "logging, fsync) and a call answered only once its epoch is durable on every node; one "
        f"closed-loop client process per node with {document['cluster_inflight']} calls "
        "outstanding, drawing from dgcc's TPC-C generator for the node's home warehouses (same "
        "data and mix, per-node streams; server CPU: the nodes, client CPU: the client "
        "processes); they run after the other two, on freshly loaded data. Commits per CPU "
        "second divide by all the CPU a system used (PostgreSQL: server and driver; dgcc: its "
        "one process; DistDGCC: nodes and clients), steadier than wall-clock rates on a shared "
        "machine. All logs "
        f"live in the same temp folder, where an 8 kB write + fdatasync took "
        f"{document['fdatasync_ms_p50']:.2f} ms (median of {FSYNC_PROBES}): a commit cannot be "
        "acknowledged faster than that, so durable throughput is set by how many commits share "
        "one sync (PostgreSQL's group commit; dgcc's epoch)."
    )


def _plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    warehouses = document["warehouses"]
    figure, axes = plt.subplots(1, len(warehouses), figsize=(5 * len(warehouses), 4), squeeze=False)
    for axis, count in zip(axes[0], warehouses):
        rows = [row for row in document["results"] if row["warehouses"] == count]
        for system, style in (("postgres", "o-"), ("dgcc", "s-")):
            points = [r for r in rows if r["system"] == system][: len(document["clients"])]
            axis.plot(
                [r["clients"] for r in points],
                [r["metrics"]["txn/commits_per_s"] for r in points],
                style,
                label=f"{system} (N in flight)",
            )
        best = document["ratios"][f"w{count}"]
        many = [r for r in rows if r["system"] == "dgcc"][-1]  # the --dgcc-inflight point
        axis.axhline(
            many["metrics"]["txn/commits_per_s"],
            linestyle="--",
            color="gray",
            label=f"dgcc, {many['clients']} in flight",
        )
        for row in rows:
            if row["system"].startswith("distdgcc"):
                axis.axhline(
                    row["metrics"]["txn/commits_per_s"],
                    linestyle=":" if row["system"].endswith("1n") else "-.",
                    color="green",
                    label=f"{row['system']}, {row['clients']} in flight",
                )
        axis.set_xscale("log", base=2)
        axis.set_xlabel("clients (requests in flight)")
        axis.set_ylabel("committed txn/s")
        axis.set_title(f"TPC-C, {count} warehouse(s): {best['ratio']:.2f}x")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
