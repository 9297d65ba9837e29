"""DistDGCC on a local cluster: 1, 2 and 4 node processes, distributed fractions 0-100%.

Usage: ``python dgcc/bench/cluster.py [--quick] [--seconds S] [--out-dir DIR]``

Every run starts real node processes on loopback plus one closed-loop client process per node
(``--inflight`` calls outstanding each), warms up, then measures a window; clients and nodes
share this host's cores. TPC-C runs with the standard remote fractions (1% remote supply per
order line, 15% remote paying customer; warehouses per node fixed: weak scaling) and with a
forced distributed fraction; YCSB sweeps the distributed fraction. Writes
``dgcc_cluster.json`` (every record), ``dgcc_cluster.md`` (a section for docs/benchmarks.md)
and ``dgcc_cluster.png`` to ``docs/bench`` (a temp folder with ``--quick``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.progress import Progress

from dgcc.bench import at_least, git_commit, host_facts, make_console
from dgcc.cli_cluster import results_table
from dgcc.net.loadgen import ClusterBenchConfig, run_bench, summary_line

REPO = Path(__file__).resolve().parents[2]
TPCC = {"warehouses": 2, "items": 10_000, "customers_per_district": 300, "orders_per_district": 300}
YCSB = {"records": 100_000, "ops_per_txn": 10, "theta": 0.6}
FRACTIONS = (0.0, 0.1, 0.5, 1.0)
NODES = (1, 2, 4)
TARGET_SPEEDUP = 1.5


def grid(quick: bool, rounds: int) -> list[dict[str, Any]]:
    """The runs: first the TPC-C scaling rounds (1 and 2 nodes taking turns, the first of each
    round alternating, so drift in the host's load hits both alike), then one run per grid
    point."""
    tpcc = (
        dict(TPCC, items=2000, customers_per_district=60, orders_per_district=60) if quick else TPCC
    )
    ycsb = dict(YCSB, records=10_000) if quick else YCSB
    nodes = (1, 2) if quick else NODES
    fractions = (0.0, 0.5) if quick else FRACTIONS
    runs = [
        {"workload": "tpcc", "nodes": n, "fraction": None, "options": tpcc, "phase": f"round{r}"}
        for r in range(rounds)
        for n in ((1, 2) if r % 2 == 0 else (2, 1))
    ]
    points = [("tpcc", n, None, tpcc) for n in nodes if n > 2]
    for name, options in (("tpcc", tpcc), ("ycsb", ycsb)):
        points += [(name, 1, 0.0, options)]
        points += [(name, n, f, options) for n in nodes if n > 1 for f in fractions]
    runs += [
        {"workload": w, "nodes": n, "fraction": f, "options": o, "phase": "grid"}
        for w, n, f, o in points
    ]
    return runs


def host() -> dict[str, Any]:
    """What every cluster bench records: the machine, its load at the start, the event loop and
    the commit measured."""
    return host_facts() | {
        "load_average_1m_at_start": os.getloadavg()[0],
        "uvloop": importlib.util.find_spec("uvloop") is not None,
        "git_commit": git_commit(),
    }


def load_note(facts: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """How busy the host was: its 1-minute load average at the start and, where the runs
    counted it, the range of the share of their windows' CPU time the hypervisor took."""
    note = f"1-minute load average {facts['load_average_1m_at_start']:.1f} at the start"
    stolen = [r["metrics"].get("host/cpu_stolen", math.nan) for r in records]
    stolen = [share for share in stolen if not math.isnan(share)]
    if stolen:
        low, high = f"{min(stolen):.0%}", f"{max(stolen):.0%}"
        took = low if low == high else f"{low} to {high}"
        note += f"; the hypervisor took {took} of the CPU time of the measured windows"
    return note


def _paired(records: list[dict[str, Any]], metric: str) -> list[float]:
    """Per scaling round: 2-node over 1-node ``metric``."""
    ratios = []
    for phase in sorted({r["phase"] for r in records if r["phase"].startswith("round")}):
        by_nodes = {
            r["config"]["nodes"]: r["metrics"][metric] for r in records if r["phase"] == phase
        }
        if by_nodes.get(1) and 2 in by_nodes:
            ratios.append(by_nodes[2] / by_nodes[1])
    return ratios


def speedup(records: list[dict[str, Any]]) -> float | None:
    """TPC-C standard mix: median over rounds of 2-node over 1-node throughput."""
    ratios = _paired(records, "txn/commits_per_s")
    return statistics.median(ratios) if ratios else None


def efficiency(records: list[dict[str, Any]]) -> float | None:
    """TPC-C standard mix: median over rounds of the commits-per-node-CPU-second ratio."""
    ratios = _paired(records, "txn/commits_per_node_cpu_s")
    return statistics.median(ratios) if ratios else None


def markdown(records: list[dict[str, Any]], facts: dict[str, Any], args) -> str:
    ratio = speedup(records)
    lines = [
        "## DistDGCC cluster (`dgcc/bench/cluster.py`)",
        "",
        f"Real node processes on loopback, one closed-loop client process per node with "
        f"{args.inflight} calls in flight, {args.warmup_s:g} s warm-up then a {args.seconds:g} s "
        f"window; {facts['cpus']} CPUs shared by nodes and clients "
        f"({load_note(facts, records)}), event loop "
        f"{'uvloop' if facts.get('uvloop') else 'asyncio'}; commit {facts['git_commit']}, "
        "`python -O dgcc/bench/cluster.py`. "
        "`std` = the workload's own mix (TPC-C: 1% remote supply per line, 15% remote paying "
        "customer, 2 warehouses per node); a percentage forces that fraction of transactions "
        "to span two nodes. `multi-node` is what the nodes measured. `node cpu` is the CPU "
        "share each node process got (1.0 = a whole core), `client cpu` the same for each "
        "client process; `commits/node-cpu-s` divides "
        "throughput by the node processes' CPU time, which is less sensitive to a busy host.",
        "",
        "| run | workload | nodes | distributed | multi-node | commits/s | p50 ms | p99 ms "
        "| msgs/commit | bytes/commit | node cpu | client cpu | commits/node-cpu-s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        c, m = r["config"], r["metrics"]
        asked = "std" if c["distributed_fraction"] is None else f"{c['distributed_fraction']:.0%}"
        lines.append(
            f"| {r['phase']} | {c['workload']} | {c['nodes']} | {asked} "
            f"| {m['txn/multi_node_fraction']:.1%} "
            f"| {m['txn/commits_per_s']:,.0f} | {m['txn/latency_ms_p50']:.1f} "
            f"| {m['txn/latency_ms_p99']:.1f} | {m['net/messages_per_commit']:.3f} "
            f"| {m['net/bytes_per_commit']:,.0f} | {m['node/cpu_s_per_s']:.2f} "
            f"| {m['client/cpu_s_per_s']:.3f} | {m['txn/commits_per_node_cpu_s']:,.0f} |"
        )
    lines.append("")
    if ratio is not None:
        verdict = "meets" if ratio >= TARGET_SPEEDUP else "misses"
        rounds = ", ".join(f"{x:.2f}" for x in _paired(records, "txn/commits_per_s"))
        lines.append(
            f"TPC-C (standard remote fractions), 2 nodes / 1 node throughput, median of the "
            f"paired rounds ({rounds}): **{ratio:.2f}x** ({verdict} the {TARGET_SPEEDUP}x "
            "target on this host, clients included)."
        )
        lines.append("")
    kept = efficiency(records)
    if kept is not None:
        lines.append(
            f"Per node-CPU-second, 2 TPC-C nodes keep {kept:.0%} of one node's commits (median "
            "of the rounds; the "
            "rest is the cost of distribution: exchanging inputs, routing every call, value "
            "messages, waiting for the slower node). When the host is busy, the throughput "
            "ratio above mostly shows how much CPU the node processes got."
        )
        lines.append("")
    lines.append("![DistDGCC cluster](dgcc_cluster.png)")
    lines.append("")
    return "\n".join(lines)


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    std: dict[int, list[float]] = {}
    for r in records:
        if r["config"]["workload"] == "tpcc" and r["config"]["distributed_fraction"] is None:
            std.setdefault(r["config"]["nodes"], []).append(r["metrics"]["txn/commits_per_s"])
    nodes_sorted = sorted(std)
    axes[0].bar(
        [str(n) for n in nodes_sorted],
        [statistics.median(std[n]) for n in nodes_sorted],
        color="tab:blue",
    )
    axes[0].set(
        title="TPC-C, standard remote fractions (median)", xlabel="nodes", ylabel="commits/s"
    )
    for workload, marker in (("tpcc", "o"), ("ycsb", "s")):
        for nodes in sorted({r["config"]["nodes"] for r in records}):
            points = sorted(
                (
                    (r["config"]["distributed_fraction"], r["metrics"])
                    for r in records
                    if r["config"]["workload"] == workload
                    and r["config"]["nodes"] == nodes
                    and r["config"]["distributed_fraction"] is not None
                ),
                key=lambda point: point[0],
            )
            if not points or nodes == 1:
                continue
            xs = [f * 100 for f, _ in points]
            label = f"{workload} {nodes} nodes"
            axes[1].plot(
                xs, [m["txn/commits_per_s"] for _, m in points], marker=marker, label=label
            )
            axes[2].plot(
                xs, [m["net/bytes_per_commit"] for _, m in points], marker=marker, label=label
            )
    axes[1].set(
        title="throughput vs distributed fraction", xlabel="distributed %", ylabel="commits/s"
    )
    axes[2].set(title="network per commit", xlabel="distributed %", ylabel="bytes/commit")
    for axis in axes[1:]:
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, fewer runs, temp output")
    parser.add_argument(
        "--seconds", type=at_least(float, 0, above=True), help="measured window per run"
    )
    parser.add_argument("--warmup-s", type=at_least(float, 0), default=1.0)
    parser.add_argument("--inflight", type=at_least(int, 1), default=400)
    parser.add_argument(
        "--rounds", type=at_least(int, 1), default=3, help="paired 1-/2-node TPC-C rounds"
    )
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (2.0 if args.quick else 5.0)
    out_dir = args.out_dir or (Path(tempfile.mkdtemp()) if args.quick else REPO / "docs" / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    console = make_console()  # 160 columns off a terminal (logs)
    facts = host()
    runs = grid(args.quick, args.rounds)
    records = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("cluster runs", total=len(runs))
        for run in runs:
            label = f"{run['phase']}: {run['workload']} nodes={run['nodes']} dist={run['fraction']}"
            progress.update(task, description=label)
            bench = ClusterBenchConfig(
                run["workload"],
                run["nodes"],
                run["fraction"],
                dict(run["options"]),
                seconds=args.seconds,
                warmup_s=args.warmup_s,
                inflight=args.inflight,
            )
            record = run_bench(bench) | {"phase": run["phase"]}
            records.append(record)
            print(summary_line(record), flush=True)
            progress.advance(task)
    console.print(results_table(records))
    (out_dir / "dgcc_cluster.json").write_text(
        json.dumps({"host": facts, "records": records}, indent=1, sort_keys=True) + "\n"
    )
    (out_dir / "dgcc_cluster.md").write_text(markdown(records, facts, args))
    plot(records, out_dir / "dgcc_cluster.png")
    ratio = speedup(records)
    console.print(f"TPC-C 2 nodes / 1 node: {ratio:.2f}x" if ratio else "no TPC-C ratio")
    console.print(f"wrote {out_dir}/dgcc_cluster.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
