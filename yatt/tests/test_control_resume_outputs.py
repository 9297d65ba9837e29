"""What a distributed run resumed in place shows of its earlier parts (in-process backend, one
device): the progress callback starts at the resumed step, as the trainer's bar does, and
`timeline.png` and `control.json` cover every part of the run that left a record, naming the
steps they cover and those no record holds (`yatt.control.segments`)."""

import json

import pytest

import yatt.control.timeline
from yatt.config import load_config
from yatt.control import ControlConfig, fit_distributed
from yatt.control.segments import (
    SEGMENTS_BAD_FILE,
    SEGMENTS_FILE,
    Segment,
    coverage_text,
    cut_segments,
    load_segments,
    merged_spans,
    merged_summary,
    save_segments,
    settings_text,
    step_ranges,
)

OVERRIDES = ["algo.prompts_per_step=1", "rollout.n_samples=2", "rollout.max_new_tokens=4",
             "data.n_train=8", "data.n_heldout=0", "eval.n=0", "checkpoint.every=1",
             "checkpoint.keep_last=3"]  # fmt: skip
CONTROL = ControlConfig(backend="inprocess", n_devices=1, device_kind="cpu",
                        extra_rewards=("yatt.control.workload:char_mix_reward",))  # fmt: skip


def test_a_resumed_run_reports_progress_and_outputs_over_all_its_parts(tmp_path, monkeypatch):
    plotted: list[tuple] = []
    real_plot = yatt.control.timeline.plot_timeline

    def plot(spans, n_devices, path, title="timeline", marks=()):
        plotted.append((list(spans), title, list(marks)))
        return real_plot(spans, n_devices, path, title, marks)

    monkeypatch.setattr(yatt.control.timeline, "plot_timeline", plot)
    run = [*OVERRIDES, f"logging.run_dir={tmp_path}"]
    fit_distributed(load_config("tiny_test", [*run, "train.steps=2"]), CONTROL)
    first_part = load_segments(tmp_path)
    assert [(s.first_step, s.last_step) for s in first_part] == [(0, 2)]
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    seen: list[tuple[int, int, dict]] = []
    resumed = load_config("tiny_test", [*run, "train.steps=3", "checkpoint.resume=latest"])
    fit_distributed(resumed, CONTROL, lambda step, total, row: seen.append((step, total, row)))

    assert [(step, total) for step, total, _ in seen] == [(2, 3), (3, 3)]  # not 0 first
    assert seen[0][2]["critic/score/mean"] == logged[1]["critic/score/mean"]  # step 2's row
    summary = json.loads((tmp_path / "control.json").read_text())
    assert summary["steps"] == [[1, 3]] and "not_recorded" not in summary
    assert [part["steps"] for part in summary["segments"]] == [[1, 2], [3, 3]]
    assert summary["wall_s"] == pytest.approx(sum(p["wall_s"] for p in summary["segments"]))
    spans, title, marks = plotted[-1]
    assert title == "parallel controllers, colocate, 1 device, steps 1-3"
    assert [part["settings"] for part in summary["segments"]] == [title[:-11]] * 2
    assert summary["decisions"] == []  # no runtime re-placement asked for
    assert [label for _, label in marks] == ["resumed at step 2"]
    resumed_s = marks[0][0]  # the first part's spans, then the resumed part's
    before = [span for span in spans if span.end_s <= resumed_s]
    after = [span for span in spans if span.start_s >= resumed_s]
    assert len(before) == len(first_part[0].events) and after
    assert len(before) + len(after) == len(spans)
    assert (tmp_path / "timeline.png").stat().st_size > 1000


def _segment(first_step: int, n_steps: int, start_s: float, **changes) -> Segment:
    """A segment of steps first_step+1.. whose step i takes 1 s and one 'gen' event."""
    ends = [start_s + 1.0 + i for i in range(n_steps)]
    events = [(0, "policy", "gen", end - 0.9, end - 0.1) for end in ends]
    return Segment(first_step=first_step, step_end_s=ends, start_s=start_s,
                   wall_s=float(n_steps), n_devices=1, bytes_moved=10 * n_steps,
                   step_bytes=[10.0 * (i + 1) for i in range(n_steps)], events=events,
                   workers={"rank0": {"peak_rss_mb": 100.0 + first_step, "allreduce_s": 1.0}},
                   **changes)  # fmt: skip


def test_a_resume_cuts_earlier_parts_at_its_step_and_drops_later_ones():
    first, second = _segment(0, 10, 1000.0), _segment(10, 5, 5000.0)
    kept = cut_segments([first, second], 6)
    assert [(s.first_step, s.last_step) for s in kept] == [(0, 6)]
    assert kept[0].wall_s == 6.0 and kept[0].bytes_moved == 60 and len(kept[0].events) == 6
    assert cut_segments([first, second], 15) == [first, second]
    assert cut_segments([first, second], 0) == []


