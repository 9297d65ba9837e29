"""CLI: bad arguments, configs and model names print exactly one line on stderr and exit 2,
without a traceback; `python -m yatt` behaves the same as a real process."""

import subprocess
import sys

import pytest

from yatt.cli import main


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["train", "tiny_test", "rollout.nsamples=3"], "rollout.nsamples"),
        (["train", "tiny_test", "train.steps=abc"], "train.steps"),
        (["train", "no_such_preset"], "no_such_preset"),
        (["train", "tiny_test", "novalue"], "novalue"),
        (["models", "prepare", "gpt17"], "gpt17"),
        (["train"], "config"),
        (["frobnicate"], "frobnicate"),
        (["eval", "/no/such/folder"], "/no/such/folder"),
        (["demo", "algo.name=sac"], "sac"),
        (["train", "tiny_test", "data.path=/no/such/prompts.jsonl"], "/no/such/prompts.jsonl"),
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
