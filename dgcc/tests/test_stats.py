"""The statistics the benchmarks share: latency percentiles and the host's stolen CPU time.

Method: hand-made inputs with one right answer each; a fake ``/proc/stat`` for the ticks, then
a run record built from two snapshots of them.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from dgcc.net import loadgen
from dgcc.stats import host_ticks, percentile


def test_percentile_is_the_nearest_rank_without_interpolation() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0.5) == 2.0 and percentile(values, 0.99) == 4.0
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 4.0
    hundred = [float(v) for v in range(1, 101)]  # p99 of 100 values is the 99th, not the max
    assert percentile(hundred, 0.99) == 99.0 and percentile(hundred, 0.5) == 50.0
    assert percentile(hundred, 0.991) == 100.0 and percentile(hundred, 0.07) == 7.0
    assert percentile([], 0.5) == 0.0 and math.isnan(percentile([], 0.5, float("nan")))


def test_host_ticks_reads_all_and_stolen_ticks(tmp_path) -> None:
    stat = tmp_path / "stat"
    #                user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 0 0 0 50 0 0\ncpu0 1 2 3\n")
    assert host_ticks(stat) == {"host/ticks": 1000.0, "host/stolen_ticks": 50.0}
    stat.write_text("cpu  1 2 3\n")  # a kernel without the steal field
    assert host_ticks(stat) == {}
    stat.write_text("cpu  1 2 3 4 5 6 7 x 9\n")  # garbled
    assert host_ticks(stat) == {}
    assert host_ticks(tmp_path / "absent") == {}
    here = host_ticks()  # this machine: Linux counts steal
    assert not here or 0 <= here["host/stolen_ticks"] <= here["host/ticks"]


def test_a_run_record_gives_the_share_of_its_window_the_hypervisor_took() -> None:
    keys = ["txn/committed", "txn/multi_node", "txn/executed", "timing_s/cpu"]
    keys += ["net/peer_messages", "net/peer_bytes", "timing_s/wait_inputs", "timing_s/wait_values"]
    result = {"counts": {"committed": 1}, "latencies_ms": [1.0], "cpu_s": 0.0}
    bench = loadgen.ClusterBenchConfig(workload="ycsb", nodes=1, seconds=1.0)

    def record(before: dict, after: dict) -> dict:
        start, end = dict.fromkeys(keys, 0) | before, dict.fromkeys(keys, 1) | after
        options = SimpleNamespace(workload_options={})
        return loadgen._record(bench, options, [result], start, end)["metrics"]

    ticks = {"host/ticks": 1000.0, "host/stolen_ticks": 50.0}
    later = {"host/ticks": 1200.0, "host/stolen_ticks": 80.0}
    assert record(ticks, later)["host/cpu_stolen"] == 30 / 200
    assert math.isnan(record({}, {})["host/cpu_stolen"])  # not counted: said so, not 0
    assert math.isnan(record({}, later)["host/cpu_stolen"])  # not the share since boot
