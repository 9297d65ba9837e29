"""The parts (segments) that `checkpoint.resume` splits a distributed run into, kept so that the
run's `timeline.png` and `control.json` cover all of them, not only the last.

Each `fit_distributed` call that ends writes its segment's record (the steps it ran, the
wall-clock end of each, its phase events, wall time, driver memory, bytes through the driver
and the workers' stats) into `SEGMENTS_FILE` in the run folder, after the earlier segments'
records. A run resumed in place at step k first cuts the earlier records at the end of step k
and writes them back (the steps after k are run again, as their metrics rows are): a record
keeps no step after k and no phase time after the end of step k. Phase events carry no step,
so work for later steps that was in flight when step k ended (an async run's generation ahead
of its updates) stays up to that instant. A segment that did not end (a crash, a killed driver)
leaves no record: the merged outputs name its steps as not recorded.

Records are bounded: a segment's events are held compact (`compact_events`: at most
`MAX_SPANS` spans a segment, with each device's busy time per role and phase, and in all,
kept), and written as one array of start and one of end times per (device, role, phase).

The records only describe the run, so they never stop it: a file that cannot be read or does
not hold records of the right shape (a torn write, a disk error, an edit by hand) is moved
aside to `SEGMENTS_BAD_FILE`, one warning names the problem, and the run goes on as if there
were no earlier records.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from yatt.control.timeline import Span

__all__ = [
    "MAX_SPANS",
    "SEGMENTS_BAD_FILE",
    "SEGMENTS_FILE",
    "Segment",
    "compact_events",
    "cut_segments",
    "load_segments",
    "merged_spans",
    "merged_summary",
    "save_segments",
    "settings_text",
    "step_ranges",
]

logger = logging.getLogger(__name__)
SEGMENTS_FILE = "control_segments.json"
SEGMENTS_BAD_FILE = SEGMENTS_FILE + ".bad"  # where a damaged SEGMENTS_FILE is moved
MAX_SPANS = 20_000  # the most phase spans a segment keeps

Event = tuple[int, str, str, float, float]  # (device, role, phase, start_s, end_s)
_Key = tuple[int, str, str]  # (device, role, phase)
_Intervals = tuple[np.ndarray, np.ndarray]  # disjoint, sorted starts and ends


@dataclass(frozen=True)
class Segment:
    """What one `fit_distributed` call of a run did: steps `first_step + 1 .. last_step`.

    `step_end_s[i]` is the wall-clock end (time.time()) of step `first_step + 1 + i`, and
    `step_bytes[i]` the bytes through the driver by then (empty where the controller does not
    log them per step); `start_s` is when the segment's steps began, on the same clock as its
    `events` (device, role, phase, start_s, end_s). `workers` holds each worker's stats over the
    whole segment (`peak_*` keys are peaks, others totals). `settings` names the `control.*`
    settings it ran with (a resume may change them; "" in records from before the field), and
    `decisions` are its runtime re-placement decisions (`Decision.record`: `step` is the
    logged step each came before).

    `events` are made compact on construction (`compact_events`): in time order, at most
    `MAX_SPANS` of them, each device's busy time per role and phase kept."""

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
    settings: str = ""
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", compact_events(self.events))

    @property
    def last_step(self) -> int:
        """The steps done when the segment ended."""
        return self.first_step + len(self.step_end_s)

    def cut(self, step: int) -> Segment | None:
        """This segment as it stood at the end of step `step` (None when it ran no step up to
        `step`): its later steps dropped, and its phase time after the end of step `step`
        (spans that started after it dropped, those running then cut short at it). Spans of
        later steps already in flight then stay up to that instant: events carry no step.
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
            events=[(d, role, phase, start, min(end, end_s))
                    for d, role, phase, start, end in self.events if start < end_s],
            decisions=[decision for decision in self.decisions if decision["step"] <= step],
        )  # fmt: skip


def cut_segments(segments: list[Segment], step: int) -> list[Segment]:
    """The records of a run resumed at `step`: each earlier segment cut at the end of `step`
    (`Segment.cut`), those that ran none of the steps up to it left out."""
    kept = [segment.cut(step) for segment in segments]
    return [segment for segment in kept if segment is not None]


# ---------------------------------------------------------------------------- compact events


def compact_events(events: Iterable[Event], max_spans: int = MAX_SPANS) -> list[Event]:
    """`events` as few spans as keep what the timeline shows, sorted by (start, end, device,
    role, phase); an event that ends before it starts counts as ending when it starts.

    Spans of one device, role and phase that overlap or touch become one: nothing is lost.
    When more than `max_spans` remain, the segment's time is cut into equal windows (as many
    as keep the count within `max_spans`, at least one) and each device's spans in a window
    are laid out again: each (role, phase) as much busy time as it had there, the device busy
    as long as it was there (time when several of its roles were busy at once counts once),
    from the first instant it was busy there to the last. Each device's busy time per role and
    phase and in all, and its first start and last end, stay as they were (up to rounding), so
    the idle fractions over the segment do too; where in a window the work fell does not, and
    spans of no length may go. The count is then at most `max_spans`, or three times the
    number of (device, role, phase) where that is more. Compacting a compact list gives it
    back."""
    events = list(events)
    if not events:
        return []
    keys: dict[_Key, int] = {}
    group = np.fromiter((keys.setdefault((e[0], e[1], e[2]), len(keys)) for e in events),
                        dtype=np.int64, count=len(events))  # fmt: skip
    starts = np.fromiter((e[3] for e in events), dtype=np.float64, count=len(events))
    ends = np.maximum(np.fromiter((e[4] for e in events), dtype=np.float64, count=len(events)),
                      starts)  # fmt: skip
    order = np.lexsort((starts, group))
    group, starts, ends = group[order], starts[order], ends[order]
    bounds = [0, *(np.flatnonzero(np.diff(group)) + 1).tolist(), len(group)]
    names = list(keys)
    groups = {names[int(group[a])]: _union(starts[a:b], ends[a:b])
              for a, b in itertools.pairwise(bounds)}  # fmt: skip
    if sum(len(s) for s, _ in groups.values()) > max_spans:
        groups = _downsample(groups, max_spans)
    compact = [(key[0], key[1], key[2], start, end)
               for key, (s, e) in groups.items()
               for start, end in zip(s.tolist(), e.tolist(), strict=True)]  # fmt: skip
    compact.sort(key=lambda e: (e[3], e[4], e[0], e[1], e[2]))
    return compact


def _union(starts: np.ndarray, ends: np.ndarray) -> _Intervals:
    """The union of intervals sorted by start, as disjoint intervals (touching ones joined)."""
    if not len(starts):
        return starts, ends
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.concatenate(([True], starts[1:] > reach[:-1])))
    return starts[first], np.maximum.reduceat(ends, first)


def _busy_before(intervals: _Intervals, times: np.ndarray) -> np.ndarray:
    """Busy seconds of disjoint sorted `intervals` before each of `times`."""
    starts, ends = intervals
    lengths = ends - starts
    before = np.concatenate(([0.0], np.cumsum(lengths)))
    index = np.searchsorted(starts, times, side="right") - 1  # the last one started by then
    inside = np.clip(times - starts[np.maximum(index, 0)], 0.0, lengths[np.maximum(index, 0)])
    return np.where(index >= 0, before[np.maximum(index, 0)] + inside, 0.0)


def _downsample(groups: dict[_Key, _Intervals], max_spans: int) -> dict[_Key, _Intervals]:
    """`groups` laid out again in windows (see `compact_events`), as many windows as keep the
    count within `max_spans` (at least one)."""
    first_s = min(float(s[0]) for s, _ in groups.values())
    last_s = max(float(e[-1]) for _, e in groups.values())
    n_windows = max(max_spans // len(groups), 1)
    while True:
        laid = _windowed(groups, first_s, last_s, n_windows)
        if sum(len(s) for s, _ in laid.values()) <= max_spans or n_windows == 1:
            return laid
        n_windows = max(n_windows // 2, 1)


def _windowed(groups: dict[_Key, _Intervals], first_s: float, last_s: float, n_windows: int
              ) -> dict[_Key, _Intervals]:  # fmt: skip
    """Each device's spans laid out again in `n_windows` equal windows of first_s..last_s."""
    edges = np.linspace(first_s, last_s, n_windows + 1)
    edges[-1] = last_s
    pieces: dict[_Key, list[tuple[float, float]]] = {key: [] for key in groups}
    for device in sorted({key[0] for key in groups}):
        keys = sorted(key for key in groups if key[0] == device)
        starts = np.concatenate([groups[key][0] for key in keys])
        ends = np.concatenate([groups[key][1] for key in keys])
        order = np.argsort(starts, kind="stable")
        union = _union(starts[order], ends[order])
        union_s = np.diff(_busy_before(union, edges)).tolist()
        busy = union[1] > union[0]
        union = union[0][busy], union[1][busy]  # spans of no length: not where work was
        if not len(union[0]):
            continue
        busy_s = [np.diff(_busy_before(groups[key], edges)).tolist() for key in keys]
        # the first and last instant the device is busy in each window
        first = union[0][np.minimum(np.searchsorted(union[1], edges[:-1], side="right"),
                                    len(union[0]) - 1)]  # fmt: skip
        firsts = np.maximum(edges[:-1], first).tolist()
        last = union[1][np.maximum(np.searchsorted(union[0], edges[1:], side="left") - 1, 0)]
        lasts = np.minimum(edges[1:], last).tolist()
        for window, seconds in enumerate(union_s):
            if seconds > 0.0:
                shares = [(key, column[window]) for key, column in zip(keys, busy_s, strict=True)]
                _lay_out(shares, firsts[window], lasts[window], seconds, pieces)
    laid = {}
    for key, spans in pieces.items():
        if spans:
            spans.sort()
            laid[key] = _union(np.array([s for s, _ in spans]), np.array([e for _, e in spans]))
    return laid


