"""The parts (segments) that `checkpoint.resume` splits a distributed run into, kept so that the
run's `timeline.png` and `control.json` cover all of them, not only the last.

Each `fit_distributed` call that ends writes its segment's record (the steps it ran, the
wall-clock end of each, its phase events, wall time, driver memory, bytes through the driver
and the workers' stats) into `SEGMENTS_FILE` in the run folder, after the earlier segments'
records. A run resumed in place at step k first cuts the earlier records at the end of step k
and writes them back (the steps after k are run again, as their metrics rows are), so a record
never holds work the run abandoned. A segment that did not end (a crash, a killed driver)
leaves no record: the merged outputs name its steps as not recorded.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from yatt.control.timeline import Span

__all__ = [
    "SEGMENTS_FILE",
    "Segment",
    "cut_segments",
    "load_segments",
    "merged_spans",
    "merged_summary",
    "save_segments",
    "step_ranges",
]

logger = logging.getLogger(__name__)
SEGMENTS_FILE = "control_segments.json"

Event = tuple[int, str, str, float, float]


@dataclass(frozen=True)
class Segment:
    """What one `fit_distributed` call of a run did: steps `first_step + 1 .. last_step`.

    `step_end_s[i]` is the wall-clock end (time.time()) of step `first_step + 1 + i`, and
    `step_bytes[i]` the bytes through the driver by then (empty where the controller does not
    log them per step); `start_s` is when the segment's steps began, on the same clock as its
    `events` (device, role, phase, start_s, end_s). `workers` holds each worker's stats over the
    whole segment (`peak_*` keys are peaks, others totals)."""

    first_step: int
    step_end_s: list[float]
    start_s: float
    wall_s: float
    n_devices: int
    driver_peak_rss_mb: float = 0.0
    bytes_moved: int = 0
    step_bytes: list[float] = field(default_factory=list)
    workers: dict[str, dict[str, float]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    @property
    def last_step(self) -> int:
        """The steps done when the segment ended."""
        return self.first_step + len(self.step_end_s)

    def cut(self, step: int) -> Segment | None:
        """This segment as it stood at the end of step `step`: its later steps and the phase
        events that started after that dropped (None when it ran no step up to `step`).
        Worker stats cannot be cut and stay the whole segment's."""
        if step <= self.first_step:
            return None
        if step >= self.last_step:
            return self
        kept = step - self.first_step
        end_s = self.step_end_s[kept - 1]
        return replace(
            self,
            step_end_s=self.step_end_s[:kept],
            wall_s=max(end_s - self.start_s, 0.0),
            bytes_moved=int(self.step_bytes[kept - 1]) if self.step_bytes else self.bytes_moved,
            step_bytes=self.step_bytes[:kept],
            events=[event for event in self.events if event[3] < end_s],
        )


def cut_segments(segments: list[Segment], step: int) -> list[Segment]:
    """The records of a run resumed at `step`: each earlier segment cut at the end of `step`
    (`Segment.cut`), those that ran none of the steps up to it left out."""
    kept = [segment.cut(step) for segment in segments]
    return [segment for segment in kept if segment is not None]


def _segment_from_json(item: Any) -> Segment:
    """A Segment from its JSON form; ValueError (TypeError, KeyError) if it is not one."""
    segment = Segment(**item)
    events = [tuple(event) for event in segment.events]
    if not all(len(event) == 5 for event in events):
        raise ValueError("an event is not (device, role, phase, start_s, end_s)")
    numbers = [segment.start_s, segment.wall_s, *segment.step_end_s, *segment.step_bytes]
    if not all(isinstance(n, int | float) and math.isfinite(n) for n in numbers):
        raise ValueError("a time or byte count is not a finite number")
    return replace(segment, events=events)  # type: ignore[arg-type]


def load_segments(run_dir: Path) -> list[Segment]:
    """The segment records in `run_dir`, oldest first ([] when there are none). A file that is
    unreadable or not of that shape (edited by hand, a disk error) is logged and left out:
    the records only describe the run, so they never stop it."""
    path = Path(run_dir) / SEGMENTS_FILE
    if not path.is_file():
        return []
    try:
        return [_segment_from_json(item) for item in json.loads(path.read_bytes())]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        logger.warning("%s is unreadable (%s): timeline.png and control.json will cover only "
                       "the steps from now on", path, detail)  # fmt: skip
        return []


