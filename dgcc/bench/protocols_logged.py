"""Logging overhead of every protocol at high contention: commits/s with and without a log.

Usage: ``python dgcc/bench/protocols.py --log`` (after its sweep), or standalone
``python dgcc/bench/protocols_logged.py [--quick] [--seconds S] [--rounds R]
[--inflight dgcc=400,...]``.

The two headline high-contention scenarios (TPC-C with 1 warehouse per node; YCSB with zipfian
theta 0.99), 10% of transactions forced to span both nodes, on the same 2-node harness as
``protocols.py``; with the log on, every node writes to its own directory with fsync on and a
call is answered only once it is durable: DistDGCC and Calvin group-commit one block per epoch
(inputs in global order plus the values received) and answer once every node has the epoch;
the 2PC baselines force a prepare record (after-images) before voting yes and the commit
decision before sending commit, one-node transactions one commit record, grouped per flush
(``dgcc.wal.twopc_log``).

Two steps. First each protocol's logged runs sweep calls in flight afresh (a log's answer delay
moves each protocol's best differently), under the protocols bench's stopping rule. Then, in
each of ``--rounds`` rounds, every protocol runs once without its log (at its best unlogged
calls in flight: the protocols sweep's, or the last one's in ``docs/bench/protocols.json``
standalone) and at once with it (at its best logged calls in flight), the protocols taking
turns. The table shows the median of each side's rounds, so an overhead or a ratio compares
runs minutes apart, never a log against a window measured an hour earlier on a host whose speed
drifts. Writes ``protocols_logged.{json,md,png}`` to ``docs/bench`` (a temp folder with
``--quick``).
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
from cluster import host, load_note  # dgcc/bench/cluster.py, next to this script
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dgcc.bench import at_least, make_console
from dgcc.net.loadgen import ClusterBenchConfig, run_bench, summary_line

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("tpcc-1wh", "ycsb-0.99")
# the best calls-in-flight without a log when docs/bench/protocols.json names none (standalone)
INFLIGHT = {"dgcc": 800, "calvin": 100, "no_wait": 25, "wait_die": 25, "occ": 25}
ROUNDS = 3  # paired rounds (one run without the log and one with it, per protocol, each round)
Key = tuple[str, str]  # (scenario, protocol)
MakeBench = Callable[[str, str, int, bool], ClusterBenchConfig]


def logged_sweep(
    keys: list[Key],
    make_bench: MakeBench,
    console: Console,
    inflights: tuple[int, ...] = protocols.INFLIGHTS,
) -> dict[Key, dict[str, Any]]:
    """Each (scenario, protocol) of ``keys`` with logging on, tuned afresh: a sweep over
    ``inflights`` (ascending) under the protocols bench's rule (stop once ``peak_passed``),
    since a log's answer delay moves each protocol's best calls-in-flight differently.

    Args:
        keys: the (scenario, protocol) pairs to sweep.
        make_bench: (scenario, protocol, inflight, durable) -> the run's config.
        inflights: the calls-in-flight values to try, ascending.

    Returns:
        The best logged run of each key, with every run it tried under ``"sweep"`` as
        (inflight, commits/s) pairs.
    """
    best: dict[Key, dict[str, Any]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("logged sweep", total=len(keys) * len(inflights))
        for scenario, protocol in keys:
            runs: list[dict[str, Any]] = []
            for inflight in inflights:
                progress.update(task, description=f"{scenario} {protocol} logged {inflight}")
                result = run_bench(make_bench(scenario, protocol, inflight, True))
                runs.append(result)
                print(f"{summary_line(result)} protocol={protocol} scenario={scenario} logged=1")
                progress.advance(task)
                if protocols.peak_passed([r["metrics"]["txn/commits_per_s"] for r in runs]):
                    progress.advance(task, len(inflights) - len(runs))
                    break
            top = max(runs, key=lambda r: r["metrics"]["txn/commits_per_s"])
            tried = [(r["config"]["inflight"], r["metrics"]["txn/commits_per_s"]) for r in runs]
            best[(scenario, protocol)] = top | {"scenario": scenario, "sweep": tried}
    return best


def paired_rounds(
    inflight: dict[Key, tuple[int, int]], make_bench: MakeBench, console: Console, rounds: int
) -> dict[Key, dict[str, list[dict[str, Any]]]]:
    """``rounds`` rounds; in each, every key runs without its log and at once with it (the
    unlogged run first in even rounds, the logged one in odd rounds: neither side always
    follows the other).

    Args:
        inflight: (scenario, protocol) -> (calls in flight without the log, with it).

    Returns:
        Per key, ``{"unlogged": [...], "logged": [...]}``: one run per round each, in round
        order, each record carrying its ``round``.
    """
    runs: dict[Key, dict[str, list[dict[str, Any]]]] = {
        key: {"unlogged": [], "logged": []} for key in inflight
    }
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("paired runs", total=rounds * len(inflight) * 2)
        for number in range(rounds):
            for (scenario, protocol), points in inflight.items():
                pair = (("unlogged", False, points[0]), ("logged", True, points[1]))
                for side, durable, calls in pair if number % 2 == 0 else pair[::-1]:
                    progress.update(
                        task, description=f"round {number + 1} {scenario} {protocol} {side} {calls}"
                    )
                    record = run_bench(make_bench(scenario, protocol, calls, durable))
                    runs[(scenario, protocol)][side].append(record | {"round": number})
                    line = f"{summary_line(record)} protocol={protocol} scenario={scenario}"
                    print(f"{line} logged={int(durable)} round={number}", flush=True)
                    progress.advance(task)
    return runs


def _rate(record: dict[str, Any]) -> float:
    return record["metrics"]["txn/commits_per_s"]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median commits/s (the lower middle of an even count)."""
    return sorted(runs, key=_rate)[(len(runs) - 1) // 2]


def overheads(pair: dict[str, list[dict[str, Any]]]) -> tuple[float, list[float]]:
    """The share of commits/s the log costs (negative: the logged runs were faster): from the
    two sides' medians, and round by round."""
    median = 1.0 - _rate(median_run(pair["logged"])) / max(
        _rate(median_run(pair["unlogged"])), 1e-9
    )
    rounds = [
        1.0 - _rate(logged) / max(_rate(unlogged), 1e-9)
        for unlogged, logged in zip(pair["unlogged"], pair["logged"], strict=True)
    ]
    return median, rounds


def equal_durability_ratios(
    pairs: dict[Key, dict[str, list[dict[str, Any]]]],
) -> dict[str, tuple[float, str, list[float]]]:
    """Per scenario: DistDGCC's median logged commits/s over the best baseline's, that
    baseline, and the same ratio round by round."""
    result = {}
    for scenario in dict.fromkeys(s for s, _ in pairs):
        logged = {p: runs["logged"] for (s, p), runs in pairs.items() if s == scenario}
        rivals = [p for p in logged if p != "dgcc"]
        if "dgcc" not in logged or not rivals:
            continue
        rival = max(rivals, key=lambda p: _rate(median_run(logged[p])))
        ratio = _rate(median_run(logged["dgcc"])) / max(_rate(median_run(logged[rival])), 1e-9)
        rounds = [
            _rate(ours) / max(_rate(theirs), 1e-9)
            for ours, theirs in zip(logged["dgcc"], logged[rival], strict=True)
        ]
        result[scenario] = (ratio, rival, rounds)
    return result


def _percent_range(values: list[float]) -> str:
    return f"{min(values):.0%} to {max(values):.0%}" if len(values) > 1 else ""


def table(pairs: dict[Key, dict[str, list[dict[str, Any]]]]) -> Table:
    view = Table(title="commits/s without and with each protocol's log (fsync on), median rounds")
    columns = ("scenario", "protocol", "inflight no log / logged", "no log", "logged")
    columns += ("overhead", "round by round", "p99 ms logged")
    for column in columns:
        view.add_column(column, justify="left" if column in ("scenario", "protocol") else "right")
    for key, pair in pairs.items():
        base, record = median_run(pair["unlogged"]), median_run(pair["logged"])
        median, rounds = overheads(pair)
        view.add_row(
            *key,
            f"{base['config']['inflight']} / {record['config']['inflight']}",
            f"{_rate(base):,.0f}",
            f"{_rate(record):,.0f}",
            f"{median:.0%}",
            _percent_range(rounds),
            f"{record['metrics']['txn/latency_ms_p99']:.1f}",
        )
    return view


def markdown(
    pairs: dict[Key, dict[str, list[dict[str, Any]]]],
    facts: dict[str, Any],
    how: str,
    swept: list[int],
) -> str:
    """The section; ``swept``: the calls-in-flight values the logged sweeps tried."""
    first = next(iter(pairs.values()))
    runs = [run for pair in pairs.values() for side in pair.values() for run in side]
    seconds, rounds = first["logged"][0]["config"]["seconds"], len(first["logged"])
    lines = [
        "## Logging overhead of every protocol (`dgcc/bench/protocols_logged.py`)",
        "",
        "The two headline high-contention scenarios of the protocols section (2 node processes "
        "on loopback, one closed-loop client process per node, 10% of transactions forced to "
        f"span both nodes, a {seconds:g} s window). With the log on every node writes its own "
        "directory with fsync on, and a call is answered only once it is durable. First each "
        f"protocol's logged runs swept calls in flight afresh ({', '.join(map(str, swept))}, "
        "stopping once "
        f"{protocols.SWEEP_PATIENCE} runs in a row fell below {protocols.SWEEP_DROP:.0%} of the "
        "best so far, the protocols bench's rule), since a log moves each protocol's best "
        f"differently. Then, in each of {rounds} round{'s' * (rounds > 1)}, every protocol ran "
        f"once without its log, at {how}, and at once with it, at its best logged calls in "
        "flight, the protocols taking turns and the two runs of a pair swapping places from "
        "one round to the next. Each side's commits/s is the median of its rounds (the lower "
        "middle of an even count), and its latency and abort columns are that run's; the "
        "overhead is 1 - logged / unlogged of the two medians, and round by round of each "
        "round's pair, so no number sets a log beside a window measured long before or after "
        "it on a host whose speed drifts. DistDGCC (dependency logging) and Calvin (input "
        "logging) group-commit one block per node per epoch and answer once every node has "
        "the epoch. The 2PC baselines force a prepare record (the branch's after-images) "
        "before voting yes and the commit decision before sending commit; a one-node "
        "transaction forces one commit record with its images, releasing its locks first; "
        "records are grouped (one write and one fsync per flush, as many records as are "
        f"ready). {facts['cpus']} CPUs shared by nodes and clients "
        f"({load_note(facts, runs)}), commit {facts['git_commit']}.",
        "",
        "| scenario | protocol | inflight no log / logged | commits/s no log | commits/s logged "
        "| overhead | overhead round by round "
        "| p50 ms no log | p50 ms logged | p99 ms logged | cc aborts logged "
        "| gave up no log / logged |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, pair in pairs.items():
        base, record = median_run(pair["unlogged"]), median_run(pair["logged"])
        median, rounds_of = overheads(pair)
        m = record["metrics"]
        lines.append(
            f"| {key[0]} | {key[1]} "
            f"| {base['config']['inflight']} / {record['config']['inflight']} "
            f"| {_rate(base):,.0f} | {_rate(record):,.0f} "
            f"| {median:.0%} | {_percent_range(rounds_of)} "
            f"| {base['metrics']['txn/latency_ms_p50']:.1f} "
            f"| {m['txn/latency_ms_p50']:.1f} | {m['txn/latency_ms_p99']:.1f} "
            f"| {m['txn/cc_abort_rate']:.1%} "
            f"| {base['metrics'].get('txn/gave_up_rate', 0.0):.1%} / "
            f"{m.get('txn/gave_up_rate', 0.0):.1%} |"
        )
    lines.append("")
    for scenario, (ratio, rival, rounds_of) in equal_durability_ratios(pairs).items():
        spread = f" ({min(rounds_of):.2f}x-{max(rounds_of):.2f}x round by round)"
        lines.append(
            f"- {scenario}, every protocol logging: DistDGCC / best baseline ({rival}) = "
            f"**{ratio:.2f}x**{spread if len(rounds_of) > 1 else ''}"
        )
    lines += ["", "![logging overhead](protocols_logged.png)", ""]
    return "\n".join(lines)


def plot(pairs: dict[Key, dict[str, list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(s for s, _ in pairs))
    figure, axes = plt.subplots(1, len(scenarios), figsize=(6.5 * len(scenarios), 4.2))
    for axis, scenario in zip(axes if len(scenarios) > 1 else [axes], scenarios, strict=True):
        names = [p for s, p in pairs if s == scenario]
        xs = range(len(names))
        for shift, side, label in ((-0.2, "unlogged", "no log"), (0.2, "logged", "logged")):
            runs = [pairs[(scenario, p)][side] for p in names]
            medians = [_rate(median_run(r)) for r in runs]
            lows = [m - min(map(_rate, r)) for m, r in zip(medians, runs, strict=True)]
            highs = [max(map(_rate, r)) - m for m, r in zip(medians, runs, strict=True)]
            axis.bar([x + shift for x in xs], medians, 0.4, label=label, yerr=[lows, highs])
        axis.set_xticks(list(xs), names)
        axis.set(
            title=f"{scenario}: commits/s without and with the log",
            ylabel="commits/s (median of rounds; bars: range)",
        )
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write(
    pairs: dict[Key, dict[str, list[dict[str, Any]]]],
    sweeps: dict[Key, dict[str, Any]],
    facts: dict[str, Any],
    out_dir: Path,
    how: str,
) -> None:
    """``protocols_logged.{json,md,png}`` into ``out_dir`` (the JSON keeps every run)."""
    entries = [
        {
            "scenario": s,
            "protocol": p,
            "unlogged": runs["unlogged"],
            "logged": runs["logged"],
            "logged_sweep": sweeps[(s, p)]["sweep"] if (s, p) in sweeps else [],
        }
        for (s, p), runs in pairs.items()
    ]
    (out_dir / "protocols_logged.json").write_text(
        json.dumps({"host": facts, "pairs": entries}, indent=1, sort_keys=True) + "\n"
    )
    swept = sorted({calls for sweep in sweeps.values() for calls, _ in sweep["sweep"]})
    (out_dir / "protocols_logged.md").write_text(markdown(pairs, facts, how, swept))
    plot(pairs, out_dir / "protocols_logged.png")


def measure(
    unlogged_inflight: dict[Key, int],
    make_bench: MakeBench,
    rounds: int,
    facts: dict[str, Any],
    out_dir: Path,
    console: Console,
    how: str,
) -> None:
    """The logged sweep, then the paired rounds; print the table and write the section."""
    sweeps = logged_sweep(list(unlogged_inflight), make_bench, console)
    inflight = {
        key: (calls, sweeps[key]["config"]["inflight"]) for key, calls in unlogged_inflight.items()
    }
    pairs = paired_rounds(inflight, make_bench, console, rounds)
    console.print(table(pairs))
    write(pairs, sweeps, facts, out_dir, how)
    console.print(f"wrote {out_dir}/protocols_logged.{{json,md,png}}")


def _bench_maker(args) -> MakeBench:
    def make_bench(scenario: str, protocol: str, inflight: int, durable: bool):
        fraction = protocols.FRACTION
        return protocols.bench_config(scenario, fraction, protocol, inflight, args, durable=durable)

    return make_bench


def after_sweep(
    records: list[dict[str, Any]], args, facts: dict[str, Any], out_dir: Path, console: Console
) -> None:
    """``protocols.py --log``: the sweep's headline high-contention points, logged and not."""
    best = protocols.best_by_protocol(records)
    unlogged = {key: r["config"]["inflight"] for key, r in best.items() if key[0] in SCENARIOS}
    if not unlogged:
        console.print(f"--log: none of {SCENARIOS} ran, nothing to log")
        return
    rounds = 1 if args.quick else ROUNDS
    how = "its best calls in flight in the protocols sweep just before"
    measure(unlogged, _bench_maker(args), rounds, facts, out_dir, console, how)


def sweep_inflights(path: Path, scenarios: tuple[str, ...]) -> dict[Key, int]:
    """Each protocol's best calls in flight in the protocols bench's records at ``path``, for
    the (scenario, protocol) pairs of ``scenarios`` it ran at the headline fraction ({} when
    there is no such file)."""
    if not path.exists():
        return {}
    best = protocols.best_by_protocol(json.loads(path.read_text())["records"])
    return {
        key: record["config"]["inflight"] for key, record in best.items() if key[0] in scenarios
    }


def _unlogged_points(
    scenarios: tuple[str, ...], found: dict[Key, int], given: dict[str, int]
) -> tuple[dict[Key, int], str]:
    """Calls in flight without the log per (scenario, protocol): ``given`` (``--inflight``),
    else the sweep's best (``found``), else ``INFLIGHT``; and the words saying which."""
    points, sources = {}, set()
    for key in ((s, p) for s in scenarios for p in protocols.PROTOCOLS):
        if key[1] in given:
            points[key], source = given[key[1]], "the calls in flight --inflight gave"
        elif key in found:
            points[key], source = found[key], "its best calls in flight in the last protocols sweep"
        else:
            points[key], source = INFLIGHT[key[1]], "this script's default calls in flight"
        sources.add(source)
    return points, " or ".join(sorted(sources))


def _inflight_map(text: str) -> dict[str, int]:
    result = {}
    for part in filter(None, text.split(",")):
        protocol, _, value = part.partition("=")
        if protocol not in INFLIGHT or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(
                f"bad inflight {part!r}: use protocol=N with protocol in {list(INFLIGHT)}"
            )
        result[protocol] = int(value)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="TPC-C only, small data, 1 s windows, temp out"
    )
    parser.add_argument(
        "--seconds", type=at_least(float, 0, above=True), help="measured window per run"
    )
    parser.add_argument("--warmup-s", type=at_least(float, 0))
    parser.add_argument(
        "--rounds", type=at_least(int, 1), default=None, help=f"paired rounds (default {ROUNDS})"
    )
    parser.add_argument(
        "--inflight",
        type=_inflight_map,
        default={},
        help="calls in flight without the log, e.g. dgcc=800,calvin=100 (default: the best of "
        "docs/bench/protocols.json)",
    )
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (1.0 if args.quick else 5.0)
    if args.warmup_s is None:
        args.warmup_s = 0.5 if args.quick else 1.0
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    out_dir = args.out_dir or (Path(tempfile.mkdtemp()) if args.quick else REPO / "docs" / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    console = make_console()  # 160 columns off a terminal (logs)
    facts = host()
    scenarios = SCENARIOS[:1] if args.quick else SCENARIOS
    source = REPO / "docs" / "bench" / "protocols.json"
    found = {} if args.quick else sweep_inflights(source, scenarios)
    unlogged, how = _unlogged_points(scenarios, found, args.inflight)
    measure(unlogged, _bench_maker(args), rounds, facts, out_dir, console, how)
    return 0


if __name__ == "__main__":
    sys.exit(main())
