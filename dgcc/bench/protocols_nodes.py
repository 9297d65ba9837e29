"""Every protocol as the cluster grows: 1, 2 and 4 node processes at high contention.

Usage: ``python dgcc/bench/protocols_nodes.py [--quick] [--seconds S] [--nodes 1,2,4]
[--protocols dgcc,calvin]``, or ``--from-json docs/bench/protocols_nodes.json`` to write the
table and plot of a saved run again (no runs)

The two headline high-contention scenarios of ``protocols.py`` (TPC-C with 1 warehouse per
node, so the data grows with the cluster; YCSB theta 0.99 over a fixed 100,000 records) on the
same harness (node processes on loopback, one closed-loop client process per node), 10% of
transactions forced to span nodes (none with 1 node). At each point every protocol sweeps calls
in flight under ``protocols.py``'s rule, its best point (and a close runner-up) is rerun, and it
is shown by the median run of its best point, as in ``protocols.py``. All processes share this
host's cores, so adding nodes adds no CPU here: the curves show what distribution costs each
protocol (more messages, more waiting across nodes) rather than how it scales out. Writes
``protocols_nodes.{json,md,png}`` to ``docs/bench`` (a temp folder with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import protocols  # dgcc/bench/protocols.py, next to this script: scenarios, data, the rule
from cluster import host, load_note  # dgcc/bench/cluster.py, next to this script
from rich.console import Console
from rich.table import Table

from dgcc.bench import make_console

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("tpcc-1wh", "ycsb-0.99")
NODE_COUNTS = (1, 2, 4)
Key = tuple[str, int, str]  # (scenario, nodes, protocol)


def sweep(args, console: Console) -> dict[Key, dict[str, Any]]:
    """The chosen run of every (scenario, nodes, protocol): ``protocols.sweep_points`` (the
    protocols take turns at each inflight, one stopping rule, then the contenders rerun
    ``args.repeats - 1`` times) and ``protocols.best_by_protocol`` (the median run of the best
    rerun point). Each carries its sweep's (inflight, commits/s) pairs under ``"sweep"`` and
    the commits/s of every run at its inflight by round under ``"rounds"``."""
    points = [(scenario, _fraction(nodes), nodes) for scenario in args.scenarios
              for nodes in args.nodes]  # fmt: skip
    records = protocols.sweep_points(points, args, console, repeats=args.repeats)
    return chosen(records, args.nodes)


def _fraction(nodes: int) -> float:
    return protocols.FRACTION if nodes > 1 else 0.0  # one node: nothing can cross


def chosen(records: list[dict[str, Any]], node_counts: Sequence[int]) -> dict[Key, dict[str, Any]]:
    """``sweep``'s choice among ``records`` (see there)."""
    best: dict[Key, dict[str, Any]] = {}
    for nodes in node_counts:
        runs = [r for r in records if r["config"]["nodes"] == nodes]
        for (scenario, protocol), record in protocols.best_by_protocol(
            runs, _fraction(nodes)
        ).items():
            tried, rerun = protocols.sweep_of(runs, record)
            rounds = {
                r.get("repeat", 0): r["metrics"]["txn/commits_per_s"]
                for r in protocols.runs_at(runs, record)
            }
            best[(scenario, nodes, protocol)] = record | {
                "sweep": tried,
                "rounds": rounds,
                "rerun": sorted(rerun),
            }
    return best


def ratios(
    best: dict[Key, dict[str, Any]],
) -> dict[tuple[str, int], tuple[float, str, list[float]]]:
    """Per (scenario, nodes): DistDGCC's commits/s over the best baseline that ran there, that
    baseline, and the ratio in each round both ran (``protocols.round_ratios``' spread)."""
    result = {}
    for scenario, nodes in dict.fromkeys((s, n) for s, n, _ in best):
        here = {p: r for (s, n, p), r in best.items() if (s, n) == (scenario, nodes)}
        rates = {p: r["metrics"]["txn/commits_per_s"] for p, r in here.items()}
        rivals = [p for p in rates if p != "dgcc"]
        if "dgcc" in rates and rivals:
            rival = max(rivals, key=rates.__getitem__)
            ours = _rounds(here["dgcc"])
            theirs = _rounds(here[rival])
            spread = [ours[k] / max(theirs[k], 1e-9) for k in sorted(ours.keys() & theirs.keys())]
            result[(scenario, nodes)] = (rates["dgcc"] / max(rates[rival], 1e-9), rival, spread)
    return result


