"""The segment records a distributed run keeps in its folder (`yatt.control.segments`): a
damaged file is moved aside and never stops a run, records stay bounded however long a part
ran while keeping each device's busy time, a resume cuts phase time at the cut step's end, and
`plot_timeline` draws one collection per device and phase. No models, no Ray."""

import json
import logging
import math

import pytest
from matplotlib.axes import Axes

from yatt.control.segments import (
    MAX_SPANS,
    SEGMENTS_BAD_FILE,
    SEGMENTS_FILE,
    Segment,
    compact_events,
    coverage_text,
    cut_segments,
    load_segments,
    merged_spans,
    merged_summary,
    save_segments,
)
from yatt.control.timeline import Span, _busy_s, idle_fractions, plot_timeline, spans_from_events

PHASES = [("sampler", "gen"), ("sampler", "behaviour_logp"), ("reward", "reward"),
          ("policy", "update_actor"), ("sampler", "load_weights")]  # fmt: skip


def _record(**changes) -> dict:
    """A valid record in the file's form (two steps, one device), with `changes`."""
    record = {
        "first_step": 0, "step_end_s": [1001.0, 1002.0], "start_s": 1000.0, "wall_s": 2.0,
        "n_devices": 1, "driver_peak_rss_mb": 50.0, "bytes_moved": 20,
        "step_bytes": [10.0, 20.0], "workers": {"rank0": {"peak_rss_mb": 100.0}},
        "events": [[0, "sampler", "gen", [1000.1, 1001.1], [1000.9, 1001.9]]],
    }  # fmt: skip
    record.update(changes)
    return record


def _event(**changes) -> list:
    """Records whose one event entry has `changes` (device, starts, ends)."""
    entry = [changes.get("device", 0), "sampler", "gen", changes.get("starts", [1000.1]),
             changes.get("ends", [1000.9])]  # fmt: skip
    return [_record(events=[entry])]


