"""CPU per call of one epoch, DistDGCC against Calvin, in one process: where the ratio comes from.

Usage: ``python dgcc/bench/protocols_cpu.py [--quick] [--rounds R] [--per-node N]
[--calls 25,50,100,200] [--fractions 0,0.1,0.2,0.5] [--scenarios tpcc-1wh,ycsb-0.99]
[--out-dir DIR]``

``protocols.py`` runs node processes on this host's 2 CPUs, where the nodes are CPU-bound. This
script times the code a node runs for an epoch, for both nodes of a 2-node cluster in one
process with no network, so that each protocol's CPU per call can be split by phase and set
beside the cluster's ratio. Per epoch each origin routes its calls (``--calls`` per epoch, a
run per size) and frames each peer's share (``EpochPipeline._peer_inputs``), which the peer
decodes and rebuilds (``_batches``); each node builds its epoch run (DistDGCC's ``EpochRun``
or Calvin's ``CalvinEpochRun``); the two runs step in turn, their value messages framed, decoded and
delivered at once; each node reports, and each origin assembles its calls' results. Phases:

  * inputs: routing, framing and decoding the peers' inputs;
  * plan: the procedures' plan functions (``plan_batch``), the same calls for every protocol;
  * setup: the rest of the run's set-up (pieces placed on nodes, cross-node edges, the first
    pass's order; Calvin also adds its grant and release steps);
  * pieces: the procedures' piece functions (``run_piece``), the same work for every protocol
    (Calvin's grant and release steps count under run);
  * run: the rest of execution: DistDGCC's scans over pieces, Calvin's lock manager;
  * values: value messages framed, decoded and delivered;
  * results: reports framed and decoded, results assembled.

Values arrive at once here, so a lock is never held across a network delay: Calvin's cost here
is at most its cost in a cluster. Each round runs both protocols in turn, each on fresh data
with the same requests; a figure is the median over ``--rounds`` rounds, and each protocol is
compared at its cheapest epoch size. Writes
``protocols_cpu.{json,md,png}`` to ``docs/bench`` (a temp folder with ``--quick``).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import protocols  # dgcc/bench/protocols.py, next to this script: scenarios and the cluster run
from cluster import host  # dgcc/bench/cluster.py, next to this script
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import dgcc.net.servers.calvin as calvin_run
import dgcc.protocols.dist_dgcc as dgcc_run
from dgcc.bench import at_least, make_console
from dgcc.cluster import ClusterConfig, NodeAddress
from dgcc.net.epochs import EpochPipeline
from dgcc.net.loadgen import cluster_workload_options, request_pool
from dgcc.net.wire import decode, frame
from dgcc.protocols.dist_placement import Router, keep_owned
from dgcc.protocols.dist_results import ResultAssembler
from dgcc.workloads import get_workload

REPO = Path(__file__).resolve().parents[2]
RUNS = {"dgcc": dgcc_run.EpochRun, "calvin": calvin_run.CalvinEpochRun}
PHASES = ("inputs", "plan", "setup", "pieces", "run", "values", "results")
SHARED = ("inputs", "plan", "pieces", "results")  # the same work whatever the protocol
NODES = 2
SEED = 1
HIGH = tuple(name for name, (_, _, level) in protocols.SCENARIOS.items() if level == "high")


class Clock:
    """Seconds spent per phase, and the timed hooks that split the epoch run's own phases."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PHASES, 0.0)
        self.pieces_timed = 0  # calls of the timed run_piece (its timers cost is taken out)

    def timed_plan(self, plan_batch: Callable[..., Any]) -> Callable[..., Any]:
        def plan(*args: Any) -> Any:
            start = time.perf_counter()
            planned = plan_batch(*args)
            self.spent["plan"] += time.perf_counter() - start
            return planned

        return plan

    def timed_pieces(self, run_piece: Callable[..., None]) -> Callable[..., None]:
        steps = calvin_run.STEP

        def run(ctx: Any, txn: Any, piece: Any) -> None:
            start = time.perf_counter()
            run_piece(ctx, txn, piece)
            if not piece.name.startswith(steps):
                self.spent["pieces"] += time.perf_counter() - start
                self.pieces_timed += 1

        return run


