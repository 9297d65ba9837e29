"""Logging overhead of every protocol at high contention: commits/s with and without a log.

Usage: ``python dgcc/bench/protocols.py --log`` (after its sweep, every protocol's logged runs
sweep calls in flight afresh under the same stopping rule, and its best is set beside its best
unlogged run), or standalone
``python dgcc/bench/protocols_logged.py [--quick] [--seconds S] [--inflight dgcc=400,...]``,
which runs every protocol without its log, then every protocol with it, in one invocation.

The two headline high-contention scenarios (TPC-C with 1 warehouse per node; YCSB with zipfian
theta 0.99), 10% of transactions forced to span both nodes, on the same 2-node harness as
``protocols.py``; with the log on, every node writes to its own directory with fsync on and a
call is answered only once it is durable: DistDGCC and Calvin group-commit one block per epoch
(inputs in global order plus the values received) and answer once every node has the epoch;
the 2PC baselines force a prepare record (after-images) before voting yes and the commit
decision before sending commit, one-node transactions one commit record, grouped per flush
(``dgcc.wal.twopc_log``). Writes ``protocols_logged.{json,md,png}`` to ``docs/bench`` (a temp
folder with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import protocols  # dgcc/bench/protocols.py, next to this script: scenarios, data, run configs
from cluster import host  # dgcc/bench/cluster.py, next to this script
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dgcc.bench import at_least, make_console
from dgcc.net.loadgen import ClusterBenchConfig, run_bench, summary_line

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("tpcc-1wh", "ycsb-0.99")
# the best calls-in-flight of the last quiet protocols.py sweep (standalone default)
INFLIGHT = {"dgcc": 400, "calvin": 100, "no_wait": 25, "wait_die": 25, "occ": 25}
Key = tuple[str, str]  # (scenario, protocol)


def logged_runs(
    unlogged: dict[Key, dict[str, Any]],
    make_bench: Callable[[str, str, int, bool], ClusterBenchConfig],
    console: Console,
    inflights: tuple[int, ...] = protocols.INFLIGHTS,
) -> dict[Key, dict[str, Any]]:
    """Every (scenario, protocol) of ``unlogged`` with logging on, tuned afresh: a sweep over
    ``inflights`` (ascending) under the protocols bench's rule (stop once ``peak_passed``),
    since a log's answer delay moves each protocol's best calls-in-flight differently.

    Args:
        unlogged: the unlogged record of each (scenario, protocol) to pair.
        make_bench: (scenario, protocol, inflight, durable) -> the run's config.
        inflights: the calls-in-flight values to try, ascending.

    Returns:
        The best logged run of each (scenario, protocol), with every run it tried under
        ``"sweep"`` as (inflight, commits/s) pairs.
    """
    logged: dict[Key, dict[str, Any]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("logged runs", total=len(unlogged) * len(inflights))
        for scenario, protocol in unlogged:
            runs: list[dict[str, Any]] = []
            for inflight in inflights:
                progress.update(task, description=f"{scenario} {protocol} logged {inflight}")
                result = run_bench(make_bench(scenario, protocol, inflight, True))
                runs.append(result)
                print(f"{summary_line(result)} protocol={protocol} scenario={scenario} logged=1")
                progress.advance(task)
                if protocols.peak_passed([r["metrics"]["txn/commits_per_s"] for r in runs]):
                    break
            best = max(runs, key=lambda r: r["metrics"]["txn/commits_per_s"])
            tried = [(r["config"]["inflight"], r["metrics"]["txn/commits_per_s"]) for r in runs]
            logged[(scenario, protocol)] = best | {"scenario": scenario, "sweep": tried}
    return logged


def overhead(unlogged: dict[str, Any], logged: dict[str, Any]) -> float:
    """The share of commits/s the log costs (negative: the logged run was faster)."""
    before = unlogged["metrics"]["txn/commits_per_s"]
    return 1.0 - logged["metrics"]["txn/commits_per_s"] / max(before, 1e-9)


def equal_durability_ratios(logged: dict[Key, dict[str, Any]]) -> dict[str, tuple[float, str]]:
    """Per scenario: DistDGCC's logged commits/s over the best logged baseline, and which."""
    result = {}
    for scenario in dict.fromkeys(s for s, _ in logged):
        rates = {
            p: r["metrics"]["txn/commits_per_s"] for (s, p), r in logged.items() if s == scenario
        }
        rivals = [p for p in rates if p != "dgcc"]
        if "dgcc" not in rates or not rivals:
            continue
        rival = max(rivals, key=rates.__getitem__)
        result[scenario] = (rates["dgcc"] / max(rates[rival], 1e-9), rival)
    return result


