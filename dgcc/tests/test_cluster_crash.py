"""Crash tests of a logging DistDGCC cluster: real node processes, SIGKILL, crash points.

Goal: whatever the moment a node dies (SIGKILL after a random number of answers, or every node
at a named crash point inside its log write), restarting the cluster from the nodes' own logs
gives a state equal to the serial replay of exactly the epochs every node made durable, no
answered call is lost, TPC-C consistency holds, and a crash during recovery followed by
recovery gives the same state. Method: ``dgcc.wal.cluster_trials`` (``dgcc drill --cluster``
runs the same trials at length outside CI).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from dgcc.local_cluster import start_local
from dgcc.wal.checkpoint import read_manifest
from dgcc.wal.cluster_trials import (
    ClusterDrill,
    crash_point_trial,
    drive,
    merged_dump,
    random_trial,
)
from dgcc.wal.writer import list_segments

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED, TRIALS = 3, 3


def test_random_sigkill_then_whole_cluster_restart(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    trials = []
    for n in range(TRIALS):  # the middle trial also takes forked checkpoints as it runs
        drill = ClusterDrill(seed=SEED, checkpoint_every_epochs=2 if n == 1 else 0)
        trials.append(random_trial(tmp_path / f"trial{n}", rng, drill, crash_recovery=n != 1))
    assert any(trial.crashed_recovery for trial in trials)
    assert all(trial.durable <= drill.epochs for trial in trials)


@pytest.mark.parametrize("point", ["wal.mid_write", "wal.before_fsync", "wal.after_fsync"])
def test_crash_point_in_the_log_write(tmp_path: Path, point: str) -> None:
    trial = crash_point_trial(tmp_path, point, ClusterDrill(seed=SEED))
    assert trial.durable <= 3  # the third block at most (written, maybe not fsync'ed)


def test_checkpoints_taken_while_running_survive_a_restart(tmp_path: Path) -> None:
    """Forked checkpoints inside the node processes; a restart loads one and replays the rest."""
    drill = ClusterDrill(seed=SEED, checkpoint_every_epochs=2)
    data_dir = tmp_path / "data"
    config = drill.config(data_dir)
    cluster = start_local(config, tmp_path / "run", ready_timeout_s=120)
    answered = asyncio.run(drive(cluster, drill.requests(SEED), None, lambda: None))
    assert sum(map(len, answered)) == drill.nodes * drill.epochs * drill.epoch_calls
    before = merged_dump(cluster)
    cluster.stop()
    for node in range(drill.nodes):
        directory = data_dir / f"node{node}"
        assert read_manifest(directory)[0] >= 2  # type: ignore[index]
        assert list_segments(directory)[0][0] > 1  # the log before a checkpoint is gone
    restarted = start_local(config, tmp_path / "restart", ready_timeout_s=120)
    try:
        assert merged_dump(restarted) == before
    finally:
        restarted.stop()