DAMAGED = {
    "torn": ('[{"first_step": 0, "step_end_s": [1', "JSONDecodeError"),
    "not utf-8": (b"[\x80]", "UnicodeDecodeError"),
    "not a list": (json.dumps(_record()), "not a list"),
    "missing field": (json.dumps([{"first_step": 0}]), "missing"),
    "unknown field": (json.dumps([_record(colour="red")]), "unknown fields ['colour']"),
    "string first_step": (json.dumps([_record(first_step="3")]), "first_step"),
    "fractional first_step": (json.dumps([_record(first_step=1.5)]), "first_step"),
    "negative first_step": (json.dumps([_record(first_step=-1)]), "first_step"),
    "bool n_devices": (json.dumps([_record(n_devices=True)]), "n_devices"),
    "string time": (json.dumps([_record(wall_s="2.0")]), "wall_s"),
    "nan time": (json.dumps([_record(start_s=math.nan)]), "start_s"),
    "infinite step end": (json.dumps([_record(step_end_s=[1001.0, math.inf])]), "step_end_s"),
    "int too large": (json.dumps([_record(wall_s=10**400)]), "wall_s"),
    "step_end_s a string": (json.dumps([_record(step_end_s="12")]), "step_end_s"),
    "step_bytes short": (json.dumps([_record(step_bytes=[10.0])]), "step_bytes"),
    "workers not of dicts": (json.dumps([_record(workers={"rank0": 5})]), "workers"),
    "worker stat a string": (json.dumps([_record(workers={"r": {"peak": "x"}})]), "workers"),
    "events an object": (json.dumps([_record(events={"0": []})]), "events"),
    "event too short": (json.dumps([_record(events=[[0, "sampler", "gen", 1.0]])]), "events[0]"),
    "fractional device": (json.dumps(_event(device=0.5)), "device"),
    "string device": (json.dumps(_event(device="0")), "device"),
    "string start": (json.dumps(_event(starts=["1000.1"])), "start"),
    "starts and ends differ": (json.dumps(_event(ends=[1000.9, 1001.9])), "1 starts but 2"),
    "event ends first": (json.dumps(_event(starts=[1000.9], ends=[1000.1])), "ends before"),
    "old form ends first": (json.dumps([_record(events=[[0, "s", "gen", 5.0, 4.0]])]), "ends"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_record_file_is_moved_aside_with_one_warning(case, tmp_path, caplog):
    content, problem = DAMAGED[case]
    path = tmp_path / SEGMENTS_FILE
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with caplog.at_level(logging.WARNING, logger="yatt.control.segments"):
        assert load_segments(tmp_path) == []
    assert not path.exists()  # a later save cannot overwrite the evidence
    assert (tmp_path / SEGMENTS_BAD_FILE).read_bytes() == (
        content if isinstance(content, bytes) else content.encode())  # fmt: skip
    [record] = caplog.records
    message = record.getMessage()
    assert "\n" not in message and problem in message
    assert f"moved it to {SEGMENTS_BAD_FILE}" in message


def test_the_valid_record_the_damaged_cases_start_from_loads(tmp_path):
    (tmp_path / SEGMENTS_FILE).write_text(json.dumps([_record()]))
    [segment] = load_segments(tmp_path)
    assert segment.events == [(0, "sampler", "gen", 1000.1, 1000.9),
                              (0, "sampler", "gen", 1001.1, 1001.9)]  # fmt: skip
    assert not (tmp_path / SEGMENTS_BAD_FILE).exists()


def _resume_as_run_py_does(run_dir, step: int, new: Segment) -> dict:
    """What fit_distributed does with the records when it resumes in place at `step` and the
    part then ends: cut and save the earlier records, add the new part's, save, plot, sum."""
    earlier = cut_segments(load_segments(run_dir), step)
    save_segments(run_dir, earlier)
    segments = [*earlier, new]
    save_segments(run_dir, segments)
    spans, marks = merged_spans(segments)
    n_devices = max(segment.n_devices for segment in segments)
    plot_timeline(spans, n_devices, run_dir / "timeline.png", coverage_text(segments), marks)
    return merged_summary(segments)


OLD_FORM = [[0, "sampler", "gen", 1000.1, 1000.9]]  # one event a list, as the first version
RUN_BREAKERS = {  # records the first version loaded, and then crashed on
    "string first_step": ([_record(first_step="0", events=OLD_FORM)], 1),  # the cut
    "event ends first": ([_record(events=[[0, "sampler", "gen", 1000.5, 1000.2]])], 1),  # the end
    "step_bytes short": ([_record(step_end_s=[1001.0, 1002.0, 1003.0], step_bytes=[10.0],
                                  events=OLD_FORM)], 2),  # the cut
}  # fmt: skip


@pytest.mark.parametrize("case", RUN_BREAKERS)
def test_a_damaged_record_file_does_not_stop_the_resumed_run_or_the_next(case, tmp_path):
    records, step = RUN_BREAKERS[case]
    (tmp_path / SEGMENTS_FILE).write_text(json.dumps(records))
    new = Segment(first_step=step, step_end_s=[2001.0], start_s=2000.0, wall_s=1.0, n_devices=1,
                  events=[(0, "sampler", "gen", 2000.1, 2000.9)])  # fmt: skip
    summary = _resume_as_run_py_does(tmp_path, step, new)
    assert summary["steps"] == [[step + 1, step + 1]]
    assert summary["not_recorded"] == [[1, step]]
    assert json.loads((tmp_path / SEGMENTS_BAD_FILE).read_text()) == records
    later = Segment(first_step=step + 1, step_end_s=[3001.0], start_s=3000.0, wall_s=1.0,
                    n_devices=1)  # fmt: skip
    assert _resume_as_run_py_does(tmp_path, step + 1, later)["steps"] == [[step + 1, step + 2]]


def test_records_of_earlier_versions_load(tmp_path):
    old = _record(events=[[0, "sampler", "gen", 1000.1, 1000.9], [0, "sampler", "gen", 1000.9,
                                                                   1001.5]])  # fmt: skip
    (tmp_path / SEGMENTS_FILE).write_text(json.dumps([old]))
    [segment] = load_segments(tmp_path)
    assert segment.events == [(0, "sampler", "gen", 1000.1, 1001.5)]  # touching: one span


def test_the_file_holds_one_start_and_one_end_array_per_device_role_and_phase(tmp_path):
    two = list(enumerate(PHASES[:2]))
    events = [(d, role, phase, 10.0 * i + k, 10.0 * i + k + 0.5)
              for i in range(3) for d in (1, 0) for k, (role, phase) in two]  # fmt: skip
    segment = Segment(first_step=0, step_end_s=[10.0, 20.0, 30.0], start_s=0.0, wall_s=30.0,
                      n_devices=2, events=events)  # fmt: skip
    save_segments(tmp_path, [segment])
    [item] = json.loads((tmp_path / SEGMENTS_FILE).read_text())
    assert item["events"] == [
        [0, "sampler", "behaviour_logp", [1.0, 11.0, 21.0], [1.5, 11.5, 21.5]],
        [0, "sampler", "gen", [0.0, 10.0, 20.0], [0.5, 10.5, 20.5]],
        [1, "sampler", "behaviour_logp", [1.0, 11.0, 21.0], [1.5, 11.5, 21.5]],
        [1, "sampler", "gen", [0.0, 10.0, 20.0], [0.5, 10.5, 20.5]],
    ]
    assert load_segments(tmp_path) == [segment]
    in_time_order = [(0, "sampler", "gen", 0.0, 0.5), (1, "sampler", "gen", 0.0, 0.5)]
    assert segment.events[:2] == in_time_order


def test_spans_of_one_device_role_and_phase_that_overlap_or_touch_become_one():
    events = [(0, "p", "gen", 0.0, 1.0), (0, "p", "gen", 1.0, 2.0), (0, "p", "gen", 1.5, 3.0),
              (0, "p", "reward", 3.0, 4.0), (0, "q", "gen", 3.0, 4.0), (1, "p", "gen", 0.0, 1.0),
              (0, "p", "gen", 5.0, 4.0)]  # fmt: skip
    assert compact_events(events) == [
        (1, "p", "gen", 0.0, 1.0), (0, "p", "gen", 0.0, 3.0), (0, "p", "reward", 3.0, 4.0),
        (0, "q", "gen", 3.0, 4.0), (0, "p", "gen", 5.0, 5.0)]  # fmt: skip


def _long_part(n_devices: int, n_steps: int) -> list[tuple[int, str, str, float, float]]:
    """A part's events: per step and device the PHASES one after another with gaps, a
    colocated policy update on device 0 overlapping generation, uneven step times."""
    events, t = [], 1.7e9
    for step in range(n_steps):
        for d in range(n_devices):
            s = t + 0.01 * d
            for k, (role, phase) in enumerate(PHASES):
                length = 0.05 + 0.01 * ((step * 7 + d * 3 + k) % 5)
                events.append((d, role, phase, s, s + length))
                s += length + 0.02 * (k % 2)
            if d == 0:
                events.append((0, "policy", "train", t + 0.03, t + 0.08))  # overlaps gen
        t += 0.4 + 0.1 * (step % 3)
    return events


def _busy(events, key) -> dict:
    """Busy seconds (union) per `key(event)`."""
    grouped: dict = {}
    for event in events:
        grouped.setdefault(key(event), []).append((event[3], event[4]))
    return {k: _busy_s(v) for k, v in grouped.items()}


def _ends(events) -> list[float]:
    """Each device's first start and last end, device by device."""
    ends: dict = {}
    for d, _, _, start, end in events:
        first, last = ends.get(d, (start, end))
        ends[d] = (min(first, start), max(last, end))
    return [time for d in sorted(ends) for time in ends[d]]


def test_a_long_part_keeps_at_most_max_spans_and_each_devices_busy_time():
    events = _long_part(n_devices=4, n_steps=1500)  # 31,500 events
    compact = compact_events(events)
    assert len(events) > MAX_SPANS >= len(compact) > MAX_SPANS // 2
    by_phase, by_device = (lambda e: e[:3]), (lambda e: e[0])
    for key in (by_phase, by_device):
        assert _busy(compact, key) == pytest.approx(_busy(events, key), rel=1e-9, abs=1e-6)
    assert _ends(compact) == pytest.approx(_ends(events), rel=0, abs=1e-6)
    raw, kept = spans_from_events(events), spans_from_events(compact)
    assert idle_fractions(kept, 4) == pytest.approx(idle_fractions(raw, 4), abs=1e-9)
    assert compact_events(compact) == compact  # saving again loses nothing more


@pytest.mark.parametrize("max_spans", [1, 7, 60, 400])
def test_any_budget_keeps_each_devices_busy_time(max_spans):
    events = _long_part(n_devices=3, n_steps=40)
    compact = compact_events(events, max_spans)
    n_keys = len({event[:3] for event in events})
    assert len(compact) <= max(max_spans, 3 * n_keys)
    for key in ((lambda e: e[:3]), (lambda e: e[0])):
        assert _busy(compact, key) == pytest.approx(_busy(events, key), rel=1e-9, abs=1e-6)
    assert _ends(compact) == pytest.approx(_ends(events), rel=0, abs=1e-6)
    assert compact_events(compact, max_spans) == compact


def test_the_record_of_a_long_part_stays_small(tmp_path):
    events = _long_part(n_devices=8, n_steps=2000)  # 84,000 events: 5.3 MB written raw
    ends = sorted({event[4] for event in events})[::50]
    segment = Segment(first_step=0, step_end_s=ends, start_s=1.7e9, wall_s=1e3, n_devices=8,
                      events=events)  # fmt: skip
    assert len(segment.events) <= MAX_SPANS
    path = save_segments(tmp_path, [segment])
    assert path.stat().st_size < 1_100_000
    assert load_segments(tmp_path) == [segment]
    summary = merged_summary([segment])
    assert summary["steps"] == [[1, len(ends)]] and summary["wall_s"] == 1e3


def test_a_cut_keeps_no_phase_time_after_the_cut_steps_end():
    # async: generation for step 3 starts before step 2 ends, step 3's update after it
    events = [(0, "sampler", "gen", 1000.1, 1000.8), (1, "policy", "update_actor", 1000.8, 1001.0),
              (0, "sampler", "gen", 1001.1, 1001.7), (1, "policy", "update_actor", 1001.7, 1002.0),
              (0, "sampler", "gen", 1001.8, 1002.6), (1, "policy", "update_actor", 1002.6, 1003.0),
              (0, "sampler", "gen", 1002.7, 1002.9)]  # fmt: skip
    segment = Segment(first_step=0, step_end_s=[1001.0, 1002.0, 1003.0], start_s=1000.0,
                      wall_s=3.0, n_devices=2, events=events)  # fmt: skip
    [cut] = cut_segments([segment], 2)
    assert cut.last_step == 2 and cut.wall_s == pytest.approx(2.0)
    assert cut.events == [
        (0, "sampler", "gen", 1000.1, 1000.8), (1, "policy", "update_actor", 1000.8, 1001.0),
        (0, "sampler", "gen", 1001.1, 1001.7), (1, "policy", "update_actor", 1001.7, 1002.0),
        (0, "sampler", "gen", 1001.8, 1002.0)]  # fmt: skip
    assert max(event[4] for event in cut.events) == 1002.0


def _drawn(monkeypatch) -> list:
    calls = []
    real = Axes.broken_barh

    def spy(self, xranges, yrange, **kwargs):
        calls.append((list(xranges), yrange, kwargs.get("label")))
        return real(self, xranges, yrange, **kwargs)

    monkeypatch.setattr(Axes, "broken_barh", spy)
    return calls


def test_the_timeline_draws_one_collection_per_device_and_phase(tmp_path, monkeypatch):
    drawn = _drawn(monkeypatch)
    lines = []
    real_line = Axes.axvline
    monkeypatch.setattr(Axes, "axvline", lambda self, x, **kw: lines.append(x) or real_line(
        self, x, **kw))  # fmt: skip
    phases = ["gen", "reward", "sync"]
    spans = [Span(d, "r", phase, step + 0.3 * k, step + 0.3 * k + 0.2)
             for step in range(40) for d in range(2) for k, phase in enumerate(phases)]  # fmt: skip
    plot_timeline(spans, 2, tmp_path / "t.png", marks=[(20.0, "resumed at step 20")])
    assert [(yrange, label) for _, yrange, label in drawn] == [
        ((-0.4, 0.8), "gen"), ((-0.4, 0.8), "reward"), ((-0.4, 0.8), "sync"),
        ((0.6, 0.8), None), ((0.6, 0.8), None), ((0.6, 0.8), None)]  # fmt: skip
    assert sorted(x for xranges, _, _ in drawn for x in xranges) == sorted(
        (s.start_s, s.end_s - s.start_s) for s in spans)  # fmt: skip
    assert lines == [20.0]


def test_a_timeline_whose_spans_have_no_length_is_drawn(tmp_path):
    path = plot_timeline([Span(0, "r", "gen", 1.0, 1.0)], 1, tmp_path / "t.png")
    assert path.stat().st_size > 1000


def test_a_plan_run_twice_adds_its_stretches_worker_stats():
    # Runtime re-placement keys worker stats by plan: A -> B -> A used to keep A's second
    # stretch alone (each move's new collective starts its all-reduce seconds at 0).
    from yatt.control.segments import merge_stats

    into: dict[str, float] = {}
    merge_stats(into, {"peak_rss_mb": 900.0, "allreduce_s": 1.5})
    merge_stats(into, {"peak_rss_mb": 700.0, "allreduce_s": 0.5})
    assert into == {"peak_rss_mb": 900.0, "allreduce_s": 2.0}