def save_segments(run_dir: Path, segments: list[Segment]) -> Path:
    """Write `segments` as `run_dir`/SEGMENTS_FILE, atomically (a crash leaves the old file
    or the new one, never half of one); returns the path."""
    path = Path(run_dir) / SEGMENTS_FILE
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps([asdict(segment) for segment in segments]))
    os.replace(staging, path)
    return path


def step_ranges(segments: list[Segment]) -> list[tuple[int, int]]:
    """The steps (1-based, inclusive ranges, merged where adjacent) that `segments` cover."""
    ranges: list[tuple[int, int]] = []
    for segment in sorted(segments, key=lambda s: s.first_step):
        if segment.last_step <= segment.first_step:
            continue
        first, last = segment.first_step + 1, segment.last_step
        if ranges and first <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], last))
        else:
            ranges.append((first, last))
    return ranges


def _missing(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The steps from 1 to the last covered one that `ranges` leave out."""
    gaps, next_step = [], 1
    for first, last in ranges:
        if first > next_step:
            gaps.append((next_step, first - 1))
        next_step = last + 1
    return gaps


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges) or "none"


def coverage_text(segments: list[Segment]) -> str:
    """Which steps `segments` cover, for a title: "steps 1-20", "steps 9-20 (1-8 not
    recorded)"."""
    ranges = step_ranges(segments)
    text = f"steps {_ranges_text(ranges)}"
    gaps = _missing(ranges)
    return f"{text} ({_ranges_text(gaps)} not recorded)" if gaps else text


def merged_spans(segments: list[Segment]) -> tuple[list[Span], list[tuple[float, str]]]:
    """Every segment's phase spans on one time axis starting at 0, laid end to end (the time
    between segments, when the run was down or starting up again, left out), and a mark
    (time, label) where each resumed segment starts."""
    spans: list[Span] = []
    marks: list[tuple[float, str]] = []
    offset_s = 0.0
    for index, segment in enumerate(segments):
        if not segment.events:
            continue
        origin = min(event[3] for event in segment.events)
        if index and spans:
            marks.append((offset_s, f"resumed at step {segment.first_step}"))
        shifted = [Span(d, role, phase, start - origin + offset_s, end - origin + offset_s)
                   for d, role, phase, start, end in segment.events]  # fmt: skip
        spans += shifted
        offset_s = max(span.end_s for span in shifted)
    return spans, marks


def _merge_workers(segments: list[Segment]) -> dict[str, dict[str, float]]:
    """Each worker's stats over all segments: peaks (`peak_*`) their maximum, others summed."""
    merged: dict[str, dict[str, float]] = {}
    for segment in segments:
        for name, stats in segment.workers.items():
            into = merged.setdefault(name, {})
            for key, value in stats.items():
                if key not in into:
                    into[key] = value
                elif key.startswith("peak"):
                    into[key] = max(into[key], value)
                else:
                    into[key] += value
    return merged


def merged_summary(segments: list[Segment]) -> dict[str, Any]:
    """`control.json`'s content over all `segments`: wall seconds and bytes through the driver
    summed, the driver's peak memory, the workers' stats merged; `steps`, the step ranges
    covered; `not_recorded`, those before the last covered step that no record holds (only
    when there are some); and one entry per segment in `segments`."""
    ranges = step_ranges(segments)
    summary: dict[str, Any] = {
        "wall_s": sum(s.wall_s for s in segments),
        "driver_peak_rss_mb": max((s.driver_peak_rss_mb for s in segments), default=0.0),
        "bytes_moved": sum(s.bytes_moved for s in segments),
        "workers": _merge_workers(segments),
        "steps": [list(r) for r in ranges],
    }
    gaps = _missing(ranges)
    if gaps:
        summary["not_recorded"] = [list(gap) for gap in gaps]
    summary["segments"] = [
        {"steps": [s.first_step + 1, s.last_step], "wall_s": s.wall_s,
         "driver_peak_rss_mb": s.driver_peak_rss_mb, "bytes_moved": s.bytes_moved,
         "workers": s.workers}
        for s in segments
    ]  # fmt: skip
    return summary
