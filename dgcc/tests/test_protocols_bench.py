"""The protocols bench's bookkeeping: best runs per distributed fraction, the sweep table, plot.

Method: synthetic run records (no cluster) fed to ``dgcc/bench/protocols.py``'s helpers, loaded
from the script file; the numbers are made up so that each check has one right answer.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("protocols")


def _record(scenario: str, protocol: str, fraction: float, inflight: int, rate: float) -> dict:
    metrics = {
        "txn/commits_per_s": rate,
        "txn/cc_abort_rate": 0.0,
        # DistDGCC's nodes used a whole core each, the others' half of one (they waited)
        "txn/commits_per_node_cpu_s": rate / (2 if protocol == "dgcc" else 1),
    }
    config = {"protocol": protocol, "distributed_fraction": fraction, "inflight": inflight}
    return {"scenario": scenario, "config": config, "metrics": metrics}


def _records(bench: ModuleType) -> list[dict]:
    """tpcc-1wh at 10/20/50%: DistDGCC 1000/900/800, Calvin 400/300/200, 2PC 100 or less;
    each protocol also has a worse run at another inflight."""
    records = []
    for fraction, dgcc, calvin in ((0.1, 1000, 400), (0.2, 900, 300), (0.5, 800, 200)):
        rates = {"dgcc": dgcc, "calvin": calvin, "no_wait": 100, "wait_die": 90, "occ": 80}
        for protocol, rate in rates.items():
            records.append(_record("tpcc-1wh", protocol, fraction, 100, rate))
            records.append(_record("tpcc-1wh", protocol, fraction, 400, rate / 2))
    records += [_record("ycsb-uniform", p, 0.1, 100, 50.0) for p in bench.PROTOCOLS]
    return records


def test_best_runs_are_taken_per_fraction(bench: ModuleType) -> None:
    records = _records(bench)
    headline = bench.best_by_protocol(records)
    assert headline[("tpcc-1wh", "dgcc")]["metrics"]["txn/commits_per_s"] == 1000
    assert headline[("tpcc-1wh", "dgcc")]["config"]["inflight"] == 100
    half = bench.best_by_protocol(records, 0.5)
    assert ("ycsb-uniform", "dgcc") not in half  # swept at high contention only
    assert bench.ratios(half)["tpcc-1wh"] == (4.0, "calvin")


def test_sweep_table_has_every_fraction_and_ratio(bench: ModuleType) -> None:
    lines = bench.sweep_markdown(_records(bench), (0.1, 0.2, 0.5))
    rows = [line for line in lines if line.startswith("| tpcc-1wh")]
    assert [row.split(" | ")[1] for row in rows] == ["10%", "20%", "50%"]
    assert rows[0].endswith("| 2.50x (calvin) | 1.25x (calvin) |")
    assert rows[2].endswith("| 4.00x (calvin) | 2.00x (calvin) |")
    assert not any(line.startswith("| ycsb-uniform") for line in lines)
    assert bench.sweep_markdown(_records(bench), (0.1,)) == []  # nothing swept


def test_headroom_sets_dgccs_local_rate_over_each_fractions_best_baseline(
    bench: ModuleType,
) -> None:
    records = _records(bench) + [
        _record("tpcc-1wh", p, 0.0, 100, rate)
        for p, rate in {"dgcc": 1200, "calvin": 1250, "no_wait": 500, "wait_die": 500}.items()
    ]
    records.append(_record("tpcc-1wh", "occ", 0.0, 100, 400))
    lines = bench.sweep_markdown(records, (0.0, 0.1, 0.2, 0.5))
    (headroom,) = [line for line in lines if line.startswith("- tpcc-1wh")]
    assert "DistDGCC ran 1,200 commits/s" in headroom
    # 1200 over Calvin's 400, 300 and 200; the 0% point itself is not a bound
    assert "3.00x calvin's rate at 10%, 4.00x calvin's rate at 20%, 6.00x calvin's" in headroom
    assert "at 0%" not in headroom
    assert bench.headroom_markdown(_records(bench), ["tpcc-1wh"], (0.1, 0.2)) == []  # no 0%


def test_from_json_writes_the_report_of_a_saved_run_again(
    bench: ModuleType, tmp_path: Path
) -> None:
    records = _records(bench)
    table_metrics = ("abort_rate", "latency_ms_p50", "latency_ms_p99", "multi_node_fraction")
    for record in records:
        record["config"] |= {"warmup_s": 1.0, "seconds": 5.0}
        record["metrics"] |= {f"txn/{name}": 0.1 for name in table_metrics}
        record["metrics"]["node/cpu_s_per_s"] = 0.9
    saved = tmp_path / "protocols.json"
    host = {"cpus": 2, "git_commit": "abc", "load_average_1m_at_start": 0.5}
    saved.write_text(json.dumps({"host": host, "records": records}))
    assert bench.main(["--from-json", str(saved), "--out-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "protocols.md").read_text()
    assert "100, 400 calls in flight" in text and "| 10% |" in text and "| 50% |" in text
    assert (tmp_path / "out" / "protocols.png").read_bytes()[:4] == b"\x89PNG"
    saved.write_text("{}")
    assert bench.main(["--from-json", str(saved)]) == 2  # one line names the file


def test_plot_writes_a_png_with_the_sweep(bench: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "protocols.png"
    bench.plot(_records(bench), (0.1, 0.2, 0.5), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text", ["0.2,0.5", "0.1,1.5", "0.1,x"])
def test_fractions_must_be_valid_and_include_the_headline(bench: ModuleType, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="fractions"):
        bench._fractions(text)
    assert bench._fractions("0.5,0.1") == (0.5, 0.1)


def test_sweep_stops_once_runs_stay_well_below_the_best(bench: ModuleType) -> None:
    assert not bench.peak_passed([])
    assert not bench.peak_passed([100.0])
    assert not bench.peak_passed([100.0, 300.0, 250.0])  # within SWEEP_DROP of the best
    assert not bench.peak_passed([100.0, 300.0, 200.0])  # one dip: a later peak may follow
    assert not bench.peak_passed([3949.0, 2542.0])  # (Calvin on YCSB 0.99 peaks at 800 later)
    assert not bench.peak_passed([300.0, 200.0, 310.0])
    assert bench.peak_passed([100.0, 300.0, 200.0, 230.0])
    assert bench.peak_passed([3000.0, 400.0, 300.0])


def test_protocol_subsets_keep_dgcc_and_reject_unknown_names(bench: ModuleType) -> None:
    assert bench._protocols("calvin") == ("dgcc", "calvin")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown protocols"):
        bench._protocols("calvin,2pc")


def test_ratios_and_plot_cover_only_the_protocols_that_ran(
    bench: ModuleType, tmp_path: Path
) -> None:
    records = [r for r in _records(bench) if r["config"]["protocol"] in ("dgcc", "calvin")]
    best = bench.best_by_protocol(records)
    assert bench.ratios(best)["tpcc-1wh"] == (2.5, "calvin")
    assert bench.ratios(best, bench.TWO_PHASE) == {}  # no 2PC baseline ran
    bench.plot(records, (0.1, 0.2, 0.5), tmp_path / "subset.png")
    assert (tmp_path / "subset.png").stat().st_size > 0


def test_reruns_of_the_best_point_are_summarised_by_their_median(bench: ModuleType) -> None:
    """The sweep (repeat 0) picks the inflight; its reruns there give the median run shown
    and the round-by-round ratios behind it."""
    records = _records(bench)
    reruns = {"dgcc": (600, 800), "calvin": (500, 300)}
    for protocol, rates in reruns.items():
        for repeat, rate in enumerate(rates, start=1):
            records.append(_record("tpcc-1wh", protocol, 0.1, 100, rate) | {"repeat": repeat})
    records.append(_record("tpcc-1wh", "calvin", 0.1, 400, 5000) | {"repeat": 1})  # no pick
    best = bench.best_by_protocol(records)
    assert best[("tpcc-1wh", "dgcc")]["metrics"]["txn/commits_per_s"] == 800  # 600, 800, 1000
    assert best[("tpcc-1wh", "calvin")]["config"]["inflight"] == 100
    assert best[("tpcc-1wh", "calvin")]["metrics"]["txn/commits_per_s"] == 400  # 300, 400, 500
    assert bench.ratios(best)["tpcc-1wh"] == (2.0, "calvin")
    rounds = bench.round_ratios(records)["tpcc-1wh"]
    assert rounds == pytest.approx([1000 / 400, 600 / 500, 800 / 300])
    assert bench.round_ratios(records, 0.5)["tpcc-1wh"] == [4.0]  # not rerun: one round
    lines = bench.sweep_markdown(records, (0.1, 0.5))
    rows = [line for line in lines if line.startswith("| tpcc-1wh | 10% |")]
    assert len(rows) == 1 and rows[0].endswith("| 2.00x (calvin, 1.20x-2.67x) | 1.00x (calvin) |")


@pytest.mark.parametrize("text", ["0", "21", "x", "-1"])
def test_repeats_must_be_a_small_positive_int(bench: ModuleType, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="repeats"):
        bench._repeats(text)
    assert bench._repeats("3") == 3


def test_a_close_runner_up_is_rerun_and_the_better_median_wins(bench: ModuleType) -> None:
    """A flat curve: one lucky sweep window (12,000 at 25) must not pick the point when the
    runner-up (800, within NEAR_BEST) holds up on reruns and the lucky point does not."""
    assert bench.contenders({25: 12000.0, 100: 10000.0, 400: 11200.0, 800: 11350.0}) == [25, 800]
    assert bench.contenders({25: 1000.0, 100: 500.0}) == [25]
    assert bench.contenders({}) == []
    sweep = {25: 12000, 100: 10000, 400: 11200, 800: 11350}
    records = [_record("tpcc-1wh", "dgcc", 0.1, p, rate) for p, rate in sweep.items()]
    records.append(_record("tpcc-1wh", "calvin", 0.1, 25, 6000))
    for repeat, (lucky, steady, calvin) in enumerate(((8800, 11000, 6500), (8000, 11500, 6400)), 1):
        records += [
            _record("tpcc-1wh", "dgcc", 0.1, 25, lucky) | {"repeat": repeat},
            _record("tpcc-1wh", "dgcc", 0.1, 800, steady) | {"repeat": repeat},
            _record("tpcc-1wh", "calvin", 0.1, 25, calvin) | {"repeat": repeat},
        ]
    best = bench.best_by_protocol(records)
    assert best[("tpcc-1wh", "dgcc")]["config"]["inflight"] == 800
    assert best[("tpcc-1wh", "dgcc")]["metrics"]["txn/commits_per_s"] == 11350  # 11000..11500
    assert best[("tpcc-1wh", "calvin")]["metrics"]["txn/commits_per_s"] == 6400
    assert bench.round_ratios(records)["tpcc-1wh"] == pytest.approx(
        [11350 / 6000, 11000 / 6500, 11500 / 6400]
    )
    sweep_best = bench.best_by_protocol(records, median=False)[("tpcc-1wh", "dgcc")]
    assert sweep_best["config"]["inflight"] == 25


def test_the_sweep_reruns_each_protocols_contenders(bench: ModuleType, monkeypatch) -> None:
    # A fake run in place of a cluster: commits/s by (protocol, inflight), so the sweep's
    # bookkeeping (which points it runs, in which order) is what is checked.
    rates = {("dgcc", 25): 12000, ("dgcc", 100): 9000, ("dgcc", 400): 11500,
             ("calvin", 25): 8000, ("calvin", 100): 5000, ("calvin", 400): 4000}  # fmt: skip
    ran: list[tuple[str, int]] = []

    def fake_run(config) -> dict:
        ran.append((config.protocol, config.inflight))
        return _record("tpcc-1wh", config.protocol, 0.1, config.inflight,
                       rates[config.protocol, config.inflight])  # fmt: skip

    monkeypatch.setattr(bench, "run_bench", fake_run)
    monkeypatch.setattr(bench, "summary_line", lambda record: "[summary]")
    args = argparse.Namespace(
        inflight=[25, 100, 400], protocols=("dgcc", "calvin"), quick=True, seconds=1.0,
        warmup_s=0.5,
    )  # fmt: skip
    records = bench.sweep_points([("tpcc-1wh", 0.1, 2)], args, bench.Console(quiet=True), repeats=3)
    sweep = [(p, i) for p in ("dgcc", "calvin") for i in (25, 100, 400)]
    assert sorted(ran[:6]) == sorted(sweep)
    # the protocols take turns, in reverse order every other rerun round
    assert ran[6:] == [("calvin", 25), ("dgcc", 25), ("dgcc", 400),
                       ("dgcc", 25), ("dgcc", 400), ("calvin", 25)]  # fmt: skip
    assert [r["repeat"] for r in records[6:]] == [1, 1, 1, 2, 2, 2]


def test_a_point_the_best_median_falls_below_is_rerun_too(bench: ModuleType, monkeypatch) -> None:
    """Calvin's one run at 25 is lucky (10,800), its reruns there make 7,500: its run at 400
    (9,300) beats that median, so 400 is rerun too and the better median stands (it was shown
    at 7,500, below a point of its own sweep, overstating the ratio over it)."""
    sweep_rates = {25: 10800, 100: 9200, 400: 9300}
    later = {25: 7500, 100: 9000, 400: 9250}  # what reruns make
    seen: dict[int, int] = {}

    def fake_run(config) -> dict:
        count = seen[config.inflight] = seen.get(config.inflight, 0) + 1
        rate = sweep_rates[config.inflight] if count == 1 else later[config.inflight]
        return _record("tpcc-1wh", config.protocol, 0.1, config.inflight, rate)

    monkeypatch.setattr(bench, "run_bench", fake_run)
    monkeypatch.setattr(bench, "summary_line", lambda record: "[summary]")
    args = argparse.Namespace(inflight=[25, 100, 400], protocols=("calvin",), quick=True,
                              seconds=1.0, warmup_s=0.5)  # fmt: skip
    records = bench.sweep_points([("tpcc-1wh", 0.1, 2)], args, bench.Console(quiet=True), repeats=3)
    for record in records:
        record["config"]["nodes"] = 2
    assert seen == {25: 3, 100: 3, 400: 3}  # 100 too: within NEAR_BEST of the 7,500 median
    best = bench.best_by_protocol(records)[("tpcc-1wh", "calvin")]
    assert (best["config"]["inflight"], best["metrics"]["txn/commits_per_s"]) == (400, 9250)
    tried = [(25, 10800), (100, 9200), (400, 9300)]
    assert bench.understated(best, tried, {25, 100, 400}) is None
    shown_at_25 = _record("tpcc-1wh", "calvin", 0.1, 25, 7500)
    why = bench.understated(shown_at_25, tried, {25})
    assert why is not None and "its one run at 400 made 9,300" in why
