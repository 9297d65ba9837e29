"""DGCC vs the serial executor on one core, and every protocol's throughput vs contention.

Usage: ``python dgcc/bench/engine.py [--quick] [--seconds S] [--no-sweep] [--out-dir DIR]``

Part 1: dgcc and serial on TPC-C (1 and 4 warehouses) and YCSB (theta 0-0.99) at full scale.
Part 2 (contention sweep): every registered protocol on TPC-C with 1-8 warehouses (fewer
warehouses = more contention) and YCSB with theta 0-0.99, at a reduced TPC-C scale.

Both protocols run the same seeded request stream on their own copy of the data, in ONE run:
after a warm-up each, they take turns on ``--rounds`` measured windows, so drift in machine
load hits both alike. Writes ``dgcc_engine.json`` (every record + ratios), ``dgcc_engine.md``
(a section for docs/benchmarks.md), ``dgcc_engine.png`` (bar plot) and
``dgcc_engine_contention.png`` (throughput and abort rate vs contention) to the output folder
(``docs/bench`` by default; a temp folder with ``--quick``, which also shrinks the data).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dgcc.bench import (
    BenchConfig,
    at_least,
    git_commit,
    host_facts,
    make_console,
    run_side_by_side,
)
from dgcc.errors import ConfigError
from dgcc.protocols import PROTOCOLS as REGISTRY
from dgcc.workloads import get_workload

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = ("dgcc", "serial")
FULL = {
    "tpcc-w1": ("tpcc", {"warehouses": 1}),
    "tpcc-w4": ("tpcc", {"warehouses": 4}),
    "ycsb-t0": ("ycsb", {"theta": 0.0}),
    "ycsb-t0.8": ("ycsb", {"theta": 0.8}),
    "ycsb-t0.99": ("ycsb", {"theta": 0.99}),
}
# The sweep: (knob, values) per workload; every protocol in the registry joins it.
SWEEP = {"tpcc": ("warehouses", (1, 2, 4, 8)), "ycsb": ("theta", (0.0, 0.5, 0.8, 0.9, 0.99))}
SWEEP_QUICK = {"tpcc": ("warehouses", (1, 4)), "ycsb": ("theta", (0.0, 0.99))}
SWEEP_SCALE = {
    "tpcc": {"items": 10_000, "customers_per_district": 300, "orders_per_district": 300},
    "ycsb": {},
}
QUICK_SCALE = {
    "tpcc": {"items": 10_000, "customers_per_district": 300, "orders_per_district": 300},
    "ycsb": {"records": 10_000},
}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    console = make_console()
    out_dir = args.out_dir or (
        Path(tempfile.mkdtemp(prefix="dgcc_engine_")) if args.quick else REPO / "docs/bench"
    )
    seconds = args.seconds or (1.0 if args.quick else 10.0)
    rounds = 1 if args.quick else args.rounds
    results = []
    for label, (workload, options) in FULL.items():
        if args.quick:
            options = {**options, **QUICK_SCALE[workload]}
        try:
            get_workload(workload, **options)
        except ConfigError as error:
            console.print(f"[yellow]skipping {label}: {error}[/]")
            continue
        results.append(_compare(label, workload, options, seconds, rounds, args, console))
    sweep = [] if args.no_sweep else _sweep(args, console)
    console.print(_table(results))
    if sweep:
        console.print(_sweep_table(sweep))
    for result in results:
        print(
            f"[summary] config={result['label']} dgcc_over_serial={result['ratio']:.3f} "
            f"dgcc_over_serial_cpu={result['ratio_cpu']:.3f}"
        )
    for point in sweep:
        print(_sweep_summary(point))
    _write(results, sweep, out_dir, seconds, rounds, args)
    console.print(f"wrote {out_dir}/dgcc_engine.{{json,md,png}} and dgcc_engine_contention.png")
    runs = results + sweep
    violations = [v for r in runs for record in r["records"] for v in record["violations"]]
    return 1 if violations else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, 1 s windows")
    parser.add_argument(
        "--seconds", type=at_least(float, 0, above=True), help="measured s per protocol"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating measured windows")
    parser.add_argument("--warmup-s", type=at_least(float, 0))
    parser.add_argument("--batch-size", type=at_least(int, 1), default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--no-sweep", action="store_true", help="skip the contention sweep")
    parser.add_argument("--sweep-seconds", type=float, default=None, help="per protocol, point")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.sweep_seconds is not None and args.sweep_seconds <= 0:
        parser.error(f"--sweep-seconds must be > 0, got {args.sweep_seconds}")
    return args


def _configs(
    workload: str,
    options: dict[str, Any],
    protocols: tuple[str, ...],
    seconds: float,
    warmup_s: float,
    args: argparse.Namespace,
) -> list[BenchConfig]:
    """One run configuration per protocol, identical but for the protocol."""
    return [
        BenchConfig(
            workload=workload,
            protocol=protocol,
            seconds=seconds,
            warmup_s=warmup_s,
            batch_size=args.batch_size,
            seed=args.seed,
            workload_options=options,
        )
        for protocol in protocols
    ]


def _compare(
    label: str,
    workload: str,
    options: dict[str, Any],
    seconds: float,
    rounds: int,
    args: argparse.Namespace,
    console: Console,
) -> dict[str, Any]:
    """Run dgcc and serial side by side on one configuration; their records and the ratio."""
    warmup_s = args.warmup_s if args.warmup_s is not None else (0.3 if args.quick else 2.0)
    configs = _configs(workload, options, PROTOCOLS, seconds, warmup_s, args)
    steps = len(PROTOCOLS) * (rounds + 1)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{label}: loading", total=steps)

        def report(step: str) -> None:
            progress.update(task, description=f"{label}: {step}", advance=1)

        records = run_side_by_side(configs, rounds=rounds, progress=report)
    dgcc, serial = (record["metrics"] for record in records)
    return {
        "label": label,
        "workload": workload,
        "options": options,
        "records": records,
        "ratio": _ratio(dgcc, serial, "txn/commits_per_s"),
        "ratio_cpu": _ratio(dgcc, serial, "txn/commits_per_cpu_s"),
    }


def _ratio(dgcc: dict[str, float], serial: dict[str, float], key: str) -> float:
    return dgcc[key] / serial[key] if serial[key] else float("nan")


def _table(results: list[dict[str, Any]]) -> Table:
    table = Table(title="DGCC vs serial, one core (commits/s)")
    columns = ("config", "dgcc", "serial", "ratio", "cpu ratio", "graph s", "exec s", "abort")
    for column in columns:
        table.add_column(column, justify="left" if column == "config" else "right")
    for result in results:
        dgcc, serial = (record["metrics"] for record in result["records"])
        table.add_row(
            result["label"],
            f"{dgcc['txn/commits_per_s']:,.0f}",
            f"{serial['txn/commits_per_s']:,.0f}",
            f"{result['ratio']:.2f}x",
            f"{result['ratio_cpu']:.2f}x",
            f"{dgcc['timing_s/build_graph']:.2f}",
            f"{dgcc['timing_s/execute']:.2f}",
            f"{dgcc['txn/abort_rate']:.1%}",
        )
    return table


def _sweep(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    """Every protocol side by side at each contention point; one entry per point."""
    grid = SWEEP_QUICK if args.quick else SWEEP
    seconds = args.sweep_seconds or (0.3 if args.quick else 3.0)
    rounds = 1 if args.quick else args.rounds
    warmup_s = 0.1 if args.quick else 1.0
    points = [
        (workload, knob, value) for workload, (knob, values) in grid.items() for value in values
    ]
    protocols = tuple(REGISTRY)
    sweep = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(
            "contention sweep", total=len(points) * len(protocols) * (rounds + 1)
        )
        for workload, knob, value in points:
            scale = QUICK_SCALE[workload] if args.quick else SWEEP_SCALE[workload]
            options = {**scale, knob: value}
            configs = _configs(workload, options, protocols, seconds, warmup_s, args)

            def report(step: str, label=f"{workload} {knob}={value}") -> None:
                progress.update(task, description=f"sweep {label}: {step}", advance=1)

            records = run_side_by_side(configs, rounds=rounds, progress=report)
            sweep.append(
                {
                    "workload": workload,
                    "knob": knob,
                    "value": value,
                    "options": options,
                    "seconds_per_protocol": seconds,
                    "records": records,
                }
            )
    return sweep


def _restarts_per_commit(record: dict[str, Any]) -> float:
    """Concurrency-control restarts (inside the protocol and by the driver) per commit."""
    metrics, protocol = record["metrics"], record["config"]["protocol"]
    restarts = metrics.get(f"{protocol}/retries", 0) + metrics["txn/retried"]
    return restarts / max(metrics["txn/committed"], 1)


def _sweep_summary(point: dict[str, Any]) -> str:
    """A ``[summary]`` line: dgcc over the best baseline (serial is no baseline) at a point."""
    rates = {r["config"]["protocol"]: r["metrics"]["txn/commits_per_s"] for r in point["records"]}
    baselines = {name: rate for name, rate in rates.items() if name not in ("dgcc", "serial")}
    best = max(baselines, key=baselines.__getitem__)
    return (
        f"[summary] sweep={point['workload']}-{point['knob']}={point['value']} "
        f"dgcc_commits_per_s={rates['dgcc']:.1f} best_baseline={best} "
        f"dgcc_over_best_baseline={rates['dgcc'] / max(baselines[best], 1e-9):.3f}"
    )


def _sweep_table(sweep: list[dict[str, Any]]) -> Table:
    protocols = [record["config"]["protocol"] for record in sweep[0]["records"]]
    table = Table(title="throughput vs contention, one core (commits/s; CC restarts per commit)")
    table.add_column("point")
    for protocol in protocols:
        table.add_column(protocol, justify="right")
    for point in sweep:
        cells = [
            f"{r['metrics']['txn/commits_per_s']:,.0f} ({_restarts_per_commit(r):.2f})"
            for r in point["records"]
        ]
        table.add_row(f"{point['workload']} {point['knob']}={point['value']}", *cells)
    return table


def _sweep_markdown(sweep: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    protocols = [record["config"]["protocol"] for record in sweep[0]["records"]]
    lines = [
        "### Throughput vs contention, every protocol (one core)",
        "",
        "| point | " + " | ".join(protocols) + " |",
        "|---|" + "---:|" * len(protocols),
    ]
    for point in sweep:
        cells = [
            f"{r['metrics']['txn/commits_per_s']:,.0f} ({r['metrics']['txn/abort_rate']:.1%}; "
            f"{_restarts_per_commit(r):.2f})"
            for r in point["records"]
        ]
        lines.append(
            f"| {point['workload']} {point['knob']}={point['value']} | " + " | ".join(cells) + " |"
        )
    first = sweep[0]
    lines += [
        "",
        "Cells: committed transactions per wall-clock second (abort rate, i.e. TPC-C's 1% "
        "logic rollbacks plus any transaction that ran out of retries; concurrency-control "
        "restarts per commit, inside the protocol and by the driver). Every registered "
        "protocol runs the same seeded stream on its own copy of the "
        f"data, {first['seconds_per_protocol']:g} s each per point in alternating windows, "
        f"{args.batch_size} requests in flight, default protocol options (the interleaving "
        "baselines simulate concurrency on one thread; see `dgcc/src/dgcc/protocols/_locking.py`). "
        f"TPC-C at {SWEEP_SCALE['tpcc']} per warehouse (fewer warehouses = more contention); "
        "YCSB at its default 100k records, theta = zipfian skew. One Python process on one core: "
        "this is contention's effect on each protocol's work, not parallel speedup.",
        "",
        "![throughput vs contention](dgcc_engine_contention.png)",
        "",
    ]
    return lines


def _plot_sweep(sweep: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(point["workload"] for point in sweep))
    figure, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 7), squeeze=False)
    for column, workload in enumerate(workloads):
        points = [point for point in sweep if point["workload"] == workload]
        values = [point["value"] for point in points]
        for index, record in enumerate(points[0]["records"]):
            protocol = record["config"]["protocol"]
            metrics = [point["records"][index]["metrics"] for point in points]
            axes[0][column].plot(
                values, [m["txn/commits_per_s"] for m in metrics], "o-", label=protocol
            )
            restarts = [_restarts_per_commit(point["records"][index]) for point in points]
            axes[1][column].plot(values, restarts, "o-", label=protocol)
        knob = points[0]["knob"]
        axes[0][column].set_title(f"{workload}: throughput vs {knob}")
        axes[0][column].set_ylabel("committed txn/s (one core)")
        axes[1][column].set_ylabel("CC restarts per commit")
        axes[1][column].set_xlabel(
            knob + (" (fewer = more contention)" if knob == "warehouses" else "")
        )
        axes[0][column].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _write(
    results: list[dict[str, Any]],
    sweep: list[dict[str, Any]],
    out_dir: Path,
    seconds: float,
    rounds: int,
    args: argparse.Namespace,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "dgcc_engine",
        "quick": args.quick,
        "seconds_per_protocol": seconds,
        "rounds": rounds,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "git_commit": git_commit(),
        "host": host_facts(),
        "ratios": {result["label"]: result["ratio"] for result in results},
        "ratios_cpu": {result["label"]: result["ratio_cpu"] for result in results},
        "results": results,
        "contention": sweep,
    }
    (out_dir / "dgcc_engine.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    markdown = _markdown(document)
    if sweep:
        markdown += "\n".join(_sweep_markdown(sweep, args))
        _plot_sweep(sweep, out_dir / "dgcc_engine_contention.png")
    (out_dir / "dgcc_engine.md").write_text(markdown)
    _plot(results, out_dir / "dgcc_engine.png")


def _markdown(document: dict[str, Any]) -> str:
    host = document["host"]
    lines = [
        "## DGCC engine vs the serial executor (one core)",
        "",
        "| config | dgcc commits/s | serial commits/s | dgcc/serial | dgcc/serial (CPU time) "
        "| dgcc build_graph s | dgcc execute s | abort rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in document["results"]:
        dgcc, serial = (record["metrics"] for record in result["records"])
        lines.append(
            f"| {result['label']} | {dgcc['txn/commits_per_s']:,.0f} "
            f"| {serial['txn/commits_per_s']:,.0f} | {result['ratio']:.2f}x "
            f"| {result['ratio_cpu']:.2f}x "
            f"| {dgcc['timing_s/build_graph']:.2f} | {dgcc['timing_s/execute']:.2f} "
            f"| {dgcc['txn/abort_rate']:.1%} |"
        )
    ratios = list(document["ratios"].values())
    ratios_cpu = list(document["ratios_cpu"].values())
    lines += [
        "",
        (
            f"Median dgcc/serial ratio: {statistics.median(ratios):.2f}x wall-clock, "
            f"{statistics.median(ratios_cpu):.2f}x per CPU second."
        )
        if ratios
        else "",
        "",
        "How measured: `python dgcc/bench/engine.py"
        + (" --quick" if document["quick"] else "")
        + f"` (seed {document['seed']}, batch size {document['batch_size']} in flight, "
        f"{document['seconds_per_protocol']:g} s measured per protocol in "
        f"{document['rounds']} alternating windows after a warm-up). Both protocols run the "
        "same seeded request stream on their own copy of the data, in one Python process on "
        "one core, with invariant checks off and the loaded data frozen out of the cyclic "
        "GC; throughput counts committed transactions per wall-clock second, and the CPU "
        "ratio divides by the driver thread's CPU time instead (steadier on a shared "
        "machine). "
        "Python executes DGCC's logical executors on one thread, so this measures DGCC's "
        "overhead (planning is shared; graph building and in-degree scheduling are extra), "
        "not its parallel speedup. YCSB: 100k records, 10 ops per transaction, 50% "
        "read-modify-write. TPC-C: the standard mix.",
        "",
        f"Machine: {host['platform']}, {host['machine']}, {host['cpus']} CPUs, "
        f"{host['implementation']} {host['python']}; commit {document['git_commit']}.",
        "",
        "![dgcc vs serial](dgcc_engine.png)",
        "",
    ]
    return "\n".join(lines)


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [result["label"] for result in results]
    values = {
        protocol: [result["records"][i]["metrics"]["txn/commits_per_s"] for result in results]
        for i, protocol in enumerate(PROTOCOLS)
    }
    figure, axes = plt.subplots(figsize=(8, 4))
    width = 0.38
    positions = range(len(labels))
    for offset, protocol in zip((-width / 2, width / 2), PROTOCOLS):
        axes.bar([p + offset for p in positions], values[protocol], width, label=protocol)
    for position, result in zip(positions, results):
        top = max(values[protocol][position] for protocol in PROTOCOLS)
        axes.annotate(f"{result['ratio']:.2f}x", (position, top), ha="center", va="bottom")
    axes.set_ylim(top=1.12 * max(max(series) for series in values.values()))
    axes.set_xticks(list(positions), labels)
    axes.set_ylabel("committed txn/s (one core)")
    axes.set_title("DGCC vs serial executor")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