def timer_cost_s() -> float:
    """What the timed ``run_piece`` adds to a call around the piece itself (taken out of run)."""
    clock = Clock()
    piece = SimpleNamespace(name="p")
    bare = clock.timed_pieces(lambda ctx, txn, piece: None)
    count = 200_000
    start = time.perf_counter()
    for _ in range(count):
        bare(None, None, piece)
    wrapped = time.perf_counter() - start
    direct = lambda ctx, txn, piece: None  # noqa: E731 - the same call, untimed
    start = time.perf_counter()
    for _ in range(count):
        direct(None, None, piece)
    plain = time.perf_counter() - start
    return max(0.0, (wrapped - plain - clock.spent["pieces"]) / count)


class Cluster:
    """Both nodes of one scenario's cluster, fresh data, and their request pools."""

    def __init__(self, scenario: str, fraction: float, per_node: int) -> None:
        name, options, _ = protocols.SCENARIOS[scenario]
        options = cluster_workload_options(name, options, NODES)
        addresses = tuple(NodeAddress(n, "127.0.0.1", 1 + n) for n in range(NODES))
        config = ClusterConfig(nodes=addresses, workload=name, workload_options=options)
        workload = get_workload(name, **options)
        self.router = Router(workload, config.placement())
        self.registry = workload.registry()
        self.dbs = [
            keep_owned(workload.build(SEED), self.router, n, workload.plan_tables)
            for n in range(NODES)
        ]
        self.pools = [request_pool(config, n, fraction, SEED, per_node) for n in range(NODES)]
        self.peers = [
            SimpleNamespace(
                id=n,
                peers=[p for p in range(NODES) if p != n],
                router=self.router,
                config=SimpleNamespace(order_log=False, nodes=addresses),
                durability=None,
            )
            for n in range(NODES)
        ]


def run_epochs(cluster: Cluster, protocol: str, calls: int, cost_s: float) -> dict:
    """``cluster``'s pools under ``protocol``, in epochs of ``calls`` calls per node; seconds
    per phase and counts."""
    epochs = len(cluster.pools[0]) // calls
    clock = Clock()
    epoch_run = RUNS[protocol]
    saved = dgcc_run.plan_batch, dgcc_run.run_piece, calvin_run.run_piece
    dgcc_run.plan_batch = clock.timed_plan(saved[0])
    dgcc_run.run_piece = clock.timed_pieces(saved[1])
    calvin_run.run_piece = clock.timed_pieces(saved[2])
    spent, now = clock.spent, time.perf_counter
    multi_node = 0
    digest = hashlib.sha256()  # of every answer: both protocols must give the same
    gc.collect()
    gc.freeze()  # as a node does: the loaded rows are long-lived
    gc.disable()
    try:
        for epoch in range(epochs):
            own = [cluster.pools[n][epoch * calls : (epoch + 1) * calls] for n in range(NODES)]
            start = now()
            inputs: list[dict[int, Any]] = [{n: own[n]} for n in range(NODES)]
            for origin in range(NODES):
                bodies = EpochPipeline._peer_inputs(cluster.peers[origin], own[origin])
                for peer, body in bodies.items():
                    inputs[peer][origin] = decode(frame(("inputs", epoch, origin, body))[4:])[3]
            batches = [EpochPipeline._batches(cluster.peers[n], inputs[n]) for n in range(NODES)]
            spent["inputs"] += now() - start
            runs = []
            for node in range(NODES):
                start, planned = now(), spent["plan"]
                runs.append(epoch_run(node, cluster.dbs[node], cluster.registry, cluster.router,
                                      batches[node]))  # fmt: skip
                spent["setup"] += now() - start - (spent["plan"] - planned)
                multi_node += runs[-1].multi_node_by_origin[node]
            _step_all(runs, epoch, spent)
            start = now()
            assemblers = [ResultAssembler(cluster.registry, own[n], NODES) for n in range(NODES)]
            for node, run in enumerate(runs):
                reports = run.reports()
                for origin in range(NODES):
                    entries = tuple(reports.get(origin, ()))
                    if origin != node:
                        entries = decode(frame(("report", epoch, node, entries))[4:])[3]
                    assemblers[origin].add(node, entries)
            answers = [list(a.answers()) for a in assemblers]
            spent["results"] += now() - start
            digest.update(repr(answers).encode())
    finally:
        gc.enable()
        gc.unfreeze()
        dgcc_run.plan_batch, dgcc_run.run_piece, calvin_run.run_piece = saved
    spent["run"] -= spent["pieces"] + clock.pieces_timed * cost_s
    return {"seconds": spent, "calls": NODES * calls * epochs, "multi_node": multi_node,
            "answers_sha256": digest.hexdigest()}  # fmt: skip


