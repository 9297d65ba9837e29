"""CLI: bad arguments, configs and model names print exactly one line on stderr and exit 2,
without a traceback; `python -m yatt` behaves the same as a real process."""

import shutil
import signal
import subprocess
import sys
import time

import pytest

from yatt.checkpoint import list_checkpoints
from yatt.cli import main


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["train", "tiny_test", "rollout.nsamples=3"], "rollout.nsamples"),
        (["train", "tiny_test", "train.steps=abc"], "train.steps"),
        (["train", "no_such_preset"], "no_such_preset"),
        (["train", "tiny_test", "novalue"], "novalue"),
        (["train", "tiny_test", "=5"], "override '=5' must look like section.key=value"),
        (["eval", __file__], "is a file; name the folder of a model"),
        (["models", "prepare", "gpt17"], "gpt17"),
        (["train"], "config"),
        (["frobnicate"], "frobnicate"),
        (["eval", "/no/such/folder"], "/no/such/folder"),
        (["demo", "algo.name=sac"], "sac"),
        (["train", "tiny_test", "data.path=/no/such/prompts.jsonl"], "/no/such/prompts.jsonl"),
        (["report", "/no/such/run"], "/no/such/run: no such folder"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, fragment, capsys) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if not _is_log_line(line)]
    assert len(errors) == 1, captured.err
    assert errors[0].startswith("yatt: error:")
    assert fragment in errors[0]
    assert "Traceback" not in captured.err


def _is_log_line(line: str) -> bool:
    """INFO lines from the logging set-up ('HH:MM:SS LEVEL module [rank N] ...')."""
    return " INFO " in line[:20]


def test_process_exit_code_and_stderr() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yatt", "train", "tiny_test", "algo.loss_agg=sum"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "algo.loss_agg" in lines[0]


def test_report_summarises_a_run_folder_and_draws_its_plots(tmp_path, capsys) -> None:
    import json

    rows = [{"step": 0, "eval/accuracy": 0.25}]
    for step in range(1, 9):
        rows.append({"step": step, "critic/score/mean": step / 10, "timing_s/step": 2.0,
                     "timing_s/gen": 1.5, "perf/throughput": 40.0})  # fmt: skip
    rows.append({"step": 8, "eval/accuracy": 0.5})
    lines = [json.dumps(row) for row in rows] + ['{"step": 9, "critic/sc']  # torn last line
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    assert main(["report", str(tmp_path)]) == 0
    table = capsys.readouterr().err
    assert "25.0% @ step 0" in table and "50.0% @ step 8" in table
    assert "0.150" in table and "0.750" in table  # reward over the first and last 2 steps
    assert (tmp_path / "rewards.png").stat().st_size > 1000
    assert (tmp_path / "timing.png").stat().st_size > 1000
    lines.insert(2, "not json")  # damage before the last line is an error naming the row
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    assert "row 3" in capsys.readouterr().err


def test_report_of_a_distributed_run_shows_its_control_record(tmp_path, capsys) -> None:
    import json

    from yatt.control.segments import Segment, merged_summary

    rows = [{"step": step, "critic/score/mean": 0.5, "timing_s/step": 1.0,
             "perf/throughput": 40.0} for step in (1, 2, 3)]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    move = {"step": 3, "from": "colocate(2)", "to": "partial(1/2)", "switch": True,
            "reason": "move to partial(1/2): ..."}  # fmt: skip
    parts = [
        Segment(0, [1.0, 2.0], 0.0, 2.0, 2, 512.0, 2048, settings="parallel controllers, colocate"),
        Segment(2, [3.0], 2.0, 1.0, 2, 256.0, 1024, settings="one controller, colocate",
                decisions=[move]),
    ]  # fmt: skip
    (tmp_path / "control.json").write_text(json.dumps(merged_summary(parts)))
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    table = capsys.readouterr().err
    assert "distributed run (control.json)" in table
    assert "steps 1-2" in table and "parallel controllers, colocate" in table
    assert "steps 3-3" in table and "one controller, colocate" in table
    assert "3,072" in table and "512 MiB" in table  # bytes summed, the driver's peak
    assert "move before step 3" in table and "colocate(2) -> partial(1/2)" in table
    (tmp_path / "control.json").write_text("{")  # damaged: named, the metrics still shown
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "control.json: cannot read it" in err and "yatt run summary" in err


def test_report_of_a_run_without_rows_is_an_error(tmp_path, capsys) -> None:
    # An empty or only-torn metrics file once printed an empty table and succeeded.
    for text in ("", '{"step": 1, "critic/sc'):
        (tmp_path / "metrics.jsonl").write_text(text)
        assert main(["report", str(tmp_path), "--no-plots"]) == 2
        err = capsys.readouterr().err
        assert f"yatt: error: {tmp_path / 'metrics.jsonl'} holds no metrics rows yet" in err