def test_outputs_name_the_steps_no_record_holds():
    # steps 1-4 recorded, 5-8 ran in a part that crashed, 9-12 after its resume at step 8
    parts = [_segment(0, 4, 1000.0), _segment(8, 4, 9000.0)]
    assert step_ranges(parts) == [(1, 4), (9, 12)]
    assert coverage_text(parts) == "steps 1-4, 9-12 (5-8 not recorded)"
    summary = merged_summary(parts)
    assert summary["steps"] == [[1, 4], [9, 12]] and summary["not_recorded"] == [[5, 8]]
    assert summary["bytes_moved"] == 80 and summary["wall_s"] == 8.0
    assert summary["workers"] == {"rank0": {"peak_rss_mb": 108.0, "allreduce_s": 2.0}}
    assert coverage_text([_segment(3, 2, 0.0)]) == "steps 4-5 (1-3 not recorded)"


def test_parts_are_laid_end_to_end_on_the_timeline():
    parts = [_segment(0, 2, 1000.0), _segment(2, 2, 9000.0)]  # 8000 s apart: down meanwhile
    spans, marks = merged_spans(parts)
    assert [(round(s.start_s, 6), round(s.end_s, 6)) for s in spans] == [
        (0.0, 0.8), (1.0, 1.8), (1.8, 2.6), (2.8, 3.6)]  # fmt: skip
    assert marks == [(pytest.approx(1.8), "resumed at step 2")]


def test_segment_records_round_trip_and_a_damaged_file_is_moved_aside(tmp_path, caplog):
    parts = [_segment(0, 3, 1000.0), _segment(3, 2, 2000.0)]
    save_segments(tmp_path, parts)
    assert load_segments(tmp_path) == parts
    torn = '[{"first_step": 0, "step_end_s": [1'
    (tmp_path / SEGMENTS_FILE).write_text(torn)
    assert load_segments(tmp_path) == []
    assert "damaged" in caplog.text and "\n" not in caplog.records[-1].getMessage()
    assert (tmp_path / SEGMENTS_BAD_FILE).read_text() == torn  # kept, not overwritten
    assert not (tmp_path / SEGMENTS_FILE).exists()
    (tmp_path / SEGMENTS_FILE).write_text(json.dumps([{"first_step": 0}]))  # not a record
    assert load_segments(tmp_path) == []
    assert "missing" in caplog.records[-1].getMessage()


def _moves(*steps: int) -> list[dict]:
    return [{"step": step, "from": "colocate(2)", "to": "partial(1/2)", "switch": True,
             "reason": f"why {step}"} for step in steps]  # fmt: skip


def test_settings_and_decisions_follow_the_parts_of_a_run(tmp_path):
    """Each part keeps the control settings it ran with and its re-placement decisions: the
    records round-trip, a resume cuts the decisions after its step, control.json lists them
    all, and a resume with other settings is named in the title and at its mark."""
    first = _segment(0, 4, 1000.0, settings="parallel controllers, colocate, 2 devices",
                     decisions=_moves(2, 4))  # fmt: skip
    second = _segment(3, 2, 2000.0, settings="one controller, colocate, 2 devices",
                      decisions=_moves(5))  # fmt: skip
    save_segments(tmp_path, [first, second])
    assert load_segments(tmp_path) == [first, second]
    kept = cut_segments([first, second], 3)
    assert [d["step"] for d in kept[0].decisions] == [2]
    summary = merged_summary([kept[0], second])
    assert [d["step"] for d in summary["decisions"]] == [2, 5]
    assert summary["segments"][1]["settings"] == "one controller, colocate, 2 devices"
    assert settings_text([first, second]) == (
        "settings changed on resume: parallel controllers, colocate, 2 devices / "
        "one controller, colocate, 2 devices"
    )
    assert settings_text([first, first]) == "parallel controllers, colocate, 2 devices"
    assert settings_text([_segment(0, 1, 0.0)]) == ""  # a record from before the field
    _, marks = merged_spans([first, second])
    assert marks[0][1] == "resumed at step 3 as one controller, colocate, 2 devices"


@pytest.mark.parametrize(
    "bad",
    [{"step": 0}, {"step": 2, "from": "a", "to": "b", "switch": "yes", "reason": ""}, "move"],
)
def test_a_damaged_decision_record_is_refused_like_any_field(tmp_path, caplog, bad):
    path = save_segments(tmp_path, [_segment(0, 1, 0.0)])
    record = json.loads(path.read_text())
    record[0]["decisions"] = [bad]
    path.write_text(json.dumps(record))
    assert load_segments(tmp_path) == []
    assert "decisions[0]" in caplog.records[-1].getMessage()