def _step_all(runs: list, epoch: int, spent: dict[str, float]) -> None:
    """Step the nodes' runs in turn to the end, each one's values delivered at once."""
    now = time.perf_counter
    while not all(run.finished for run in runs):
        progress = 0
        for node, run in enumerate(runs):
            start = now()
            progress += run.step(10**9)
            spent["run"] += now() - start  # pieces and the timers' cost come out at the end
            start = now()
            for peer, entries in run.take_outbox().items():
                runs[peer].deliver(decode(frame(("values", epoch, node, tuple(entries)))[4:])[3])
                progress += 1
            spent["values"] += now() - start
        if not progress:
            raise RuntimeError(f"epoch {epoch}: both nodes wait for values none sent")


def measure(args, console: Console) -> list[dict[str, Any]]:
    """Every (scenario, fraction, epoch size), ``args.rounds`` rounds of the protocols taking
    turns, each run on fresh data."""
    cost_s = timer_cost_s()
    records = []
    points = [(s, f, c) for s in args.scenarios for f in args.fractions for c in args.calls]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("epochs", total=len(points) * args.rounds * len(RUNS))
        for scenario, fraction, calls in points:
            for round_ in range(args.rounds):
                order = list(RUNS) if round_ % 2 == 0 else list(reversed(RUNS))
                for protocol in order:
                    what = f"{scenario} {fraction:.0%} {calls} calls {protocol}"
                    progress.update(task, description=what)
                    cluster = Cluster(scenario, fraction, args.per_node)
                    result = run_epochs(cluster, protocol, calls, cost_s)
                    point = {"scenario": scenario, "fraction": fraction, "calls_per_epoch": calls}
                    records.append(point | {"protocol": protocol, "round": round_} | result)
                    progress.advance(task)
                _check_same_answers(records[-len(RUNS) :])
    for record in records:
        record["timer_cost_us"] = cost_s * 1e6
    return records


def _check_same_answers(runs: Sequence[dict[str, Any]]) -> None:
    """The protocols ran the same calls on the same data: their answers must agree."""
    digests = {run["protocol"]: run["answers_sha256"] for run in runs}
    if len(set(digests.values())) != 1:
        first = runs[0]
        point = f"{first['scenario']} {first['fraction']:.0%} {first['calls_per_epoch']} calls"
        raise RuntimeError(f"{point}: the protocols answered differently ({digests})")


Key = tuple[str, float, int, str]  # scenario, fraction, calls per epoch, protocol


