"""Crash trials of the single-node durable engine: a real child process dies, we recover.

A trial runs ``python -m dgcc.wal.drill`` (small TPC-C, pipelined group commit) in a child,
reads its ``ack`` lines, and kills it: with SIGKILL after a chosen number of acks, or at a
named crash point (``DGCC_CRASHPOINT``). ``verify`` then recovers the directory and checks that
the state equals the serial replay of exactly the durable epochs, that every acknowledged
epoch is durable, and TPC-C consistency. The crash tests and ``dgcc drill`` both use these.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dgcc.errors import DgccError
from dgcc.wal.checkpoint import read_manifest
from dgcc.wal.crashpoints import CRASH_EXIT_CODE
from dgcc.wal.drill import DRILL_TPCC, reference_state
from dgcc.wal.recovery import recover
from dgcc.workloads.tpcc import TpccWorkload
from dgcc.workloads.tpcc.checks import check
from dgcc.workloads.tpcc.schema import create_tables

__all__ = ["DrillFailure", "Trial", "crash_point_trial", "random_trial", "run_child", "verify"]

MODES = ("command", "value", "dependency")
CHILD_TIMEOUT_S = 120


class DrillFailure(DgccError):
    """A recovered state broke a durability promise (the message says which)."""


@dataclass(frozen=True)
class Trial:
    """One finished trial: how the child died, and what recovery found."""

    mode: str
    how: str  # "sigkill after N acks", a crash point, or "ran to the end"
    acked: int  # the newest acknowledged epoch (0: none)
    durable: int  # the newest epoch recovery found durable


def run_child(
    directory: Path,
    mode: str,
    epochs: int,
    *,
    seed: int,
    batch: int,
    crash: str = "",
    kill_after: int | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[int, list[int]]:
    """Run the drill child; returns (exit code, acknowledged epochs)."""
    env = dict(os.environ, DGCC_CRASHPOINT=crash)
    argv = [sys.executable, "-m", "dgcc.wal.drill", str(directory), mode, str(epochs)]
    argv += ["--seed", str(seed), "--batch", str(batch), *extra]
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
    return child.wait(timeout=CHILD_TIMEOUT_S), acks


def verify(directory: Path, acks: list[int], *, seed: int, batch: int, workers: int = 1) -> int:
    """Recover ``directory`` and check it; returns the durable epoch.

    Raises:
        DrillFailure: an acknowledged epoch is missing, the state differs from the serial
            replay of the durable epochs, or TPC-C consistency fails.
    """
    if read_manifest(directory) is None:  # died inside the very first checkpoint: never opened
        if acks:
            raise DrillFailure(f"{directory}: epoch {max(acks)} acknowledged, no checkpoint")
        return 0
    registry = TpccWorkload(**DRILL_TPCC).registry()
    recovered = recover(directory, create_tables, registry, workers=workers)
    durable = recovered.epoch
    if durable < max(acks, default=0):
        raise DrillFailure(f"{directory}: epoch {max(acks)} acknowledged, {durable} durable")
    if recovered.db.dump() != reference_state(seed, batch, durable).dump():
        raise DrillFailure(f"{directory}: state differs from the serial replay of {durable}")
    violations = check(recovered.db)
    if violations:
        raise DrillFailure(f"{directory}: TPC-C consistency: {violations[:3]}")
    return durable


def random_trial(
    directory: Path, rng: random.Random, *, seed: int, batch: int = 20, epochs: int = 8
) -> Trial:
    """One seeded random trial: mode, checkpoints, partitioned replay, and the moment of death.

    Raises:
        DrillFailure: see ``verify``; or the child exited in an unexpected way.
    """
    mode = rng.choice(MODES)
    extra: tuple[str, ...] = ("--checkpoint-every", str(rng.choice([0, 2, 3])))
    workers = 1
    if mode == "dependency" and rng.random() < 0.5:  # log partitions, replay in processes
        workers = 2
        extra += ("--partitions", "2", "--recovery-workers", "2")
    kill_after = rng.randrange(1, epochs)
    code, acks = run_child(
        directory, mode, epochs, seed=seed, batch=batch, kill_after=kill_after, extra=extra
    )
    if code not in (0, -signal.SIGKILL):
        raise DrillFailure(f"{directory}: drill child exited with {code}")
    durable = verify(directory, acks, seed=seed, batch=batch, workers=workers)
    how = f"sigkill after {kill_after} acks" if code else "ran to the end"
    return Trial(mode, how, max(acks, default=0), durable)


def crash_point_trial(
    directory: Path, rng: random.Random, point: str, *, seed: int, batch: int = 20, epochs: int = 8
) -> Trial:
    """Die at a random pass of crash point ``point``, check, then finish the run and check.

    Raises:
        DrillFailure: see ``verify``; or the child exited in an unexpected way.
    """
    mode = rng.choice(MODES)
    extra = ("--checkpoint-every", "2", "--no-fork")  # checkpoint points run in this process
    hit = rng.randint(1, 4)
    code, acks = run_child(
        directory, mode, epochs, seed=seed, batch=batch, crash=f"{point}:{hit}", extra=extra
    )
    if code not in (0, CRASH_EXIT_CODE):
        raise DrillFailure(f"{directory}: drill child exited with {code} at {point}:{hit}")
    durable = verify(directory, acks, seed=seed, batch=batch)
    code, _ = run_child(directory, mode, epochs, seed=seed, batch=batch, extra=extra)
    if code != 0 or verify(directory, [], seed=seed, batch=batch) != epochs:
        raise DrillFailure(f"{directory}: the run after {point}:{hit} did not finish cleanly")
    return Trial(mode, f"{point}:{hit}", max(acks, default=0), durable)
