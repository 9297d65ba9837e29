"""Per-device timelines: phase spans from real runs or the simulator, idle fraction, Gantt PNG.

A span is (device, role, phase, start_s, end_s[, tokens]). Busy time of a device is the union of its
spans (colocated workers overlapping on one device count once); idle fraction = 1 - busy/window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Span", "idle_fractions", "plot_timeline", "spans_from_events"]

PHASE_COLORS = {
    "gen": "tab:blue",
    "behaviour_logp": "tab:cyan",
    "reward": "tab:orange",
    "update_actor": "tab:green",
    "train": "tab:green",
    "load_weights": "tab:red",
    "sync": "tab:red",
    "swap": "tab:gray",
    "checkpoint": "tab:brown",
    "move": "black",
}


@dataclass(frozen=True)
class Span:
    """One phase of one role on one device, in seconds on a shared clock; a sampler's `gen`
    also counts the decode steps it ran (`tokens`: its longest response; 0 where unknown)."""

    device: int
    role: str
    phase: str
    start_s: float
    end_s: float
    tokens: int = 0

    def __post_init__(self) -> None:
        assert self.end_s >= self.start_s, f"span ends before it starts: {self}"


def spans_from_events(events: Iterable[tuple]) -> list[Span]:
    """Worker event tuples -> spans, with time shifted to start at 0."""
    spans = [Span(*event) for event in events]
    origin = min((s.start_s for s in spans), default=0.0)
    return [dataclasses.replace(s, start_s=s.start_s - origin, end_s=s.end_s - origin)
            for s in spans]  # fmt: skip


def _busy_s(intervals: list[tuple[float, float]]) -> float:
    total, current_end = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if start > current_end:
            total += end - start
            current_end = end
        elif end > current_end:
            total += end - current_end
            current_end = end
    return total


def idle_fractions(spans: list[Span], n_devices: int, window: tuple[float, float] | None = None
                   ) -> list[float]:  # fmt: skip
    """Idle fraction of each device over `window` (default: first start to last end)."""
    if not spans:
        return [1.0] * n_devices
    start_s, end_s = window or (min(s.start_s for s in spans), max(s.end_s for s in spans))
    length_s = end_s - start_s
    assert length_s > 0, f"empty window {start_s}..{end_s}"
    clipped: dict[int, list[tuple[float, float]]] = {device: [] for device in range(n_devices)}
    for s in spans:
        if s.device in clipped and s.end_s > start_s and s.start_s < end_s:
            clipped[s.device].append((max(s.start_s, start_s), min(s.end_s, end_s)))
    return [1.0 - _busy_s(clipped[device]) / length_s for device in range(n_devices)]


def plot_timeline(spans: list[Span], n_devices: int, path: Path, title: str = "timeline",
                  marks: Iterable[tuple[float, str]] = ()) -> Path:  # fmt: skip
    """A Gantt chart: one row per device, one bar per span, coloured by phase (one legend entry
    a phase); a dashed vertical line, labelled, at each of `marks` (time_s, label). Each
    device's idle fraction (`idle_fractions`; 100% where no span has any length) names its
    row. The bars of one device and phase are drawn as one collection, so the cost grows with
    the spans only through the rendering."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.5 * n_devices + 2.0))
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}  # in order of first span
    for span in spans:
        bars.setdefault((span.device, span.phase), []).append(
            (span.start_s, span.end_s - span.start_s)
        )
    seen: set[str] = set()
    for (device, phase), xranges in bars.items():
        ax.broken_barh(
            xranges,
            (device - 0.4, 0.8),
            facecolors=PHASE_COLORS.get(phase, "tab:purple"),
            edgecolor="white",
            linewidth=0.3,
            label=None if phase in seen else phase,
        )
        seen.add(phase)
    marks = list(marks)
    for time_s, text in marks:
        ax.axvline(time_s, color="black", linestyle="--", linewidth=0.8)
        ax.text(time_s, n_devices - 0.5, f" {text}", fontsize="small", va="bottom")
    timed = spans and max(s.end_s for s in spans) > min(s.start_s for s in spans)
    idle = idle_fractions(spans, n_devices) if timed else [1.0] * n_devices
    ax.set_yticks(range(n_devices), [f"dev {d} (idle {100 * f:.0f}%)" for d, f in enumerate(idle)])
    ax.set_xlabel("seconds")
    ax.set_title(title, pad=16 if marks else 6)  # above the marks' labels
    ax.legend(fontsize="small", ncol=8, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
