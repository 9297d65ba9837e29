"""The protocols-vs-nodes bench's bookkeeping: ratios per point, the table, the plot.

Method: synthetic best runs (no cluster) fed to ``dgcc/bench/protocols_nodes.py``'s helpers,
loaded from the script file; the numbers are made up so that each check has one right answer.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

FACTS = {"cpus": 2, "git_commit": "abc", "load_average_1m_at_start": 0.5}


@pytest.fixture(scope="module")
def bench(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("protocols_nodes")


def _best() -> dict:
    """tpcc-1wh at 1 and 2 nodes: DistDGCC 900 / 600, Calvin 600 / 300, wait_die 300 / 50."""
    rates = {1: {"dgcc": 900, "calvin": 600, "wait_die": 300},
             2: {"dgcc": 600, "calvin": 300, "wait_die": 50}}  # fmt: skip
    return {
        ("tpcc-1wh", nodes, protocol): {
            "config": {"inflight": 100},
            "metrics": {"txn/commits_per_s": float(rate)},
        }
        for nodes, by_protocol in rates.items()
        for protocol, rate in by_protocol.items()
    }


def test_ratio_per_point_is_over_the_best_baseline_there(bench: ModuleType) -> None:
    assert bench.ratios(_best()) == {
        ("tpcc-1wh", 1): (1.5, "calvin", [1.5]),
        ("tpcc-1wh", 2): (2.0, "calvin", [2.0]),
    }
    only_dgcc = {k: v for k, v in _best().items() if k[2] == "dgcc"}
    assert bench.ratios(only_dgcc) == {}


def test_table_and_plot(bench: ModuleType, tmp_path: Path) -> None:
    ran = ["dgcc", "calvin", "wait_die"]
    args = argparse.Namespace(
        nodes=(1, 2), warmup_s=1.0, seconds=3.0, inflight=[25, 100], repeats=1
    )
    text = bench.markdown(_best(), ran, FACTS, args)
    rows = [line for line in text.splitlines() if line.startswith("| tpcc-1wh")]
    assert rows == [
        "| tpcc-1wh | 1 | 900 (100) | 600 (100) | 300 (100) | 1.50x (calvin) |",
        "| tpcc-1wh | 2 | 600 (100) | 300 (100) | 50 (100) | 2.00x (calvin) |",
    ]
    assert "1-minute load average 0.5 at the start." in text  # the runs counted no steal
    bench.plot(_best(), ran, tmp_path / "nodes.png")
    assert (tmp_path / "nodes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_says_how_much_cpu_time_the_hypervisor_took(bench: ModuleType) -> None:
    args = argparse.Namespace(nodes=(1, 2), warmup_s=1.0, seconds=3.0, inflight=[25], repeats=1)
    best = _best()
    for share, record in zip((0.02, 0.07, 0.04), best.values(), strict=False):
        record["metrics"]["host/cpu_stolen"] = share
    text = bench.markdown(best, ["dgcc", "calvin", "wait_die"], FACTS, args)
    assert (
        "1-minute load average 0.5 at the start; the hypervisor took 2% to 7% of the CPU time "
        "of the measured windows." in text
    ), text


@pytest.mark.parametrize("text", ["", "0,2", "x"])
def test_bad_node_counts_are_refused(bench: ModuleType, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="nodes"):
        bench._nodes(text)
    assert bench._nodes("4,1,2,2") == (1, 2, 4)


def test_sweep_keeps_each_points_best_and_stops_past_the_peak(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DistDGCC peaks at 400 calls in flight, Calvin at 25 (then twice below the rule's 80%,
    so it never runs 800); each point keeps its best run and the sweep it tried."""
    peaks = {
        "dgcc": {25: 100, 100: 300, 400: 500, 800: 450},
        "calvin": {25: 200, 100: 100, 400: 90},
    }
    ran: list[tuple] = []

    def fake_run(config) -> dict:
        ran.append((config.protocol, config.nodes, config.inflight))
        assert config.distributed_fraction == (0.0 if config.nodes == 1 else 0.1)
        rate = peaks[config.protocol][config.inflight] / config.nodes
        metrics = {"txn/commits_per_s": rate}
        fields = {"inflight": config.inflight, "nodes": config.nodes, "protocol": config.protocol,
                  "distributed_fraction": config.distributed_fraction}  # fmt: skip
        return {"config": fields, "metrics": metrics}

    monkeypatch.setattr(bench.protocols, "run_bench", fake_run)  # the sweep runs there
    monkeypatch.setattr(bench.protocols, "summary_line", lambda record: "[summary]")
    args = argparse.Namespace(
        scenarios=("tpcc-1wh",), nodes=(1, 2), protocols=("dgcc", "calvin"), quick=True,
        inflight=[25, 100, 400, 800], seconds=1.0, warmup_s=0.5, repeats=1,
    )  # fmt: skip
    best = bench.sweep(args, bench.Console(quiet=True))
    assert best[("tpcc-1wh", 2, "dgcc")]["config"]["inflight"] == 400
    assert best[("tpcc-1wh", 2, "dgcc")]["sweep"] == [(25, 50), (100, 150), (400, 250), (800, 225)]
    assert best[("tpcc-1wh", 1, "calvin")]["sweep"] == [(25, 200), (100, 100), (400, 90)]
    assert ("calvin", 1, 800) not in ran and ("dgcc", 1, 800) in ran
    assert bench.ratios(best)[("tpcc-1wh", 1)] == (2.5, "calvin", [2.5])


