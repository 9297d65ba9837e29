"""A single failed node rejoins its running DistDGCC cluster; the others keep their state.

Goal: killing one node at a random moment and restarting only it (the survivors keep their
processes) lets the cluster go on, and the union of the nodes' rows equals the serial replay of
exactly the epochs the cluster executed; no answered call is lost; TPC-C consistency holds;
the survivors stall without error spam; a whole-cluster restart afterwards gives the same rows;
a rejoin the peers can no longer serve fails with one clear line naming the epochs. Method:
the plan a rejoining node draws from its peers' answers is checked on hand-built answers; the
whole path runs on real node processes over TCP (``dgcc.wal.cluster_trials.rejoin_trial``,
also ``dgcc drill --cluster --rejoin``).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
from pathlib import Path

import pytest

from dgcc.cli import main
from dgcc.errors import ConfigError
from dgcc.local_cluster import start_local, start_node
from dgcc.wal.cluster_trials import ClusterDrill, drive, rejoin_trial
from dgcc.wal.rejoin import RejoinError, Retained, plan_rejoin

SEED = 5


def _state(executed: int, closed: int, **fields: object) -> dict:
    state = {
        "executed": executed,
        "closed": closed,
        "durable": executed,
        "since": 0,
        "inputs_to": tuple((e, ("to", e)) for e in range(closed)),
        "inputs_from": (),
        "values_to": (),
        "awaiting": (),
    }
    return state | fields


def _origin(epochs: range) -> tuple:
    """Node 0's inputs as a peer received them: (calls, entries, whole batch)."""
    return tuple((e, (1, (), (("pay", {"epoch": e}),))) for e in epochs)


def test_plan_reruns_from_the_oldest_epoch_a_peer_has_not_finished() -> None:
    states = {
        1: _state(3, 5, inputs_from=_origin(range(5)), values_to=((2, ("v2",)), (3, ("v3",)))),
        2: _state(4, 5, inputs_from=_origin(range(4)), awaiting=(4,)),
    }
    plan = plan_rejoin(0, 4, states)  # its log ends at epoch 4; node 1 finished only 3
    assert (plan.restart, plan.closed) == (3, 5)
    assert [batch[0].params for batch in plan.own.values()] == [{"epoch": 3}, {"epoch": 4}]
    assert plan.inputs[4] == {1: ("to", 4), 2: ("to", 4)}
    assert plan.values == {3: [(1, "v3")]}  # epoch 2 is in its log already
    assert plan.resend_inputs == {1: frozenset(), 2: frozenset({4})}
    assert plan.reports_to == {1: frozenset(), 2: frozenset({4})}
    assert plan.durable == {1: 3, 2: 4}


def test_plan_drops_an_epoch_whose_inputs_no_peer_received() -> None:
    """Node 0 closed epoch 3 and died before sending it: nobody ran it, it is not re-run."""
    states = {1: _state(3, 4, inputs_from=_origin(range(3)))}
    plan = plan_rejoin(0, 3, states)
    assert (plan.restart, plan.closed, plan.own) == (3, 3, {})


def test_plan_refuses_epochs_a_peer_dropped() -> None:
    states = {1: _state(6, 6, since=5, inputs_to=tuple((e, "b") for e in range(5, 6)))}
    with pytest.raises(RejoinError, match=r"node 1 no longer holds epochs 3\.\.5"):
        plan_rejoin(0, 2, states)
    states = {1: _state(4, 4, inputs_from=_origin([1, 3]))}
    with pytest.raises(RejoinError, match=r"inputs for epochs \[1, 3\]: a gap"):
        plan_rejoin(0, 1, states)
    states = {1: _state(4, 4, inputs_from=_origin(range(2)))}
    with pytest.raises(RejoinError, match="peers executed epochs up to 4"):
        plan_rejoin(0, 1, states)


def test_retained_keeps_only_epochs_not_durable_everywhere() -> None:
    retained = Retained(1)
    for epoch in range(4):
        retained.sent_inputs(epoch, {0: ("in", epoch), 2: ("other", epoch)})
        retained.received_inputs(epoch, 0, ("from", epoch))
        retained.sent_values(epoch, 0, ("v", epoch))
    retained.drop_before(2)
    retained.drop_before(1)  # the watermark never goes back
    state = retained.state_for(0, executed=4, closed=4, durable=3, awaiting=(3,))
    assert state["since"] == 2
    assert state["inputs_to"] == ((2, ("in", 2)), (3, ("in", 3)))
    assert state["inputs_from"] == ((2, ("from", 2)), (3, ("from", 3)))
    assert state["values_to"] == ((2, (("v", 2),)), (3, (("v", 3),)))
    retained.check_rejoin(0, 2)
    with pytest.raises(RejoinError, match=r"node 1 no longer holds epochs 2\.\.2 that node 0"):
        retained.check_rejoin(0, 1)


def test_start_node_names_a_bad_node(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no cluster in"):
        start_node(tmp_path, 0)
    assert main(["cluster", "start", "--dir", str(tmp_path), "--node", "0"]) == 2


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("nodes", [2, 3])
def test_kill_one_node_restart_only_it(tmp_path: Path, nodes: int) -> None:
    options = dict(ClusterDrill().options, warehouses=nodes)
    drill = ClusterDrill(nodes=nodes, seed=SEED, options=options)
    rng = random.Random(SEED + nodes)
    for trial in range(2):  # the second: the victim's first restart dies in its log replay
        result = rejoin_trial(tmp_path / f"trial{trial}", rng, drill, crash_recovery=trial == 1)
        assert result.durable == drill.epochs + 2  # the cluster went on after the rejoin


def test_drill_rejoin_needs_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drill", "--rejoin", "--trials", "1"]) == 2
    assert "--rejoin needs --cluster" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_drill_runs_rejoin_trials(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drill", "--cluster", "--rejoin", "--trials", "1", "--seed", str(SEED)]) == 0
    out = capsys.readouterr().out
    assert "sigkill one of 2 nodes, rejoin" in out
    assert "the trial recovered correctly" in out


@pytest.mark.integration
@pytest.mark.slow
def test_a_rejoin_the_peers_cannot_serve_fails_with_the_epochs(tmp_path: Path) -> None:
    """Node 1 comes back with an empty log: node 0 no longer holds the epochs it would need."""
    drill = ClusterDrill(seed=SEED)
    data_dir = tmp_path / "data"
    cluster = start_local(drill.config(data_dir), tmp_path / "run", ready_timeout_s=120)
    try:
        answered = asyncio.run(drive(cluster, drill.requests(SEED), None, lambda: None))
        assert sum(map(len, answered)) == drill.nodes * drill.epochs * drill.epoch_calls
        os.kill(cluster.processes[1].pid, signal.SIGKILL)
        cluster.processes[1].wait(timeout=30)
        shutil.rmtree(data_dir / "node1")
        code = main(["cluster", "start", "--dir", str(tmp_path / "run"), "--node", "1"])
        assert code == 2
        log = (tmp_path / "run" / "node1.log").read_text()
        assert "node 0 no longer holds epochs 1..6 that node 1 needs to rejoin" in log
        assert "restart node 1 with the data dir it last wrote" in log  # the next step
        assert cluster.processes[0].poll() is None  # the survivor runs on
    finally:
        cluster.stop()