def summary(records: list[dict[str, Any]]) -> dict[Key, dict[str, float]]:
    """(scenario, fraction, calls per epoch, protocol) -> median microseconds per call of each
    phase, of the whole (the median of the rounds' totals) and of the shared phases, and the
    share of calls spanning nodes."""
    points: dict[Key, list[dict[str, Any]]] = {}
    for r in records:
        key = (r["scenario"], r["fraction"], r["calls_per_epoch"], r["protocol"])
        points.setdefault(key, []).append(r)
    result = {}
    for key, runs in points.items():
        per_call = [{k: v * 1e6 / r["calls"] for k, v in r["seconds"].items()} for r in runs]
        row = {phase: statistics.median(p[phase] for p in per_call) for phase in PHASES}
        row["total"] = statistics.median(sum(p.values()) for p in per_call)
        row["shared"] = statistics.median(sum(p[k] for k in SHARED) for p in per_call)
        row["multi_node"] = runs[0]["multi_node"] / runs[0]["calls"]
        result[key] = row
    return result


def cheapest(rows: dict[Key, dict[str, float]]) -> dict[tuple[str, float, str], Key]:
    """(scenario, fraction, protocol) -> the key of its epoch size with the least CPU per call
    (each protocol at its best, as the cluster bench picks each one's best calls in flight)."""
    best: dict[tuple[str, float, str], Key] = {}
    for key, row in rows.items():
        point = (key[0], key[1], key[3])
        if point not in best or row["total"] < rows[best[point]]["total"]:
            best[point] = key
    return best


def cluster_ratios(path: Path) -> tuple[dict[tuple[str, float], tuple[float, float]], str]:
    """(scenario, fraction) -> DistDGCC over Calvin in ``protocols.py``'s saved run (commits/s,
    commits per node CPU second), and that run's commit; empty where there is no run."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, ""
    records = saved["records"]
    result = {}
    for fraction in sorted({r["config"]["distributed_fraction"] for r in records}):
        best = protocols.best_by_protocol(records, fraction)
        rate = protocols.ratios(best, ("calvin",))
        cpu = protocols.ratios(best, ("calvin",), protocols.CPU_METRIC)
        for scenario in rate:
            result[(scenario, fraction)] = (rate[scenario][0], cpu[scenario][0])
    return result, saved["host"].get("git_commit", "")[:7]


def ratio_rows(rows: dict[Key, dict[str, float]], cluster_json: Path) -> list[dict[str, Any]]:
    """Per (scenario, fraction): each protocol at its cheapest epoch size, Calvin's CPU per call
    over DistDGCC's, the cluster's ratios, and what DistDGCC's shared work alone would allow."""
    cluster, commit = cluster_ratios(cluster_json)
    best = cheapest(rows)
    out = []
    for scenario, fraction in dict.fromkeys((k[0], k[1]) for k in rows):
        dgcc, calvin = best[(scenario, fraction, "dgcc")], best[(scenario, fraction, "calvin")]
        d, c = rows[dgcc], rows[calvin]
        rate, per_cpu = cluster.get((scenario, fraction), (None, None))
        out.append({
            "scenario": scenario, "fraction": fraction, "multi_node": d["multi_node"],
            "dgcc_us": d["total"], "dgcc_calls": dgcc[2], "calvin_us": c["total"],
            "calvin_calls": calvin[2], "ratio": c["total"] / d["total"],
            "cluster_ratio": rate, "cluster_cpu_ratio": per_cpu, "cluster_commit": commit,
            "dgcc_shared_us": d["shared"], "own_free_ratio": c["total"] / d["shared"],
        })  # fmt: skip
    return out


def table(rows: dict[Key, dict[str, float]]) -> Table:
    out = Table(title="CPU per call of one epoch, us (both nodes in one process; median)")
    for column in ("scenario", "distributed", "calls/epoch", "protocol", "total", *PHASES):
        out.add_column(column, justify="left" if column in ("scenario", "protocol") else "right")
    for (scenario, fraction, calls, protocol), row in rows.items():
        cells = [f"{row[k]:.1f}" for k in ("total", *PHASES)]
        out.add_row(scenario, f"{fraction:.0%}", str(calls), protocol, *cells)
    return out