def _lay_out(shares: list[tuple[_Key, float]], first_s: float, last_s: float, busy_s: float,
             pieces: dict[_Key, list[tuple[float, float]]]) -> None:  # fmt: skip
    """Lay each (key, seconds) of `shares` (each at most `busy_s`, together at least it) end to
    end around a circle of `busy_s` seconds: their union is the whole circle and each key's
    pieces do not overlap. Unroll the circle from `first_s` and open it at a point inside, the
    part after the point moved to end at `last_s` (`last_s - first_s` >= `busy_s`): the union
    stays `busy_s` long, from `first_s` to `last_s`. Adds the pieces to `pieces`."""
    laid: list[tuple[_Key, float, float]] = []
    position = 0.0
    for key, seconds in shares:
        if seconds <= 0.0:
            continue
        end = position + seconds
        if end <= busy_s:
            laid.append((key, position, end))
            position = end if end < busy_s else 0.0
        else:  # wraps around
            laid.append((key, position, busy_s))
            laid.append((key, 0.0, end - busy_s))
            position = end - busy_s
    if not laid:  # rounding: busy in the window, but no share long enough to count
        return
    opening = max(start for _, start, _ in laid)  # no piece to cut where they tile the circle
    if opening <= 0.0:
        opening = busy_s / 2
    shift_s = max(last_s - first_s - busy_s, 0.0)
    for key, start, end in laid:
        if end <= opening:
            pieces[key].append((first_s + start, first_s + end))
        elif start >= opening:
            pieces[key].append((first_s + start + shift_s, first_s + end + shift_s))
        else:
            pieces[key].append((first_s + start, first_s + opening))
            pieces[key].append((first_s + opening + shift_s, first_s + end + shift_s))


