"""The cluster-restart part of the logging bench, on a small real cluster.

Goal: ``dgcc/bench/node_recovery.py`` measures what it says: a logging cluster of real node
processes answers every call, each node then recovers alone from its own directory with its
timings reported, and the recovered nodes together hold the serial replay of the logged global
order (``recover_nodes`` raises otherwise). Method: 2 nodes, 3 count-closed epochs of small
TPC-C; then the history the check compares against is cut short, which it must catch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from dgcc.wal.trials import DrillFailure

OPTIONS = {"warehouses": 2, "items": 200, "customers_per_district": 30, "orders_per_district": 30}
KEYS = {"read_log", "load_checkpoint", "replay", "replay_cpu", "recover", "rows_held", "rows_whole"}


@pytest.fixture(scope="module")
def bench(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("node_recovery")


@pytest.mark.integration
def test_nodes_recover_alone_and_together_equal_serial(bench: ModuleType, tmp_path: Path) -> None:
    logs = bench.run_cluster(tmp_path, OPTIONS, batch=20, epochs=3, seed=5, nodes=2)
    assert [len(batch) for batch in logs.history] == [20, 20, 20]
    assert sum(map(len, logs.answered)) == 60
    timings = bench.recover_nodes(logs, rounds=1)
    assert len(timings) == 2
    for timing in timings:
        assert {name.removeprefix("timing_s/") for name in timing} == KEYS
        assert 0 < timing["timing_s/replay"] < timing["timing_s/recover"]
        # a node recovers its own warehouse's rows (and the tables every node keeps), no more
        assert 0 < timing["rows_held"] < timing["rows_whole"]
    logs.history = logs.history[:2]  # the nodes replay 3 epochs: no longer the serial state
    with pytest.raises(DrillFailure, match="differs from the serial replay"):
        bench.recover_nodes(logs, rounds=1)