def _cell(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def markdown(records: list[dict[str, Any]], facts: dict[str, Any], args) -> str:
    rows = summary(records)
    ratios = ratio_rows(rows, args.cluster_json)
    cost = records[0]["timer_cost_us"]
    commit = next((r["cluster_commit"] for r in ratios if r["cluster_commit"]), "")
    sizes = ", ".join(map(str, args.calls))
    lines = [
        "### Where each node's CPU goes, DistDGCC and Calvin (`dgcc/bench/protocols_cpu.py`)",
        "",
        "The nodes of the runs above are CPU-bound. This run times, in one process and with no "
        "network, the code both nodes of a 2-node cluster run for an epoch, with the data, "
        "requests and distributed fractions of the high-contention runs above: "
        f"{args.per_node:,} calls per node in epochs of {sizes} calls per node, each run on "
        f"fresh data, the two protocols taking turns, {args.rounds} rounds; a figure is the "
        "median of the rounds, and the protocols' answers were checked equal in every round. "
        "Microseconds of CPU per call, by phase: `inputs` routes, frames and decodes the calls "
        "a peer plans; `plan` is the procedures' plan functions and `pieces` their piece "
        "functions, the same work under either protocol; `setup` is the rest of an epoch "
        "run's set-up (placing pieces on nodes, cross-node edges, the first pass's order, "
        "Calvin's grant and release steps); `run` is the rest of execution (DistDGCC's scans "
        "over pieces, Calvin's lock manager; the timers' own cost, "
        f"{cost:.2f} us a piece measured first, is taken out); `values` frames, decodes and "
        "delivers value messages; `results` frames reports and assembles answers. Values "
        "arrive at once here, so no lock is held across a network delay: Calvin's cost here "
        "is at most its cost in a cluster. Each protocol is shown at its cheapest epoch size "
        "(all sizes are in the JSON and the plot). Machine: "
        f"{facts['platform']}, {facts['cpus']} CPUs, CPython {facts['python']}; commit "
        f"{facts['git_commit']}.",
        "",
        "| scenario | distributed | protocol | calls/epoch | us per call | "
        + " | ".join(PHASES)
        + " |",
        "|---|---:|---|---:|---:|" + "---:|" * len(PHASES),
    ]
    for (scenario, fraction, protocol), key in cheapest(rows).items():
        row = rows[key]
        cells = " | ".join(f"{row[k]:.1f}" for k in PHASES)
        lines.append(
            f"| {scenario} | {fraction:.0%} | {protocol} | {key[2]} | {row['total']:.1f} | "
            f"{cells} |"
        )
    lines += [
        "",
        "Calvin's CPU per call over DistDGCC's, each at its cheapest epoch size, beside the "
        f"ratios of the cluster run above (commit {commit or 'none'}); `shared` is DistDGCC's "
        "CPU per call in the phases every protocol runs alike (inputs, plan, pieces, results), "
        "and the last column is the ratio were the rest of DistDGCC's work free.",
        "",
        "| scenario | distributed | calls spanning nodes | Calvin / DistDGCC, CPU per call "
        "| cluster, commits/s | cluster, per node CPU s | DistDGCC shared, us "
        "| ratio with DistDGCC's own work free |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ratios:
        lines.append(
            f"| {r['scenario']} | {r['fraction']:.0%} | {r['multi_node']:.1%} | "
            f"{r['ratio']:.2f}x | {_cell(r['cluster_ratio'])} | "
            f"{_cell(r['cluster_cpu_ratio'])} | {r['dgcc_shared_us']:.1f} | "
            f"{r['own_free_ratio']:.2f}x |"
        )
    lines += ["", *_headline_lines(rows, ratios)]
    lines += ["", "![CPU per call vs epoch size](protocols_cpu.png)", ""]
    return "\n".join(lines)


def _headline_lines(rows: dict[Key, dict[str, float]], ratios: list[dict[str, Any]]) -> list[str]:
    """At the headline fraction: how much of DistDGCC's CPU per call is its own, and whether
    the shared work alone leaves room for 2x Calvin's."""
    lines = []
    for r in ratios:
        if r["fraction"] != protocols.FRACTION:
            continue
        dgcc = rows[(r["scenario"], r["fraction"], r["dgcc_calls"], "dgcc")]
        own, total, shared = dgcc["total"] - dgcc["shared"], dgcc["total"], dgcc["shared"]
        half = r["calvin_us"] / 2
        room = (
            f"less than the shared work alone ({shared:.1f} us)"
            if shared > half
            else f"which the shared work alone ({shared:.1f} us) leaves room for"
        )
        lines.append(
            f"- {r['scenario']} at {r['fraction']:.0%} distributed: DistDGCC's own work "
            f"(setup, run, values) is {own:.1f} of its {total:.1f} us a call ({own / total:.0%}); "
            f"the rest Calvin does alike. 2x Calvin's CPU per call would need DistDGCC within "
            f"{half:.1f} us a call, {room}."
        )
    return lines


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """CPU per call against calls per epoch: a panel per scenario, a line per protocol and
    fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary(records)
    scenarios = list(dict.fromkeys(k[0] for k in rows))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4.5), squeeze=False)
    colors = plt.get_cmap("viridis")
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        fractions = sorted({k[1] for k in rows if k[0] == scenario})
        for i, fraction in enumerate(fractions):
            color = colors(i / max(1, len(fractions) - 1) * 0.9)
            for protocol, style in zip(RUNS, ("-o", "--s"), strict=True):
                keys = sorted(k for k in rows if k[:2] == (scenario, fraction) and k[3] == protocol)
                ax.plot([k[2] for k in keys], [rows[k]["total"] for k in keys], style,
                        color=color, label=f"{protocol} {fraction:.0%}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("calls per epoch per node")
        ax.set_ylabel("CPU per call, us (both nodes)")
        ax.set_title(scenario)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle("DistDGCC (solid) and Calvin (dashed): CPU per call, in one process")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(part) for part in text.split(",") if part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"calls must be ints, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"calls must be ints >= 1, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run into a temp folder")
    parser.add_argument("--rounds", type=at_least(int, 1), default=3)
    parser.add_argument("--per-node", type=at_least(int, 1), default=5000, help="calls a run")
    parser.add_argument("--calls", type=_sizes, default=(25, 50, 100, 200), help="per epoch")
    parser.add_argument("--fractions", type=protocols._fractions, default=protocols.SWEEP_FRACTIONS)
    parser.add_argument("--scenarios", type=protocols._scenarios, default=HIGH)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--cluster-json", type=Path, default=REPO / "docs/bench/protocols.json",
                        help="protocols.py's saved run, for the cluster's ratios")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.per_node, args.calls = 1, 200, (20, 40)
    for calls in args.calls:
        if calls > args.per_node:
            parser.error(f"--calls {calls} is more than --per-node {args.per_node}")
    out = args.out_dir or (Path(tempfile.mkdtemp()) if args.quick else REPO / "docs/bench")
    out.mkdir(parents=True, exist_ok=True)
    console = make_console()
    facts = host()
    records = measure(args, console)
    rows = summary(records)
    console.print(table(rows))
    (out / "protocols_cpu.json").write_text(json.dumps({"host": facts, "records": records}))
    (out / "protocols_cpu.md").write_text(markdown(records, facts, args))
    plot(records, out / "protocols_cpu.png")
    for r in ratio_rows(rows, args.cluster_json):
        console.print(
            f"{r['scenario']} {r['fraction']:.0%}: Calvin / DistDGCC CPU per call "
            f"{r['ratio']:.2f}x (cluster {_cell(r['cluster_ratio'])}); with DistDGCC's own "
            f"work free {r['own_free_ratio']:.2f}x"
        )
    console.print(f"wrote {out}/protocols_cpu.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