def _rounds(record: dict[str, Any]) -> dict[int, float]:
    """Round -> commits/s (a saved run's JSON keys are strings; a run from before the
    reruns has only its own window)."""
    rounds = record.get("rounds") or {0: record["metrics"]["txn/commits_per_s"]}
    return {int(k): v for k, v in rounds.items()}


def _rows(best: dict[Key, dict[str, Any]], ran: list[str]) -> list[list[str]]:
    by_point = ratios(best)
    rows = []
    for scenario, nodes in by_point:
        cells = []
        for protocol in ran:
            record = best[(scenario, nodes, protocol)]
            cells.append(
                f"{record['metrics']['txn/commits_per_s']:,.0f} ({record['config']['inflight']})"
            )
        ratio, rival, spread = by_point[(scenario, nodes)]
        within = f", {protocols._range(spread)}" if len(spread) > 1 else ""
        rows.append([scenario, str(nodes), *cells, f"{ratio:.2f}x ({rival}{within})"])
    return rows


def markdown(best: dict[Key, dict[str, Any]], ran: list[str], facts: dict, args) -> str:
    lines = [
        "### Every protocol vs the number of nodes (`dgcc/bench/protocols_nodes.py`)",
        "",
        f"The high-contention scenarios above with {', '.join(map(str, args.nodes))} node "
        "processes (TPC-C: 1 warehouse per node, so the data grows with the cluster; YCSB: the "
        f"same {protocols.YCSB['records']:,} records), {protocols.FRACTION:.0%} of transactions "
        "forced to span nodes "
        f"(none with 1 node), a {args.warmup_s:g} s warm-up then a {args.seconds:g} s window; "
        "each protocol swept calls in flight "
        f"({', '.join(map(str, sorted(args.inflight)))}, same stopping rule)"
        + (
            f"; its best point and a runner-up within {1 - protocols.NEAR_BEST:.0%} were rerun "
            f"to {args.repeats} runs, "
            "the protocols taking turns, and each protocol is shown by the median run of its "
            "best point, as commits/s (calls in flight), with the ratio's range over the "
            "rounds. "
            if args.repeats > 1
            else " and is shown at its best, as commits/s (calls in flight). "
        )
        + "Every process shares this host's "
        f"{facts['cpus']} CPUs, so more nodes bring no more CPU: the columns show what "
        "distribution costs each protocol, not scale-out. Commit "
        f"{facts['git_commit']}; {load_note(facts, list(best.values()))}.",
        "",
        "With 1 node no value crosses nodes, so neither protocol ever waits: both run each "
        "epoch in global order, Calvin a transaction at a time and DistDGCC a piece at a time, "
        "near the same work, and their ratio shows mostly how far apart runs on this shared "
        "host can land.",
        "",
        protocols.CALVIN_CAVEAT,
        "",
        "| scenario | nodes | " + " | ".join(ran) + " | DistDGCC / best baseline |",
        "|---|---:|" + "---:|" * (len(ran) + 1),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(best, ran)]
    flags = []
    for (scenario, nodes, _), record in best.items():
        rerun = set(record.get("rerun", [record["config"]["inflight"]]))  # (older runs: its own)
        tried = [tuple(pair) for pair in record.get("sweep", ())]
        why = protocols.understated(record, tried, rerun)
        if why is not None:
            flags.append(f"- {scenario}, {nodes} nodes: {why}.")
    if flags:
        lines += ["", *flags]
    lines += ["", "![protocols vs nodes](protocols_nodes.png)", ""]
    return "\n".join(lines)