def test_report_summarises_an_sft_run_folder(tmp_path, capsys) -> None:
    import json

    rows = [{"step": step, "sft/loss": 2.0 - step / 10, "sft/epoch": step / 4, "sft/lr": 1e-3,
             "timing_s/step": 0.5} for step in range(1, 11)]  # fmt: skip
    rows[-1]["sft/heldout_loss"] = 1.25
    (tmp_path / "sft_metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["report", str(tmp_path)]) == 0
    table = capsys.readouterr().err
    assert "yatt sft summary" in table
    assert "train loss, first 1 steps (mean)" in table and "1.9000" in table
    assert "train loss, last 1 steps (mean)" in table and "1.0000" in table
    assert "held-out loss at step 10" in table and "1.2500" in table
    assert "2.50" in table  # epochs
    assert not (tmp_path / "rewards.png").exists()  # no reward curves to draw for SFT
    assert (tmp_path / "loss.png").stat().st_size > 0  # its loss curves instead


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_ends_with_one_line_naming_where_to_go_on(tmp_path, signum) -> None:
    # Ctrl-C, or SIGTERM from `timeout`, a scheduler or `kill`: one line, not a traceback, and
    # the checkpoint the run can resume from.
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "yatt", "train", "tiny_test", "train.steps=100000"]
    command += ["checkpoint.every=1", f"logging.run_dir={run_dir}"]
    # A shell that starts jobs in the background (CI's may) hands them SIGINT ignored, and
    # Python then keeps it so: the child takes Ctrl-C as a terminal's foreground job would.
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not list_checkpoints(run_dir):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)  # polling for the first checkpoint, not a synchronisation
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.communicate()  # reaped, its pipe closed, whatever happened above
    assert process.returncode == 128 + signum, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    what = "interrupted" if signum == signal.SIGINT else "terminated"
    assert last.startswith(f"yatt: {what}; the newest checkpoint is {run_dir}/checkpoints/step_")
    assert last.endswith(": rerun with checkpoint.resume=latest to go on from it")


def test_a_run_that_fails_to_set_up_leaves_no_empty_folder(tmp_path, capsys) -> None:
    run_dir = tmp_path / "runs" / "new"
    for bad in ("data.path=/no/such/prompts.jsonl", "model.path=/no/such/model"):
        assert main(["train", "tiny_test", bad, f"logging.run_dir={run_dir}"]) == 2
        assert "/no/such/" in capsys.readouterr().err
        assert not run_dir.exists(), bad
    run_dir.mkdir()  # a folder the user made is theirs: kept
    assert (
        main(["train", "tiny_test", "data.path=/no/such/p.jsonl", f"logging.run_dir={run_dir}"])
        == 2
    )
    assert run_dir.is_dir()


def test_a_bare_yatt_prints_its_usage(capsys) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: yatt") and "train" in err and "report" in err


def test_a_stop_signal_whose_raise_was_lost_stops_the_next_step() -> None:
    # Python swallows an exception raised inside a finaliser: a signal landing there would be
    # lost, so each step checks for one that came.
    from yatt import cli

    seen = []
    step = cli._stoppable(lambda *args: seen.append(args))
    step(1, 3, {})
    cli._STOPS.append(cli._Terminated())
    try:
        with pytest.raises(cli._Terminated):
            step(2, 3, {})
    finally:
        cli._STOPS.clear()
    assert seen == [(1, 3, {})]


@pytest.mark.parametrize("command", ["train", "sft"])
def test_rerunning_a_finished_runs_command_with_resume_auto_is_no_error(
    tmp_path, capsys, command
) -> None:
    # A wrapper that restarts preempted jobs reruns the same command: once the run had taken
    # every step, that failed with exit 2 ("leaves nothing to train").
    run_dir = tmp_path / "run"
    argv = [command, "tiny_test", "train.steps=2", "checkpoint.every=1", "eval.at_end=false",
            "checkpoint.resume=auto", f"logging.run_dir={run_dir}"]  # fmt: skip
    assert main(argv) == 0
    files = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"checkpoint.resume=auto: the run in {run_dir} is complete" in err
    assert "summary" in err  # the finished run's summary, read from its folder
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == files
    assert main([*argv, "train.steps=1"]) == 2  # fewer steps than it took: still refused
    if command == "sft":  # stopped after its last checkpoint, before saving model/: said so
        shutil.rmtree(run_dir / "model")
        capsys.readouterr()
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert f"{run_dir} has no model/ folder (the run stopped before saving it)" in err
        assert f"weights are in {run_dir / 'checkpoints' / 'step_000002'}/policy" in err


def test_debug_logging_shows_every_metric_of_every_step(tmp_path, capsys) -> None:
    # logging.level=DEBUG added nothing to a run's log.
    argv = ["train", "tiny_test", "train.steps=2", "logging.level=DEBUG",
            f"logging.run_dir={tmp_path / 'run'}"]  # fmt: skip
    assert main(argv) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if " DEBUG yatt.common.metrics " in x]
    assert [line.split(" step ")[1].split(":")[0] for line in lines] == ["0", "1", "2"], lines
    assert "eval/accuracy=" in lines[0]  # the initial evaluation's row
    assert "timing_s/step=" in lines[1] and "critic/score/mean=" in lines[1]
