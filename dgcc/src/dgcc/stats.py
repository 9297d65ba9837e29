"""Latency statistics shared by the in-process, cluster and PostgreSQL benchmarks."""

from __future__ import annotations

__all__ = ["percentile"]


def percentile(sorted_values: list[float], fraction: float, empty: float = 0.0) -> float:
    """The value at ``fraction`` (0..1) of ``sorted_values`` (nearest rank, no interpolation);
    ``empty`` when there are none."""
    if not sorted_values:
        return empty
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]