def plot(best: dict[Key, dict[str, Any]], ran: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(s for s, _, _ in best))
    figure, axes = plt.subplots(1, len(scenarios), figsize=(6.5 * len(scenarios), 4.2))
    axes = [axes] if len(scenarios) == 1 else list(axes)
    for axis, scenario in zip(axes, scenarios, strict=True):
        for protocol in ran:
            runs = [(n, r) for (s, n, p), r in best.items() if (s, p) == (scenario, protocol)]
            points = sorted((n, r["metrics"]["txn/commits_per_s"]) for n, r in runs)
            axis.plot(*zip(*points, strict=True), marker="o", label=protocol)
        axis.set(title=f"{scenario}: vs nodes (one shared host)", xlabel="node processes")
        axis.set(ylabel="commits/s (best inflight)", yscale="log")
        axis.set_xticks(sorted({n for s, n, _ in best if s == scenario}))
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _nodes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"nodes must be ints, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"nodes must be positive, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, 1 and 2 nodes, temp out")
    parser.add_argument("--seconds", type=float, default=None, help="measured window per run")
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--nodes", type=_nodes, default=None, help="e.g. 1,2,4")
    parser.add_argument("--protocols", type=protocols._protocols, default=protocols.PROTOCOLS)
    parser.add_argument(
        "--repeats", type=protocols._repeats, default=None,
        help=f"runs at each protocol's best inflight (default {protocols.REPEATS}; 1 quick)",
    )  # fmt: skip
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument(
        "--from-json", type=Path, default=None,
        help="no runs: write the table and plot again from a saved protocols_nodes.json",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_json is not None:
        return _report_again(args.from_json, args.out_dir or args.from_json.parent)
    if len(args.protocols) < 2:
        parser.error("--protocols needs a baseline beside dgcc, the table compares them")
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 3.0
    if args.warmup_s is None:
        args.warmup_s = 0.5 if args.quick else 1.0
    if args.seconds <= 0 or args.warmup_s < 0:
        parser.error(f"--seconds must be > 0 and --warmup-s >= 0, got {args.seconds}, "
                     f"{args.warmup_s}")  # fmt: skip
    args.nodes = args.nodes or ((1, 2) if args.quick else NODE_COUNTS)
    if args.repeats is None:
        args.repeats = 1 if args.quick else protocols.REPEATS
    args.inflight = [100] if args.quick else list(protocols.INFLIGHTS)
    args.scenarios = ("tpcc-1wh",) if args.quick else SCENARIOS
    out_dir = args.out_dir or (Path(tempfile.mkdtemp()) if args.quick else REPO / "docs" / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    console = make_console()  # 160 columns off a terminal (logs)
    facts = host()
    best = sweep(args, console)
    ran = [p for p in protocols.PROTOCOLS if p in args.protocols]
    view = Table(title="commits/s (best calls in flight) vs nodes")
    for column in ("scenario", "nodes", *ran, "DistDGCC / best baseline"):
        view.add_column(column, justify="left" if column == "scenario" else "right")
    for row in _rows(best, ran):
        view.add_row(*row)
    console.print(view)
    records = [record | {"scenario": s} for (s, _, _), record in best.items()]
    (out_dir / "protocols_nodes.json").write_text(
        json.dumps({"host": facts, "best": records}, indent=1, sort_keys=True) + "\n"
    )
    (out_dir / "protocols_nodes.md").write_text(markdown(best, ran, facts, args))
    plot(best, ran, out_dir / "protocols_nodes.png")
    console.print(f"wrote {out_dir}/protocols_nodes.{{json,md,png}}")
    return 0


def _report_again(saved: Path, out_dir: Path) -> int:
    """The markdown and plot of a saved run (after a change to their text or drawing)."""
    try:
        data = json.loads(saved.read_text())
        records, facts = data["best"], data["host"]
        best = {(r["scenario"], r["config"]["nodes"], r["config"]["protocol"]): r for r in records}
        first = records[0]["config"]
        args = argparse.Namespace(
            nodes=sorted({nodes for _, nodes, _ in best}),
            warmup_s=first["warmup_s"],
            seconds=first["seconds"],
            inflight=sorted({inflight for r in records for inflight, _ in r["sweep"]}),
            repeats=max(len(r.get("rounds") or (0,)) for r in records),
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
        sys.exit(f"protocols_nodes: {saved} is not a saved protocols_nodes.json: {error!r}")
    ran = [p for p in protocols.PROTOCOLS if any(p == q for _, _, q in best)]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "protocols_nodes.md").write_text(markdown(best, ran, facts, args))
    plot(best, ran, out_dir / "protocols_nodes.png")
    print(f"wrote {out_dir}/protocols_nodes.{{md,png}} from {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