def table(unlogged: dict[Key, dict[str, Any]], logged: dict[Key, dict[str, Any]]) -> Table:
    view = Table(title="commits/s without and with each protocol's log (fsync on)")
    columns = (
        "scenario",
        "protocol",
        "inflight no log / logged",
        "no log",
        "logged",
        "overhead",
        "p99 ms logged",
    )
    for column in columns:
        view.add_column(column, justify="left" if column in ("scenario", "protocol") else "right")
    for key, record in logged.items():
        base, m = unlogged[key], record["metrics"]
        view.add_row(
            *key,
            f"{base['config']['inflight']} / {record['config']['inflight']}",
            f"{base['metrics']['txn/commits_per_s']:,.0f}",
            f"{m['txn/commits_per_s']:,.0f}",
            f"{overhead(base, record):.0%}",
            f"{m['txn/latency_ms_p99']:.1f}",
        )
    return view


def markdown(
    unlogged: dict[Key, dict[str, Any]],
    logged: dict[Key, dict[str, Any]],
    facts: dict[str, Any],
    how: str,
) -> str:
    seconds = next(iter(logged.values()))["config"]["seconds"]
    lines = [
        "## Logging overhead of every protocol (`dgcc/bench/protocols_logged.py`)",
        "",
        "The two headline high-contention scenarios of the protocols section (2 node processes "
        "on loopback, one closed-loop client process per node, 10% of transactions forced to "
        f"span both nodes, a {seconds:g} s window), each protocol at its best calls-in-flight "
        f"without a log; {how} With the log on every node writes its own directory with fsync "
        f"on, and a call is answered only once it is durable; each protocol's logged runs sweep "
        f"calls in flight afresh (25, 100, 400, 800, stopping once {protocols.SWEEP_PATIENCE} "
        f"runs in a row fall below {protocols.SWEEP_DROP:.0%} of the best so far, the protocols "
        f"bench's rule) and the best is shown. DistDGCC (dependency "
        f"logging) and Calvin (input logging) group-commit one block per node per epoch and "
        f"answer once every node has the epoch. The 2PC baselines force a prepare record (the "
        f"branch's after-images) before voting yes and the commit decision before sending "
        f"commit; a one-node transaction forces one commit record with its images, releasing its"
        f" locks first; records are grouped (one write and one fsync per flush, as many records "
        f"as are "
        f"ready). {facts['cpus']} CPUs shared by nodes and clients (1-minute load average "
        f"{facts['load_average_1m_at_start']:.1f} at the start), commit {facts['git_commit']}.",
        "",
        "| scenario | protocol | inflight no log / logged | commits/s no log | commits/s logged "
        "| overhead "
        "| p50 ms no log | p50 ms logged | p99 ms logged | cc aborts logged |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, record in logged.items():
        base, m = unlogged[key]["metrics"], record["metrics"]
        lines.append(
            f"| {key[0]} | {key[1]} "
            f"| {unlogged[key]['config']['inflight']} / {record['config']['inflight']} "
            f"| {base['txn/commits_per_s']:,.0f} | {m['txn/commits_per_s']:,.0f} "
            f"| {overhead(unlogged[key], record):.0%} | {base['txn/latency_ms_p50']:.1f} "
            f"| {m['txn/latency_ms_p50']:.1f} | {m['txn/latency_ms_p99']:.1f} "
            f"| {m['txn/cc_abort_rate']:.1%} |"
        )
    lines.append("")
    for scenario, (ratio, rival) in equal_durability_ratios(logged).items():
        lines.append(
            f"- {scenario}, every protocol logging: DistDGCC / best baseline ({rival}) = "
            f"**{ratio:.2f}x**"
        )
    lines += ["", "![logging overhead](protocols_logged.png)", ""]
    return "\n".join(lines)


def plot(
    unlogged: dict[Key, dict[str, Any]], logged: dict[Key, dict[str, Any]], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(s for s, _ in logged))
    figure, axes = plt.subplots(1, len(scenarios), figsize=(6.5 * len(scenarios), 4.2))
    for axis, scenario in zip(axes if len(scenarios) > 1 else [axes], scenarios, strict=True):
        protocols = [p for s, p in logged if s == scenario]
        xs = range(len(protocols))
        for shift, (label, runs) in ((-0.2, ("no log", unlogged)), (0.2, ("logged", logged))):
            rates = [runs[(scenario, p)]["metrics"]["txn/commits_per_s"] for p in protocols]
            axis.bar([x + shift for x in xs], rates, 0.4, label=label)
        axis.set_xticks(list(xs), protocols)
        axis.set(title=f"{scenario}: commits/s without and with the log", ylabel="commits/s")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write(
    unlogged: dict[Key, dict[str, Any]],
    logged: dict[Key, dict[str, Any]],
    facts: dict[str, Any],
    out_dir: Path,
    how: str,
) -> None:
    """``protocols_logged.{json,md,png}`` into ``out_dir``."""
    pairs = [
        {"scenario": s, "protocol": p, "unlogged": unlogged[(s, p)], "logged": r}
        for (s, p), r in logged.items()
    ]
    (out_dir / "protocols_logged.json").write_text(
        json.dumps({"host": facts, "pairs": pairs}, indent=1, sort_keys=True) + "\n"
    )
    (out_dir / "protocols_logged.md").write_text(markdown(unlogged, logged, facts, how))
    plot(unlogged, logged, out_dir / "protocols_logged.png")


def _inflight_map(text: str) -> dict[str, int]:
    result = dict(INFLIGHT)
    for part in filter(None, text.split(",")):
        protocol, _, value = part.partition("=")
        if protocol not in INFLIGHT or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(
                f"bad inflight {part!r}: use protocol=N with protocol in {list(INFLIGHT)}"
            )
        result[protocol] = int(value)
    return result


def after_sweep(
    records: list[dict[str, Any]], args, facts: dict[str, Any], out_dir: Path, console: Console
) -> None:
    """``protocols.py --log``: log the sweep's best headline high-contention runs."""
    best = protocols.best_by_protocol(records, median=False)  # a sweep's best, as the logged
    unlogged = {key: record for key, record in best.items() if key[0] in SCENARIOS}
    if not unlogged:
        console.print(f"--log: none of {SCENARIOS} ran, nothing to log")
        return

    def make_bench(scenario: str, protocol: str, inflight: int, durable: bool):
        fraction = protocols.FRACTION
        return protocols.bench_config(scenario, fraction, protocol, inflight, args, durable=durable)

    logged = logged_runs(unlogged, make_bench, console)
    console.print(table(unlogged, logged))
    how = "the logged runs followed the whole sweep, whose best runs are set beside them."
    write(unlogged, logged, facts, out_dir, how)
    console.print(f"wrote {out_dir}/protocols_logged.{{json,md,png}}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="TPC-C only, small data, 1 s windows, temp out"
    )
    parser.add_argument(
        "--seconds", type=at_least(float, 0, above=True), help="measured window per run"
    )
    parser.add_argument("--warmup-s", type=at_least(float, 0))
    parser.add_argument("--inflight", type=_inflight_map, default=dict(INFLIGHT))
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (1.0 if args.quick else 3.0)
    if args.warmup_s is None:
        args.warmup_s = 0.5 if args.quick else 1.0
    out_dir = args.out_dir or (Path(tempfile.mkdtemp()) if args.quick else REPO / "docs" / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    console = make_console()  # 160 columns off a terminal (logs)
    facts = host()
    scenarios = SCENARIOS[:1] if args.quick else SCENARIOS

    def make_bench(scenario: str, protocol: str, inflight: int, durable: bool):
        fraction = protocols.FRACTION
        return protocols.bench_config(scenario, fraction, protocol, inflight, args, durable=durable)

    unlogged: dict[Key, dict[str, Any]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("unlogged runs", total=len(scenarios) * len(INFLIGHT))
        for scenario in scenarios:
            for protocol, inflight in args.inflight.items():
                progress.update(task, description=f"{scenario} {protocol} inflight={inflight}")
                record = run_bench(make_bench(scenario, protocol, inflight, False))
                unlogged[(scenario, protocol)] = record | {"scenario": scenario}
                print(f"{summary_line(record)} protocol={protocol} scenario={scenario} logged=0")
                progress.advance(task)
    logged = logged_runs(unlogged, make_bench, console)
    console.print(table(unlogged, logged))
    how = "all unlogged runs, then all logged ones, in one invocation (standalone script)."
    write(unlogged, logged, facts, out_dir, how)
    console.print(f"wrote {out_dir}/protocols_logged.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
