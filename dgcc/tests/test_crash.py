"""Crash tests: real child processes die at named crash points or by SIGKILL, then we recover.

Goal: whatever the moment of death, the recovered state equals the serial replay of exactly the
durable epochs, every acknowledged epoch is among them, TPC-C consistency holds, a crash during
recovery is harmless, and damaged log tails are dropped with a clear message. Method: run
``python -m dgcc.wal.drill`` (small TPC-C), read its ``ack`` lines, kill it, recover in-process.
``dgcc drill --trials N`` runs the random trials at length outside CI.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dgcc.wal.crashpoints import CRASH_EXIT_CODE
from dgcc.wal.drill import DRILL_TPCC, reference_state
from dgcc.wal.recovery import recover
from dgcc.wal.trials import random_trial, run_child, verify
from dgcc.wal.writer import list_segments
from dgcc.workloads.tpcc import TpccWorkload
from dgcc.workloads.tpcc.schema import create_tables

SEED, BATCH, EPOCHS = 5, 20, 8
MODES = ("command", "value", "dependency")
TRIALS = 12


def _drill(
    directory: Path, mode: str, *, crash: str = "", kill_after: int | None = None, extra=()
) -> tuple[int, list[int]]:
    return run_child(
        directory,
        mode,
        EPOCHS,
        seed=SEED,
        batch=BATCH,
        crash=crash,
        kill_after=kill_after,
        extra=extra,
    )


def _recover_and_check(directory: Path, acks: list[int], workers: int = 1) -> int:
    return verify(directory, acks, seed=SEED, batch=BATCH, workers=workers)


WAL_POINTS = ("wal.mid_write", "wal.before_fsync", "wal.after_fsync")
CKPT_POINTS = ("ckpt.mid_write", "ckpt.before_rename", "ckpt.after_rename")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", WAL_POINTS + CKPT_POINTS)
def test_crash_point_then_recover_then_finish(tmp_path: Path, mode: str, point: str) -> None:
    extra = ("--checkpoint-every", "2", "--no-fork")
    code, acks = _drill(tmp_path, mode, crash=f"{point}:3", extra=extra)
    assert code == CRASH_EXIT_CODE
    durable = _recover_and_check(tmp_path, acks)
    # Pipelined: at most the epoch in flight and the one durable but not yet acknowledged.
    assert durable <= max(acks, default=0) + 2
    code, _ = _drill(tmp_path, mode, extra=extra)  # recovers, runs to EPOCHS
    assert code == 0
    assert _recover_and_check(tmp_path, []) == EPOCHS


def test_random_sigkill_trials(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    trials = [random_trial(tmp_path / f"trial{n}", rng, seed=SEED) for n in range(TRIALS)]
    assert all(trial.durable >= trial.acked for trial in trials)
    assert any(trial.how.startswith("sigkill") for trial in trials)
    assert {trial.mode for trial in trials} == set(MODES)


@pytest.mark.parametrize("mode", [*MODES, "partitioned"])
def test_crash_during_recovery_is_harmless(tmp_path: Path, mode: str) -> None:
    extra, workers = (), 1
    if mode == "partitioned":
        mode, workers = "dependency", 2
        extra = ("--partitions", "2", "--recovery-workers", "2")
    code, acks = _drill(tmp_path, mode, extra=extra)
    assert (code, acks[-1]) == (0, EPOCHS)
    for _ in range(2):  # die half-way through replay, twice
        code, acks = _drill(tmp_path, mode, crash="recovery.mid_replay", extra=extra)
        assert (code, acks) == (CRASH_EXIT_CODE, [])
    assert _recover_and_check(tmp_path, [], workers) == EPOCHS


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_damaged_tail_is_dropped_with_message(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    code, _ = _drill(tmp_path, "dependency")
    assert code == 0
    _, segment = list_segments(tmp_path)[-1]
    data = bytearray(segment.read_bytes())
    if damage == "truncate":
        data = data[:-7]
    else:
        data[-3] ^= 0x10
    segment.write_bytes(bytes(data))
    registry = TpccWorkload(**DRILL_TPCC).registry()
    recovered = recover(tmp_path, create_tables, registry)
    assert recovered.epoch == EPOCHS - 1
    assert recovered.db.dump() == reference_state(SEED, BATCH, EPOCHS - 1).dump()
    reason = "torn payload" if damage == "truncate" else "checksum mismatch in epoch 8 block"
    assert len(recovered.dropped) == 1
    assert str(segment) in recovered.dropped[0] and reason in recovered.dropped[0]
    assert "from offset " in caplog.text
    assert segment.stat().st_size < len(data)  # the tail was cut, so new epochs follow
    assert recover(tmp_path, create_tables, registry).dropped == []


def test_drill_command_runs_trials_and_rejects_bad_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dgcc import cli

    assert cli.main(["drill", "--trials", "2", "--seed", "4", "--dir", str(tmp_path)]) == 0
    assert "all 2 trials recovered correctly (seed 4)" in capsys.readouterr().out
    assert cli.main(["drill", "--trials", "0"]) == 2
    assert "--trials must be in 1..100000, got 0" in capsys.readouterr().err
    # Again into the same folder (another seed): refused, not a false durability failure.
    assert cli.main(["drill", "--trials", "1", "--seed", "5", "--dir", str(tmp_path)]) == 2
    assert "holds an earlier drill's trials (trial*)" in capsys.readouterr().err
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert cli.main(["drill", "--trials", "1", "--dir", str(a_file)]) == 2
    assert f"--dir {a_file}: cannot use it (Not a directory)" in capsys.readouterr().err


def test_an_interrupted_drill_removes_its_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from dgcc import cli, cli_drill

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes its folder
    started: list[Path] = []

    def interrupted(args: object, root: Path, number: int, rng: object) -> str:
        started.append(root)
        raise KeyboardInterrupt  # Ctrl-C during the first trial

    monkeypatch.setattr(cli_drill, "_one", interrupted)
    assert cli.main(["drill", "--trials", "3"]) == 128 + 2  # (SIGINT's exit status)
    assert started and started[0].parent == tmp_path and not started[0].exists()
