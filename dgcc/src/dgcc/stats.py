"""Statistics shared by the in-process, cluster and PostgreSQL benchmarks: latency
percentiles, and the host's CPU ticks that tell how much of a window a hypervisor took."""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["host_ticks", "percentile"]


def percentile(sorted_values: list[float], fraction: float, empty: float = 0.0) -> float:
    """The value at ``fraction`` (0..1) of ``sorted_values`` by nearest rank (the smallest value
    with at least ``fraction`` of the values at or below it; no interpolation): the 99th
    percentile of 100 values is the 99th, not the largest. ``empty`` when there are none."""
    if not sorted_values:
        return empty
    rank = math.ceil(round(fraction * len(sorted_values), 9))  # 0.07 * 100 is 7.000000000000001
    return sorted_values[min(len(sorted_values), max(rank, 1)) - 1]


def host_ticks(stat: Path = Path("/proc/stat")) -> dict[str, float]:
    """This machine's CPU clock ticks since boot: ``host/ticks`` in all and ``host/stolen_ticks``
    (steal: ticks its CPUs wanted to run while the hypervisor ran other guests), from the first
    line of ``/proc/stat``; empty where that file or its steal field is missing."""
    try:
        head = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return {}
    if head[:1] != ["cpu"] or len(head) < 9 or not all(t.isdigit() for t in head[1:9]):
        return {}
    ticks = [int(field) for field in head[1:9]]
    return {"host/ticks": float(sum(ticks)), "host/stolen_ticks": float(ticks[7])}