def test_reruns_pick_the_median_run_and_show_the_rounds_range(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs at each protocol's one contender (the runner-ups fall below 90%): each point
    stands by its median run, the ratio is of the medians, and the table row gives the range
    of the round-by-round ratios."""
    windows = {  # protocol -> inflight -> commits/s of its sweep run, then its two reruns
        "dgcc": {25: [100], 100: [1000, 1300, 700]},
        "calvin": {25: [500, 400, 600], 100: [200]},
    }

    def fake_run(config) -> dict:
        rate = windows[config.protocol][config.inflight].pop(0)
        fields = {"inflight": config.inflight, "nodes": config.nodes, "protocol": config.protocol,
                  "distributed_fraction": config.distributed_fraction}  # fmt: skip
        return {"config": fields, "metrics": {"txn/commits_per_s": float(rate)}}

    monkeypatch.setattr(bench.protocols, "run_bench", fake_run)
    monkeypatch.setattr(bench.protocols, "summary_line", lambda record: "[summary]")
    args = argparse.Namespace(
        scenarios=("tpcc-1wh",), nodes=(2,), protocols=("dgcc", "calvin"), quick=False,
        inflight=[25, 100], seconds=1.0, warmup_s=0.5, repeats=3,
    )  # fmt: skip
    best = bench.sweep(args, bench.Console(quiet=True))
    assert not any(windows[p][i] for p in windows for i in windows[p])  # every window ran
    assert best[("tpcc-1wh", 2, "dgcc")]["metrics"]["txn/commits_per_s"] == 1000
    assert best[("tpcc-1wh", 2, "calvin")]["metrics"]["txn/commits_per_s"] == 500
    assert best[("tpcc-1wh", 2, "dgcc")]["rounds"] == {0: 1000, 1: 1300, 2: 700}
    assert bench.ratios(best)[("tpcc-1wh", 2)] == (2.0, "calvin", [2.0, 1300 / 400, 700 / 600])
    text = bench.markdown(best, ["dgcc", "calvin"], FACTS, args)
    row = next(line for line in text.splitlines() if line.startswith("| tpcc-1wh"))
    assert row == "| tpcc-1wh | 2 | 1,000 (100) | 500 (25) | 2.00x (calvin, 1.17x-3.25x) |"
    assert "rerun to 3 runs" in text


def test_the_report_is_written_again_from_a_saved_run(bench: ModuleType, tmp_path: Path) -> None:
    records = []
    for (scenario, nodes, protocol), record in _best().items():
        config = {"nodes": nodes, "protocol": protocol, "warmup_s": 1.0, "seconds": 3.0}
        rate = record["metrics"]["txn/commits_per_s"]
        records.append(
            record
            | {"scenario": scenario, "config": record["config"] | config}
            | {"sweep": [[25, 10.0], [100, rate]]}
        )
    saved = tmp_path / "protocols_nodes.json"
    saved.write_text(json.dumps({"host": FACTS, "best": records}))
    assert bench.main(["--from-json", str(saved)]) == 0
    args = argparse.Namespace(
        nodes=[1, 2], warmup_s=1.0, seconds=3.0, inflight=[25, 100], repeats=1
    )
    ran = ["dgcc", "calvin", "wait_die"]
    expected = bench.markdown(_best(), ran, FACTS, args)
    assert (tmp_path / "protocols_nodes.md").read_text() == expected
    assert (tmp_path / "protocols_nodes.png").read_bytes()[:4] == b"\x89PNG"
    saved.write_text("{}")
    with pytest.raises(SystemExit, match=r"not a saved protocols_nodes\.json"):
        bench.main(["--from-json", str(saved)])
