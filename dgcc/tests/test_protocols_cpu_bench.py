"""The in-process CPU-per-call bench (``dgcc/bench/protocols_cpu.py``).

Method: one small real run through ``main`` (YCSB, 0% and 10% distributed, both protocols, the
answers checked equal), and synthetic records for the bookkeeping, whose numbers are made up so
that each check has one right answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("protocols_cpu")


def test_a_small_run_times_every_phase_of_both_protocols(bench: ModuleType, tmp_path: Path) -> None:
    argv = ["--rounds", "1", "--per-node", "40", "--calls", "20", "--fractions", "0,0.1"]
    argv += ["--scenarios", "ycsb-0.99", "--out-dir", str(tmp_path)]
    argv += ["--cluster-json", str(tmp_path / "none.json")]
    assert bench.main(argv) == 0
    records = json.loads((tmp_path / "protocols_cpu.json").read_text())["records"]
    assert {(r["fraction"], r["protocol"]) for r in records} == {
        (f, p) for f in (0.0, 0.1) for p in ("dgcc", "calvin")
    }
    for record in records:
        assert record["calls"] == 80  # 2 nodes x 40 calls
        spent = record["seconds"]
        assert set(spent) == set(bench.PHASES)
        assert spent["plan"] > 0 and spent["pieces"] > 0 and spent["results"] > 0
        assert min(spent.values()) >= 0
        spans = record["multi_node"]
        assert spans == 0 if record["fraction"] == 0.0 else spans > 0
    by_point = {}
    for record in records:  # the same answers from both protocols at each point
        by_point.setdefault(record["fraction"], set()).add(record["answers_sha256"])
    assert all(len(digests) == 1 for digests in by_point.values())
    text = (tmp_path / "protocols_cpu.md").read_text()
    assert "| ycsb-0.99 | 10% | calvin | 20 |" in text
    assert "| ycsb-0.99 | 10% |" in text.split("| scenario | distributed | calls spanning")[1]
    assert (tmp_path / "protocols_cpu.png").stat().st_size > 0


def test_different_answers_stop_the_run(bench: ModuleType) -> None:
    point = {"scenario": "ycsb-0.99", "fraction": 0.1, "calls_per_epoch": 20}
    runs = [point | {"protocol": "dgcc", "answers_sha256": "a"}]
    runs.append(point | {"protocol": "calvin", "answers_sha256": "b"})
    with pytest.raises(RuntimeError, match=r"ycsb-0\.99 10% 20 calls: the protocols answered"):
        bench._check_same_answers(runs)


def _record(protocol: str, calls: int, scale: float, fraction: float = 0.1) -> dict:
    """100 calls whose phases took ``scale`` x (1, 2, 0, 3, 4, 0, 0) microseconds each."""
    us = dict(zip(("inputs", "plan", "setup", "pieces", "run", "values", "results"),
                  (1, 2, 0, 3, 4, 0, 0), strict=True))  # fmt: skip
    return {
        "scenario": "tpcc-1wh", "fraction": fraction, "calls_per_epoch": calls,
        "protocol": protocol, "round": 0, "calls": 100, "multi_node": 10,
        "seconds": {k: v * scale * 100 / 1e6 for k, v in us.items()},
    }  # fmt: skip


def test_each_protocol_is_compared_at_its_cheapest_epoch_size(
    bench: ModuleType, tmp_path: Path
) -> None:
    records = [
        _record("dgcc", 25, 2.0),
        _record("dgcc", 100, 1.0),  # DistDGCC: 10 us a call at 100 calls an epoch
        _record("calvin", 25, 3.0),  # Calvin: 30 us a call at 25
        _record("calvin", 100, 4.0),
    ]
    rows = bench.summary(records)
    assert rows[("tpcc-1wh", 0.1, 100, "dgcc")]["total"] == pytest.approx(10.0)
    assert rows[("tpcc-1wh", 0.1, 100, "dgcc")]["shared"] == pytest.approx(6.0)
    assert rows[("tpcc-1wh", 0.1, 100, "dgcc")]["multi_node"] == pytest.approx(0.1)
    (ratio,) = bench.ratio_rows(rows, tmp_path / "missing.json")
    assert (ratio["dgcc_calls"], ratio["calvin_calls"]) == (100, 25)
    assert ratio["ratio"] == pytest.approx(3.0)
    assert ratio["own_free_ratio"] == pytest.approx(5.0)  # 30 us over the shared 6
    assert ratio["cluster_ratio"] is None


def test_the_cluster_ratios_come_from_the_saved_cluster_run(
    bench: ModuleType, tmp_path: Path
) -> None:
    def run(protocol: str, rate: float, per_cpu: float) -> dict:
        config = {"protocol": protocol, "distributed_fraction": 0.1, "inflight": 100}
        metrics = {"txn/commits_per_s": rate, "txn/commits_per_node_cpu_s": per_cpu}
        return {"scenario": "tpcc-1wh", "config": config, "metrics": metrics, "repeat": 0}

    saved = {"host": {"git_commit": "0123456789abcdef"}}
    saved["records"] = [run("dgcc", 300.0, 150.0), run("calvin", 200.0, 120.0)]
    path = tmp_path / "protocols.json"
    path.write_text(json.dumps(saved))
    ratios, commit = bench.cluster_ratios(path)
    assert commit == "0123456"
    assert ratios[("tpcc-1wh", 0.1)] == pytest.approx((1.5, 1.25))
