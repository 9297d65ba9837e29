"""The re-placement ceiling survey (yatt/bench/placement_ceiling.py): its plan model and its
ceilings on synthetic phase costs, and a quick run on a real worker."""

import json
import os

import pytest

NO_SYNC = {"push": 0.0, "load": 0.0}


@pytest.fixture
def survey(bench_script):
    return bench_script("placement_ceiling")


def test_each_plan_step_comes_from_the_phases_on_one_core_and_on_two(survey):
    one, two = {"gen": 3.0, "update": 2.0}, {"gen": 2.0, "update": 1.25}
    steps = survey.plan_steps(one, two, {"push": 0.5, "load": 0.25})
    assert steps == {"colocate": 3.25, "disaggregated": 3.25, "partial": 5.0}
    # a push longer than sampling is longer than updating puts the trainer on the path
    slow_push = survey.plan_steps(one, two, {"push": 1.5, "load": 0.25})
    assert slow_push["disaggregated"] == 3.5


def _shape(survey, samples, short_one, short_two, long_one, long_two):
    points = [
        {"budget": budget, "steps": survey.plan_steps(one, two, NO_SYNC)}
        for budget, one, two in ((1, short_one, short_two), (96, long_one, long_two))
    ]
    return {"samples": samples, "points": points}


def test_a_shape_flips_only_when_different_plans_win_the_two_lengths(survey):
    # short: the update dominates and colocation runs it on both cores; long: sampling and
    # updating balance, and disaggregation overlaps them
    flipping = _shape(
        survey,
        3,
        {"gen": 0.1, "update": 1.0}, {"gen": 0.08, "update": 0.6},
        {"gen": 5.0, "update": 5.0}, {"gen": 3.8, "update": 3.2},
    )  # fmt: skip
    # disaggregation wins both lengths
    steady = _shape(
        survey,
        6,
        {"gen": 0.5, "update": 0.6}, {"gen": 0.4, "update": 0.5},
        {"gen": 5.0, "update": 5.0}, {"gen": 3.8, "update": 3.2},
    )  # fmt: skip
    rows = survey.ceilings([flipping, steady], [1], [96])
    assert [(r["samples"], r["fastest_short"], r["fastest_long"]) for r in rows] == [
        (3, "colocate", "disaggregated"),
        (6, "disaggregated", "disaggregated"),
    ]
    assert rows[0]["ceiling"] > 0.05
    assert rows[1]["ceiling"] == 0.0


def test_a_short_budget_not_below_the_long_one_makes_no_pair(survey):
    shape = _shape(survey, 3, *[{"gen": 1.0, "update": 1.0}] * 4)
    rows = survey.ceilings([shape], [1, 96], [96])
    assert [(row["short"], row["long"]) for row in rows] == [(1, 96)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="compares one core with two")
def test_a_quick_survey_writes_its_section_json_and_plot(survey, tmp_path, monkeypatch):
    for key in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(key, raising=False)  # main(argv) does not run itself again
    assert survey.main(["--quick", "--out-dir", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "yatt_placement_ceiling.json").read_text())
    assert [shape["samples"] for shape in record["shapes"]] == [2]
    point = record["shapes"][0]["points"][0]
    assert point["one"]["gen"] > 0 and point["two"]["update"] > 0
    assert record["shapes"][0]["sync"]["push"] > 0
    assert len(record["ceilings"]) == 1
    section = (tmp_path / "yatt_placement_ceiling.md").read_text()
    assert "| 2 | 1 | 8 |" in section and "Highest ceiling" in section
    assert "without the Ray CPU workers' malloc settings" in section  # (not run as a script)
    assert (tmp_path / "yatt_placement_ceiling.png").stat().st_size > 0


def test_a_tagged_survey_names_its_files_and_its_command(survey, capsys):
    from types import SimpleNamespace

    args = SimpleNamespace(tag="lora", task="addition", samples=[3, 6], short=[4], long=[96],
                           lora_rank=8)  # fmt: skip
    assert survey._suffix(args) == "_lora"
    assert survey._command(args) == (
        "python yatt/bench/placement_ceiling.py --task addition --samples 3,6 --short 4 "
        "--long 96 --lora-rank 8 --tag lora"
    )
    assert survey._command(SimpleNamespace(tag="")) == "python yatt/bench/placement_ceiling.py"
    with pytest.raises(SystemExit):
        survey.main(["--tag", "a/b"])
    assert "must be letters and digits" in capsys.readouterr().err