# ---------------------------------------------------------------------------- the file


def _number(value: Any, what: str) -> float:
    """`value` if it is a finite number (not a bool), else ValueError naming `what`."""
    try:
        finite = isinstance(value, int | float) and not isinstance(value, bool)
        finite = finite and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"{what} is not a finite number: {_shown(value)}")
    return value


def _count(value: Any, what: str, least: int) -> int:
    """`value` if it is an int (not a bool) of at least `least`, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} is not an integer >= {least}: {_shown(value)}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list: {_shown(value)}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string: {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_FIELDS = {f.name for f in fields(Segment)}
_REQUIRED = {"first_step", "step_end_s", "start_s", "wall_s", "n_devices"}


def _events_from_json(value: Any, what: str) -> list[Event]:
    """Events from their file form: per (device, role, phase) [device, role, phase, [start_s,
    ...], [end_s, ...]], or (as earlier versions wrote) one [device, role, phase, start_s,
    end_s] per event; ValueError unless every device is an int >= 0, every time finite and no
    event ends before it starts."""
    events: list[Event] = []
    for index, entry in enumerate(_list(value, what)):
        where = f"{what}[{index}]"
        if not isinstance(entry, list) or len(entry) != 5:
            raise ValueError(f"{where} is not [device, role, phase, start_s, end_s]")
        device = _count(entry[0], f"{where} device", 0)
        role, phase = _text(entry[1], f"{where} role"), _text(entry[2], f"{where} phase")
        if isinstance(entry[3], list):
            starts, ends = _list(entry[3], f"{where} starts"), _list(entry[4], f"{where} ends")
            if len(starts) != len(ends):
                raise ValueError(f"{where} has {len(starts)} starts but {len(ends)} ends")
        else:
            starts, ends = [entry[3]], [entry[4]]
        for start, end in zip(starts, ends, strict=True):
            _number(start, f"{where} start")
            _number(end, f"{where} end")
            if end < start:
                raise ValueError(f"{where} ends before it starts ({end!r} < {start!r})")
            events.append((device, role, phase, float(start), float(end)))
    return events


def _segment_from_json(item: Any, what: str) -> Segment:
    """A Segment from its file form; ValueError (naming `what` and the field) unless every
    field has the type and range the record's uses need."""
    if not isinstance(item, dict):
        raise ValueError(f"{what} is not an object")
    wrong = {"unknown": sorted(set(item) - _FIELDS), "missing": sorted(_REQUIRED - set(item))}
    if any(wrong.values()):
        named = "; ".join(f"{how} fields {names}" for how, names in wrong.items() if names)
        raise ValueError(f"{what}: {named}")
    ends_what, bytes_what = f"{what} step_end_s", f"{what} step_bytes"
    step_end_s = [_number(n, ends_what) for n in _list(item["step_end_s"], ends_what)]
    step_bytes = [_number(n, bytes_what) for n in _list(item.get("step_bytes", []), bytes_what)]
    if step_bytes and len(step_bytes) != len(step_end_s):
        raise ValueError(f"{what}: {len(step_bytes)} step_bytes for {len(step_end_s)} steps")
    workers = item.get("workers", {})
    if not isinstance(workers, dict):
        raise ValueError(f"{what} workers is not an object: {_shown(workers)}")
    for name, stats in workers.items():
        if not isinstance(stats, dict):
            raise ValueError(f"{what} workers[{name!r}] is not an object: {_shown(stats)}")
        for key, value in stats.items():
            _number(value, f"{what} workers[{name!r}][{key!r}]")
    entries = _list(item.get("decisions", []), f"{what} decisions")
    decisions = [_decision(entry, f"{what} decisions[{i}]") for i, entry in enumerate(entries)]
    peak_mb = _number(item.get("driver_peak_rss_mb", 0.0), f"{what} driver_peak_rss_mb")
    bytes_moved = _number(item.get("bytes_moved", 0), f"{what} bytes_moved")
    return Segment(
        first_step=_count(item["first_step"], f"{what} first_step", 0),
        step_end_s=step_end_s,
        start_s=_number(item["start_s"], f"{what} start_s"),
        wall_s=_number(item["wall_s"], f"{what} wall_s"),
        n_devices=_count(item["n_devices"], f"{what} n_devices", 1),
        driver_peak_rss_mb=peak_mb,
        bytes_moved=bytes_moved,  # type: ignore[arg-type]  # an int as written, a float allowed
        step_bytes=step_bytes,
        workers=workers,
        events=_events_from_json(item.get("events", []), f"{what} events"),
        settings=_text(item.get("settings", ""), f"{what} settings"),
        decisions=decisions,
    )


