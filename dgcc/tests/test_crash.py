"""Crash tests: real child processes die at named crash points or by SIGKILL, then we recover.

Goal: whatever the moment of death, the recovered state equals the serial replay of exactly the
durable epochs, every acknowledged epoch is among them, TPC-C consistency holds, a crash during
recovery is harmless, and damaged log tails are dropped with a clear message. Method: run
``python -m dgcc.wal.drill`` (small TPC-C), read its ``ack`` lines, kill it, recover in-process.
``DGCC_CRASH_TRIALS`` raises the number of random SIGKILL trials for a longer run outside CI.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dgcc.wal.crashpoints import CRASH_EXIT_CODE
from dgcc.wal.drill import DRILL_TPCC, reference_state
from dgcc.wal.recovery import recover
from dgcc.wal.writer import list_segments
from dgcc.workloads.tpcc import TpccWorkload
from dgcc.workloads.tpcc.checks import check
from dgcc.workloads.tpcc.schema import create_tables

SEED, BATCH, EPOCHS = 5, 20, 8
MODES = ("command", "value", "dependency")
TRIALS = int(os.environ.get("DGCC_CRASH_TRIALS", "12"))
TIMEOUT_S = 60


def _drill(
    directory: Path, mode: str, *, crash: str = "", kill_after: int | None = None, extra=()
) -> tuple[int, list[int]]:
    """Run the drill child; returns (exit code, acknowledged epochs)."""
    env = dict(os.environ, DGCC_CRASHPOINT=crash)
    argv = [sys.executable, "-m", "dgcc.wal.drill", str(directory), mode, str(EPOCHS)]
    argv += ["--seed", str(SEED), "--batch", str(BATCH), *extra]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    acks: list[int] = []
    for line in child.stdout:
        if line.startswith("ack "):
            acks.append(int(line.split()[1]))
            if kill_after is not None and len(acks) == kill_after:
                os.kill(child.pid, signal.SIGKILL)
                break
    child.stdout.close()
    return child.wait(timeout=TIMEOUT_S), acks


def _recover_and_check(directory: Path, acks: list[int], workers: int = 1) -> int:
    registry = TpccWorkload(**DRILL_TPCC).registry()
    recovered = recover(directory, create_tables, registry, workers=workers)
    durable = recovered.epoch
    assert durable >= max(acks, default=0), f"acknowledged {max(acks)} but only {durable} durable"
    assert recovered.db.dump() == reference_state(SEED, BATCH, durable).dump()
    assert check(recovered.db) == []
    return durable


WAL_POINTS = ("wal.mid_write", "wal.before_fsync", "wal.after_fsync")
CKPT_POINTS = ("ckpt.mid_write", "ckpt.before_rename", "ckpt.after_rename")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", WAL_POINTS + CKPT_POINTS)
def test_crash_point_then_recover_then_finish(tmp_path: Path, mode: str, point: str) -> None:
    extra = ("--checkpoint-every", "2", "--no-fork")
    code, acks = _drill(tmp_path, mode, crash=f"{point}:3", extra=extra)
    assert code == CRASH_EXIT_CODE
    durable = _recover_and_check(tmp_path, acks)
    assert durable <= max(acks, default=0) + 1  # at most the one unacknowledged epoch
    code, _ = _drill(tmp_path, mode, extra=extra)  # recovers, runs to EPOCHS
    assert code == 0
    assert _recover_and_check(tmp_path, []) == EPOCHS


def test_random_sigkill_trials(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    for trial in range(TRIALS):
        directory = tmp_path / f"trial{trial}"
        mode = rng.choice(MODES)
        extra: tuple[str, ...] = ("--checkpoint-every", str(rng.choice([0, 2, 3])))
        workers = 1
        if mode == "dependency" and rng.random() < 0.5:  # log partitions, replay in processes
            workers = 2
            extra += ("--partitions", "2", "--recovery-workers", "2")
        kill_after = rng.randrange(1, EPOCHS)
        code, acks = _drill(directory, mode, kill_after=kill_after, extra=extra)
        assert code in (0, -signal.SIGKILL), f"trial {trial} (seed {SEED}): exit {code}"
        _recover_and_check(directory, acks, workers)


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
