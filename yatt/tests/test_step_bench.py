"""yatt/bench/step.py's report: what it draws beside yatt's steps says how it was measured."""

import pytest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("step")


_HOST = {"cpus": 2, "torch": "2.13.0+cpu", "load_avg_1m": 1.0, "git_commit": "abc"}


def _result(bench) -> dict:
    return {
        "variant": "default", "steps": 3, "step_s_mean": 2.0, "step_s_median": 2.0,
        "step_cpu_s_mean": 1.9, "phase_s_mean": dict.fromkeys(bench.PHASES, 0.2),
        "trained_rows_frac": 0.5,
    }  # fmt: skip


def _run(threads: int, trl_threads: int) -> dict:
    return {"command": "python yatt/bench/step.py", "threads": threads, "warmup": 2,
            "shape": "tiny", "trl_reference": {"step_s_median": 5.0, "steps": 40,
                                               "threads": trl_threads}}  # fmt: skip


def test_a_trl_line_at_other_thread_counts_is_called_a_landmark(bench, tmp_path):
    """The committed chart drew TRL at 2 threads beside yatt at 1 with no word of it."""
    text = bench._markdown([_result(bench)], _HOST, _run(1, 2))
    assert "1 torch thread:" in text and "(40 steps, 2 torch threads)" in text
    assert "It ran at 2 torch threads and these variants at 1 torch thread" in text
    bench._plot([_result(bench)], tmp_path / "step.png", _run(1, 2))
    assert (tmp_path / "step.png").stat().st_size > 0


def test_a_trl_line_at_the_same_thread_count_needs_no_caveat(bench):
    text = bench._markdown([_result(bench)], _HOST, _run(2, 2))
    assert "2 torch threads:" in text and "landmark" not in text
    assert "torch threads: all CPUs" in bench._markdown([_result(bench)], _HOST, _run(0, 2))


def test_from_json_writes_the_report_of_a_saved_run_again(bench, tmp_path):
    import json

    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"host": _HOST, "run": _run(1, 2), "results": [_result(bench)]}))
    assert bench.main(["--from-json", str(saved), "--out-dir", str(tmp_path / "out")]) == 0
    assert "landmark" in (tmp_path / "out" / "yatt_step.md").read_text()
    assert (tmp_path / "out" / "yatt_step.png").exists()
    assert not (tmp_path / "out" / "yatt_step.json").exists()