_DECISION_KEYS = {"step", "from", "to", "switch", "reason"}


def _decision(entry: Any, what: str) -> dict[str, Any]:
    """A re-placement decision from its file form (`Decision.record`'s keys and types)."""
    if not isinstance(entry, dict) or set(entry) != _DECISION_KEYS:
        raise ValueError(f"{what} is not an object with keys {sorted(_DECISION_KEYS)}")
    _count(entry["step"], f"{what} step", 1)
    for key in ("from", "to", "reason"):
        _text(entry[key], f"{what} {key}")
    if not isinstance(entry["switch"], bool):
        raise ValueError(f"{what} switch is not true or false: {_shown(entry['switch'])}")
    return dict(entry)


def _segment_to_json(segment: Segment) -> dict[str, Any]:
    """The file form of `segment` (`_segment_from_json` reads it back equal)."""
    item = {f.name: getattr(segment, f.name) for f in fields(Segment) if f.name != "events"}
    by_key: dict[_Key, tuple[list[float], list[float]]] = {}
    for device, role, phase, start, end in segment.events:
        starts, ends = by_key.setdefault((device, role, phase), ([], []))
        starts.append(start)
        ends.append(end)
    item["events"] = [[*key, starts, ends] for key, (starts, ends) in sorted(by_key.items())]
    return item


