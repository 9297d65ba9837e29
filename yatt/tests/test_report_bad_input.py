"""`yatt report` on damaged or odd run folders: a metric value that is not a number, a metrics
file named in place of its folder, NaN and infinite values, a file whose only line is garbage.
Bad input is one `yatt: error:` line (exit 2) without a traceback; odd values leave the rest
of the report working."""

import io
import json
import re

import pytest

from yatt.cli import main
from yatt.errors import DataError
from yatt.report import load_history, summary_table, write_plots

_LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO|WARNING) ")


def _step_row(step: int, reward: object, **extra: object) -> dict:
    return {"step": step, "critic/score/mean": reward, "timing_s/step": 1.0,
            "timing_s/gen": 0.5, "perf/throughput": 40.0, **extra}  # fmt: skip


def _write(folder, rows: list, name: str = "metrics.jsonl") -> None:
    (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))


def _one_error_line(err: str) -> str:
    """The single non-log line of stderr, which must be yatt's one-line error."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not _LOG_LINE.match(line)]
    assert len(lines) == 1, err
    assert lines[0].startswith("yatt: error: ")
    return lines[0]


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if " WARNING " in line[:20]]


# 1. metric values that are not numbers


def test_a_string_metric_value_is_left_out_with_one_warning_naming_file_line_and_key(
    tmp_path, capsys
) -> None:
    rows = [_step_row(1, "abc"), _step_row(2, 0.5), _step_row(3, 0.7, **{"perf/x": [1]})]
    _write(tmp_path, rows)
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    warnings = _warnings(err)
    assert len(warnings) == 1, err
    assert str(tmp_path / "metrics.jsonl") in warnings[0]
    assert "line 1, key 'critic/score/mean': 'abc' is not a number" in warnings[0]
    assert "(and 1 more)" in warnings[0]  # the list in line 3
    assert "yatt run summary" in err
    assert re.search(r"reward \(last 1 steps\)\s*│\s*0\.700", err), err
    assert re.search(r"steps\s*│\s*3 ", err), err


def test_a_step_window_without_any_numeric_reward_shows_n_a(tmp_path, capsys) -> None:
    _write(tmp_path, [_step_row(1, "abc"), _step_row(2, None)])
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"reward \(first 1 steps\)\s*│\s*n/a", err), err
    assert re.search(r"reward \(last 1 steps\)\s*│\s*n/a", err), err


def test_an_sft_run_with_string_values_still_reports(tmp_path, capsys) -> None:
    rows = [{"step": step, "sft/loss": 2.0, "sft/epoch": step / 4, "timing_s/step": 0.5}
            for step in range(1, 11)]  # fmt: skip
    rows[0]["sft/loss"] = "oops"
    rows[-1]["sft/epoch"] = "two"
    _write(tmp_path, rows, "sft_metrics.jsonl")
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "yatt sft summary" in err
    assert "line 1, key 'sft/loss'" in err
    assert re.search(r"epochs over the training set\s*│\s*2\.25", err), err  # the last number


# 2. a metrics file named in place of its run folder


@pytest.mark.parametrize("name", ["metrics.jsonl", "sft_metrics.jsonl"])
def test_a_metrics_file_in_place_of_its_folder_reports_that_folder(tmp_path, capsys, name) -> None:
    if name == "metrics.jsonl":
        _write(tmp_path, [_step_row(1, 0.25), _step_row(2, 0.75)])
        title, plots = "yatt run summary", ["rewards.png", "timing.png"]
    else:
        rows = [{"step": s, "sft/loss": 1.5, "sft/epoch": 1.0, "sft/lr": 1e-3,
                 "timing_s/step": 0.5} for s in (1, 2)]  # fmt: skip
        _write(tmp_path, rows, name)
        title, plots = "yatt sft summary", ["loss.png"]
    assert main(["report", str(tmp_path / name)]) == 0
    err = capsys.readouterr().err
    assert "no such folder" not in err and title in err
    assert all((tmp_path / plot).stat().st_size > 1000 for plot in plots)


def test_the_metrics_file_of_a_distributed_run_shows_its_control_record_too(tmp_path, capsys):
    _write(tmp_path, [_step_row(1, 0.5)])
    (tmp_path / "control.json").write_text("{")  # read (and named as damaged) beside the file
    assert main(["report", str(tmp_path / "metrics.jsonl"), "--no-plots"]) == 0
    assert f"{tmp_path / 'control.json'}: cannot read it" in capsys.readouterr().err


def test_another_file_in_place_of_a_run_folder_is_one_line(tmp_path, capsys) -> None:
    other = tmp_path / "config.yaml"
    other.write_text("train: {}\n")
    assert main(["report", str(other), "--no-plots"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{other} is a file, not a run folder" in line


# 3. NaN and infinite values


def test_nan_and_infinite_values_show_readably_and_means_use_the_finite_ones(
    tmp_path, capsys
) -> None:
    lines = [
        '{"step": 0, "eval/accuracy": NaN}',
        '{"step": 1, "eval/accuracy": Infinity}',
        '{"step": 2, "eval/accuracy": "nan"}',  # as the metrics sink writes a NaN
        json.dumps(_step_row(1, float("nan"))),
        json.dumps(_step_row(2, 0.5, **{"timing_s/step": "inf"})),
        json.dumps(_step_row(3, "-inf")),
        json.dumps(_step_row(4, 0.25)),
        '{"step": 5, "eval/accuracy": 0.5}',
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "nan%" not in err and "inf%" not in err
    assert "nan @ step 0" in err and "inf @ step 1" in err and "nan @ step 2" in err
    assert "50.0% @ step 5" in err
    assert re.search(r"reward \(first 1 steps\)\s*│\s*nan ", err), err
    assert re.search(r"reward \(last 1 steps\)\s*│\s*0\.250 ", err), err
    assert re.search(r"timing_s/step \(mean\)\s*│\s*1\.000 \(1 nan/inf left out\)", err), err
    assert not _warnings(err)  # "nan" and "inf" strings are numbers, not bad values


def test_summary_table_of_an_in_process_history_with_nan() -> None:
    from rich.console import Console

    history = [_step_row(step, 0.5 if step % 2 else float("nan")) for step in range(1, 9)]
    history.append({"step": 8, "eval/accuracy": float("inf")})
    console = Console(width=120, file=io.StringIO())
    console.print(summary_table(history, [(8, float("inf"))]))
    text = console.file.getvalue()
    assert "inf @ step 8" in text
    assert re.search(r"reward \(first 2 steps\)\s*│\s*0\.500 \(1 nan/inf left out\)", text), text


def test_plots_leave_out_nan_and_infinite_values(tmp_path) -> None:
    # filterwarnings=error: a matplotlib warning on a non-finite bar or axis fails this test
    history = [_step_row(1, float("nan"), **{"timing_s/gen": float("inf")}),
               _step_row(2, float("-inf")), _step_row(3, 0.5),
               {"step": 3, "eval/accuracy": float("nan")}]  # fmt: skip
    paths = write_plots(history, tmp_path)
    assert [path.name for path in paths] == ["rewards.png", "timing.png"]
    assert all(path.stat().st_size > 1000 for path in paths)


def test_a_plot_that_cannot_be_written_is_one_warning_and_the_report_stands(
    tmp_path, capsys, caplog
) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(_step_row(step, 0.5)) + "\n" for step in (1, 2))
    )
    (tmp_path / "rewards.png").mkdir()  # a name the plot cannot be written under
    assert main(["report", str(tmp_path)]) == 0
    assert "could not write" in caplog.text and "rewards.png" in caplog.text
    assert (tmp_path / "timing.png").stat().st_size > 1000  # the other plot is written


def test_a_non_finite_step_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": NaN, "critic/score/mean": 0.5}\n')
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{tmp_path / 'metrics.jsonl'}: line 1: step nan is not a step number" in line


# 4. damaged lines versus an empty file and a torn last line


@pytest.mark.parametrize(
    ("text", "line_number"),
    [
        ("garbage\n", 1),
        ("garbage", 1),  # no newline, but no start of a JSON object either
        ("\n\nnot json at all\n", 3),  # named by its line in the file
        ('{"step": 1, "critic/sc\n', 1),  # a whole (newline-ended) line: not torn
        ('{"critic/score/mean": 0.5}', 1),  # a whole JSON object without a step
        ("[1, 2", 1),
        ('{"step": 1, "critic/score/mean": 0.5}\n\x00\x00\x00', 2),  # garbage after a row
    ],
)
def test_a_damaged_line_is_named_in_one_line(tmp_path, capsys, text, line_number) -> None:
    (tmp_path / "metrics.jsonl").write_text(text)
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{tmp_path / 'metrics.jsonl'}: line {line_number} is damaged" in line
    assert "no metrics rows yet" not in line
    with pytest.raises(DataError, match=f"line {line_number} is damaged"):
        load_history(tmp_path)


@pytest.mark.parametrize("text", ["", "\n\n", '{"step": 1, "critic/sc'])
def test_an_empty_or_only_torn_file_still_holds_no_rows_yet(tmp_path, capsys, text) -> None:
    (tmp_path / "metrics.jsonl").write_text(text)
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{tmp_path / 'metrics.jsonl'} holds no metrics rows yet" in line


def test_a_torn_last_line_after_rows_is_left_out_with_a_warning(tmp_path, capsys) -> None:
    text = json.dumps(_step_row(1, 0.5)) + "\n" + '{"step": 2, "critic/sc'
    (tmp_path / "metrics.jsonl").write_text(text)
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "its last line is torn" in err and "yatt run summary" in err
    assert re.search(r"steps\s*│\s*1 ", err), err


@pytest.mark.parametrize(
    "rows",
    [[{"step": 0, "eval/accuracy": 0.125}],  # a run stopped before its first step
     [{"step": 1, "timing_s/step": 1.0}]],  # a step with no phase times and no reward
)  # fmt: skip
def test_plots_of_a_run_with_nothing_to_draw_warn_nothing(tmp_path, rows) -> None:
    """Where a panel has nothing to draw it says so, not matplotlib's warning (two lines of
    Python on a user's console) about a legend with no entries."""
    import warnings

    from yatt.common.plots import plot_rewards, plot_timings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_rewards(rows, tmp_path / "rewards.png")
        plot_timings(rows, tmp_path / "timing.png")
    assert (tmp_path / "timing.png").stat().st_size > 0