def load_segments(run_dir: Path) -> list[Segment]:
    """The segment records in `run_dir`, oldest first ([] when there are none).

    A file that cannot be read or does not hold records of the right shape (types, finite
    times, no event ending before it starts) is moved to `SEGMENTS_BAD_FILE` (replacing one
    there) with one warning naming the problem, and [] returned: the records only describe the
    run, so they never stop it, and a later save does not overwrite the evidence."""
    path = Path(run_dir) / SEGMENTS_FILE
    if not path.is_file():
        return []
    try:
        items = _list(json.loads(path.read_bytes()), "the file")
        return [_segment_from_json(item, f"record {i}") for i, item in enumerate(items)]
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    bad = path.with_name(SEGMENTS_BAD_FILE)
    try:
        os.replace(path, bad)
        moved = f"moved it to {bad.name}"
    except OSError as exc:
        moved = "could not move it aside (" + " ".join(str(exc).split())[:100] + ")"
    logger.warning("%s is damaged (%s); %s: timeline.png and control.json will cover only the "
                   "steps from now on", path, detail, moved)  # fmt: skip
    return []


def save_segments(run_dir: Path, segments: list[Segment]) -> Path:
    """Write `segments` as `run_dir`/SEGMENTS_FILE, atomically (a crash leaves the old file
    or the new one, never half of one); returns the path."""
    path = Path(run_dir) / SEGMENTS_FILE
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps([_segment_to_json(segment) for segment in segments]))
    os.replace(staging, path)
    return path


# ---------------------------------------------------------------------------- merged outputs


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


def settings_text(segments: list[Segment]) -> str:
    """The `control.*` settings `segments` ran with, for a title: the one label they share, or,
    where a resume changed them, the labels in order."""
    labels = [s.settings for s in segments if s.settings]
    distinct = list(dict.fromkeys(labels))
    if len(distinct) <= 1:
        return distinct[0] if distinct else ""
    return "settings changed on resume: " + " / ".join(
        label for i, label in enumerate(labels) if not i or label != labels[i - 1]
    )


def merged_spans(segments: list[Segment]) -> tuple[list[Span], list[tuple[float, str]]]:
    """Every segment's phase spans (compact: at most `MAX_SPANS` each) on one time axis
    starting at 0, laid end to end (the time between segments, when the run was down or
    starting up again, left out), and a mark (time, label) where each resumed segment
    starts (naming its settings where they differ from the segment's before)."""
    spans: list[Span] = []
    marks: list[tuple[float, str]] = []
    offset_s = 0.0
    for index, segment in enumerate(segments):
        if not segment.events:
            continue
        origin = min(event[3] for event in segment.events)
        if index and spans:
            label = f"resumed at step {segment.first_step}"
            before = segments[index - 1].settings
            if segment.settings and before and segment.settings != before:
                label += f" as {segment.settings}"
            marks.append((offset_s, label))
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
            merge_stats(merged.setdefault(name, {}), stats)
    return merged


def merge_stats(into: dict[str, float], stats: dict[str, float]) -> None:
    """Add one stretch's worker stats to `into`: peaks (`peak_*`) their maximum, others (the
    seconds of a stretch, such as its collective's all-reduce time) summed."""
    for key, value in stats.items():
        if key not in into:
            into[key] = value
        elif key.startswith("peak"):
            into[key] = max(into[key], value)
        else:
            into[key] += value


def merged_summary(segments: list[Segment]) -> dict[str, Any]:
    """`control.json`'s content over all `segments`: wall seconds and bytes through the driver
    summed, the driver's peak memory, the workers' stats merged; `steps`, the step ranges
    covered; `not_recorded`, those before the last covered step that no record holds (only
    when there are some); `decisions`, every runtime re-placement decision, by step; and one
    entry per segment in `segments`, with the settings it ran with."""
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
    summary["decisions"] = sorted((d for s in segments for d in s.decisions),
                                  key=lambda d: d["step"])  # fmt: skip
    summary["segments"] = [
        {"steps": [s.first_step + 1, s.last_step], "settings": s.settings, "wall_s": s.wall_s,
         "driver_peak_rss_mb": s.driver_peak_rss_mb, "bytes_moved": s.bytes_moved,
         "workers": s.workers, "decisions": s.decisions}
        for s in segments
    ]  # fmt: skip
    return summary
