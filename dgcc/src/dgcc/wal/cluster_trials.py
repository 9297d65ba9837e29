"""Crash trials of a logging DistDGCC cluster: real node processes die, the cluster restarts.

A trial starts ``dgcc node`` processes with ``data_dir`` and count-closed epochs, sends every
node its calls over pipelined clients, and kills: SIGKILL of one node after a chosen number of
answers (then of the others, which stall without it), or every node at a named crash point
inside its log write. It then restarts the whole cluster from the nodes' own logs (optionally
crashing every node half-way through its replay first) and checks that the union of the nodes'
rows equals the serial replay of exactly the epochs every node made durable, that no answered
call is missing from them, and TPC-C consistency. The global order of those epochs is read back
from the logs (each origin's own calls are complete in its block). A rejoin trial
(``rejoin_trial``) kills one node while the others keep running, restarts only it, and checks
the same promises on the live cluster after it caught up, plus that the survivors never
restarted and stalled without error spam, and that a whole-cluster restart afterwards gives
the same rows. The crash and rejoin tests and ``dgcc drill --cluster [--rejoin]`` all use
these.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgcc.api import TxnRequest
from dgcc.cluster import ClusterConfig, local_config
from dgcc.errors import ConfigError
from dgcc.local_cluster import LocalCluster, start_local
from dgcc.local_cluster import status as cluster_status
from dgcc.net.client import AsyncClient
from dgcc.net.wire import NetError, decode, encode
from dgcc.protocols.serial import SerialProtocol
from dgcc.wal.crashpoints import CRASH_EXIT_CODE
from dgcc.wal.format import decode_payload
from dgcc.wal.recovery import read_log
from dgcc.wal.trials import DrillFailure
from dgcc.workloads import get_workload

__all__ = [
    "ClusterDrill",
    "ClusterTrial",
    "check_history",
    "crash_point_trial",
    "drive",
    "durable_history",
    "merged_dump",
    "random_trial",
    "rejoin_trial",
    "verify_restart",
]

CALL_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 120.0
WARNINGS_MAX = 4  # log lines at WARNING or above a survivor may write over one rejoin
REJOIN_EPOCHS_AFTER = 2  # epochs the survivors run past the victim's first calls


@dataclass(frozen=True)
class ClusterDrill:
    """The drill's cluster: TPC-C with cross-node transactions, count-closed epochs."""

    nodes: int = 2
    epoch_calls: int = 10
    epochs: int = 6
    seed: int = 3
    checkpoint_every_epochs: int = 0  # the crash trials read the whole history from the logs
    protocol: str = "dgcc"  # or "calvin": the epoch protocols log the same blocks
    options: dict[str, Any] = field(
        default_factory=lambda: {
            "warehouses": 2,
            "items": 200,
            "customers_per_district": 30,
            "orders_per_district": 30,
            "remote_item_fraction": 0.2,
            "remote_payment_fraction": 0.3,
        }
    )

    def config(self, data_dir: Path) -> ClusterConfig:
        return local_config(
            self.nodes,
            workload="tpcc",
            workload_options=self.options,
            epoch_ms=0,
            epoch_calls_max=self.epoch_calls,
            seed=self.seed,
            data_dir=str(data_dir),
            checkpoint_every_epochs=self.checkpoint_every_epochs,
            protocol=self.protocol,
        )

    def requests(self, seed: int) -> list[list[TxnRequest]]:
        stream = get_workload("tpcc", **self.options).requests(seed)
        calls = self.epochs * self.epoch_calls
        return [[next(stream) for _ in range(calls)] for _ in range(self.nodes)]


@dataclass(frozen=True)
class ClusterTrial:
    how: str  # what killed the cluster
    answered: int  # calls answered before it died
    durable: int  # the epoch the restarted cluster recovered to
    crashed_recovery: bool  # every node also died once half-way through its replay


def _wire(value: Any) -> Any:
    return decode(encode(("m", value)))[1]


@contextlib.contextmanager
def _crashpoint_for_children(spec: str) -> Iterator[None]:
    """Node processes started inside inherit ``DGCC_CRASHPOINT=spec`` (this one is unarmed)."""
    before = os.environ.get("DGCC_CRASHPOINT")
    os.environ["DGCC_CRASHPOINT"] = spec
    try:
        yield
    finally:
        if before is None:
            del os.environ["DGCC_CRASHPOINT"]
        else:
            os.environ["DGCC_CRASHPOINT"] = before


async def drive(
    cluster: LocalCluster, requests: list[list[TxnRequest]], kill_after: int | None, kill
) -> list[list]:
    """Send every node its calls; ``kill()`` once ``kill_after`` answers came back.

    Returns each node's answered calls as wire-normalised (procedure, params) pairs.
    """
    clients = [await AsyncClient.connect(n.host, n.port) for n in cluster.config.nodes]
    answered: list[list] = [[] for _ in clients]

    async def one(node: int, request: TxnRequest) -> None:
        try:
            await clients[node].call(request.procedure, request.params, timeout_s=CALL_TIMEOUT_S)
        except NetError:  # the node died first: not answered
            return
        answered[node].append(_wire((request.procedure, request.params)))
        if kill_after is not None and sum(map(len, answered)) == kill_after:
            kill()

    try:
        await asyncio.gather(*(one(n, r) for n, batch in enumerate(requests) for r in batch))
    finally:
        for client in clients:
            await client.close()
    return answered


def _kill_all(cluster: LocalCluster, first: int) -> None:
    """SIGKILL node ``first``, then the others (they stall without it)."""
    nodes = len(cluster.processes)
    for node in [first] + [n for n in range(nodes) if n != first]:
        process = cluster.processes[node]
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
    for process in cluster.processes:
        process.wait(timeout=30)


def durable_history(data_dir: Path, nodes: int) -> list[list[TxnRequest]]:
    """The global order of the epochs present in every node's log.

    Raises:
        DrillFailure: a node's block shows another origin's calls than the origin's own block.
    """
    logs = []
    for node in range(nodes):
        blocks, _ = read_log(data_dir / f"node{node}", 0)
        logs.append([decode_payload(block) for block in blocks])
    history = []
    for epoch in range(min(map(len, logs))):
        batch = []
        for origin in range(nodes):
            calls = logs[origin][epoch]["inputs"][origin]
            for node in range(nodes):  # every node ran the origin's calls it saw in this order
                seen = logs[node][epoch]["inputs"][origin]
                if len(seen) != len(calls) or any(
                    mine is not None and mine != call for mine, call in zip(seen, calls)
                ):
                    raise DrillFailure(
                        f"epoch {epoch + 1}: node {node} ran other calls of {origin}"
                    )
            batch += [TxnRequest(procedure, params) for procedure, params in calls]
        history.append(batch)
    return history


def merged_dump(cluster: LocalCluster) -> dict:
    async def dumps() -> list[dict]:
        clients = [await AsyncClient.connect(n.host, n.port) for n in cluster.config.nodes]
        try:
            return [await client.dump(timeout_s=CALL_TIMEOUT_S) for client in clients]
        finally:
            for client in clients:
                await client.close()

    merged: dict = {}
    for dump in asyncio.run(dumps()):
        for name, rows in dump.items():
            merged.setdefault(name, {}).update(rows)
    return merged


def _sent_history(drill: ClusterDrill, requests: list[list[TxnRequest]], epochs: int) -> list:
    """Epochs 1..``epochs`` as sent: count-closed epochs take each node's next calls in order."""
    calls = drill.epoch_calls
    return [
        [r for node in range(drill.nodes) for r in requests[node][e * calls : (e + 1) * calls]]
        for e in range(epochs)
    ]


def _calls(history: list[list[TxnRequest]]) -> list:
    return _wire([[(r.procedure, r.params) for r in batch] for batch in history])


def _restarted_epoch(cluster: LocalCluster) -> int:
    epochs = {node["epochs_executed"] for node in cluster_status(cluster.config)}
    if len(epochs) != 1:
        raise DrillFailure(f"restarted nodes disagree on the epoch: {sorted(epochs)}")
    return epochs.pop()


def verify_restart(
    drill: ClusterDrill,
    data_dir: Path,
    requests: list[list[TxnRequest]],
    answered: list[list],
    *,
    crash_recovery: bool,
) -> tuple[int, bool]:
    """Restart the cluster from its logs and check it; (recovered epoch, recovery crashed).

    The reference is the serial replay of the epochs the cluster restarted at, as sent; with
    no checkpoints the logs must also hold exactly those epochs' calls.

    Raises:
        DrillFailure: a broken promise (state, a lost answered call, consistency).
    """
    config = drill.config(data_dir)
    checkpoints = drill.checkpoint_every_epochs > 0
    crashed = crash_recovery and not checkpoints
    crashed = crashed and len(durable_history(data_dir, drill.nodes)) >= 2
    if crashed:  # every node dies half-way through its replay; the next start recovers again
        with _crashpoint_for_children("recovery.mid_replay"):
            try:
                start_local(config, data_dir.parent / "restart_crash", ready_timeout_s=60)
            except ConfigError as error:  # the crash point, not a timeout or a port clash
                if f"(exit {CRASH_EXIT_CODE})" not in str(error):
                    raise DrillFailure(f"the armed restart failed otherwise: {error}") from None
            else:
                raise DrillFailure("nodes armed to crash in recovery started anyway")
    cluster = start_local(config, data_dir.parent / "restart", ready_timeout_s=READY_TIMEOUT_S)
    try:
        history = _sent_history(drill, requests, _restarted_epoch(cluster))
        logged = [] if checkpoints else durable_history(data_dir, drill.nodes)
        if not checkpoints and _calls(logged) != _calls(history):  # the restart cut the rest
            raise DrillFailure(f"{data_dir}: the logs do not hold the {len(history)} epochs sent")
        check_history(drill, data_dir, history, merged_dump(cluster), answered)
    finally:
        cluster.stop()
    return len(history), crashed


def check_history(
    drill: ClusterDrill, data_dir: Path, history: list[list[TxnRequest]], dump: dict, answered: list
) -> None:
    """The cluster's rows equal the serial replay of ``history``, which holds every answered
    call, and TPC-C consistency holds (DrillFailure otherwise)."""
    workload = get_workload("tpcc", **drill.options)
    db = workload.build(drill.seed)
    serial = SerialProtocol(db, workload.registry())
    for batch in history:
        serial.run_batch(batch)
    if _wire(dump) != _wire(db.dump()):
        raise DrillFailure(f"{data_dir}: state differs from the serial replay of {len(history)}")
    violations = workload.check_state(db)
    if violations:
        raise DrillFailure(f"{data_dir}: TPC-C consistency: {violations[:3]}")
    logged = Counter(repr(_wire((r.procedure, r.params))) for batch in history for r in batch)
    for node, calls in enumerate(answered):
        missing = Counter(map(repr, calls)) - logged
        if missing:
            raise DrillFailure(f"node {node}: answered calls not durable: {list(missing)[:2]}")


def random_trial(
    root: Path, rng: random.Random, drill: ClusterDrill, *, crash_recovery: bool
) -> ClusterTrial:
    """SIGKILL one random node after a random number of answers, then the rest; restart."""
    data_dir = root / "data"
    cluster = start_local(drill.config(data_dir), root / "run", ready_timeout_s=READY_TIMEOUT_S)
    kill_after = rng.randrange(1, drill.nodes * drill.epochs * drill.epoch_calls)
    first = rng.randrange(drill.nodes)
    requests = drill.requests(rng.randrange(1 << 30))
    kill: Callable[[], None] = lambda: _kill_all(cluster, first)  # noqa: E731
    answered = asyncio.run(drive(cluster, requests, kill_after, kill))
    _kill_all(cluster, first)  # no-op when already dead
    durable, crashed = verify_restart(
        drill, data_dir, requests, answered, crash_recovery=crash_recovery
    )
    how = f"sigkill node {first} after {kill_after} answers"
    return ClusterTrial(how, sum(map(len, answered)), durable, crashed)


def crash_point_trial(root: Path, point: str, drill: ClusterDrill, *, hit: int = 3) -> ClusterTrial:
    """Every node dies at its ``hit``-th pass of crash point ``point``; restart and check.

    Raises:
        DrillFailure: also when no node died at the point, or calls of later epochs answered.
    """
    data_dir = root / "data"
    with _crashpoint_for_children(f"{point}:{hit}"):
        cluster = start_local(drill.config(data_dir), root / "run", ready_timeout_s=READY_TIMEOUT_S)
    requests = drill.requests(drill.seed)
    answered = asyncio.run(drive(cluster, requests, None, lambda: None))
    try:
        codes = [process.wait(timeout=60) for process in cluster.processes]
    except subprocess.TimeoutExpired:
        _kill_all(cluster, 0)
        raise DrillFailure(f"a node ran on past {point}:{hit} for 60 s after its calls") from None
    _kill_all(cluster, 0)
    if CRASH_EXIT_CODE not in codes:
        raise DrillFailure(f"no node died at {point}:{hit}; exit codes {codes}")
    if sum(map(len, answered)) > (hit - 1) * drill.nodes * drill.epoch_calls:
        raise DrillFailure(f"{sum(map(len, answered))} calls answered past epoch {hit - 1}")
    durable, _ = verify_restart(drill, data_dir, requests, answered, crash_recovery=False)
    return ClusterTrial(f"{point}:{hit}", sum(map(len, answered)), durable, False)


def rejoin_trial(
    root: Path, rng: random.Random, drill: ClusterDrill, *, crash_recovery: bool = False
) -> ClusterTrial:
    """SIGKILL one random node after a random number of answers; restart only it; check.

    The survivors keep their processes and state; the victim recovers from its log and what
    its peers kept, re-executes the epochs it missed, then takes new calls until it has
    closed as many epochs as they have: ``REJOIN_EPOCHS_AFTER`` more than its first calls
    fill, so the cluster goes on after the rejoin. ``durable`` is the epochs the cluster ran.
    With ``crash_recovery`` the victim's first restart dies half-way through its log replay
    (when it has two blocks to replay) and a second one rejoins. Last, the whole cluster
    restarts from the logs (the victim's now spans its two lives) to the same rows.

    Raises:
        DrillFailure: a broken promise (state, a lost answered call, consistency, a restarted
            survivor, error spam in a survivor's log).
        ConfigError: a drill with checkpoints (the logs must hold the whole history).
    """
    if drill.checkpoint_every_epochs:
        raise ConfigError("a rejoin trial reads the whole history from the logs: no checkpoints")
    data_dir = root / "data"
    cluster = start_local(drill.config(data_dir), root / "run", ready_timeout_s=READY_TIMEOUT_S)
    try:
        victim = rng.randrange(drill.nodes)
        kill_after = rng.randrange(1, drill.nodes * drill.epochs * drill.epoch_calls)
        epochs = drill.epochs + REJOIN_EPOCHS_AFTER
        longer = dataclasses.replace(drill, epochs=epochs)
        requests = longer.requests(rng.randrange(1 << 30))
        fresh = longer.requests(rng.randrange(1 << 30))[victim]  # the victim's calls after it
        requests[victim] = requests[victim][: drill.epochs * drill.epoch_calls]
        pids = [process.pid for process in cluster.processes]
        crashed: list[bool] = [crash_recovery]  # the victim's restart, then whether it crashed
        answered = asyncio.run(
            _drive_rejoin(cluster, longer, requests, fresh, (victim, kill_after), crashed)
        )
        history = durable_history(data_dir, drill.nodes)
        if len(history) != epochs:
            raise DrillFailure(f"{data_dir}: the logs hold {len(history)} of {epochs} epochs")
        dump = merged_dump(cluster)
        check_history(drill, data_dir, history, dump, answered)
        _check_survivors(cluster, pids, victim)
    finally:
        cluster.stop()
    restarted = start_local(cluster.config, root / "restart", ready_timeout_s=READY_TIMEOUT_S)
    try:
        if _wire(merged_dump(restarted)) != _wire(dump):
            raise DrillFailure(f"{data_dir}: a whole-cluster restart after the rejoin differs")
    finally:
        restarted.stop()
    how = f"sigkill node {victim} after {kill_after} answers, rejoin"
    return ClusterTrial(how, sum(map(len, answered)), len(history), crashed[-1])


async def _drive_rejoin(
    cluster: LocalCluster,
    drill: ClusterDrill,
    requests: list[list[TxnRequest]],
    fresh: list[TxnRequest],
    kill: tuple[int, int],
    crashed: list[bool],
) -> list[list]:
    """Send every node its calls, kill node ``kill[0]`` once ``kill[1]`` answers came back,
    restart it (``crashed``: see ``_restart``), and send it ``fresh`` calls until its epochs
    match the others'."""
    victim, kill_after = kill
    clients = [await AsyncClient.connect(n.host, n.port) for n in cluster.config.nodes]
    answered: list[list] = [[] for _ in clients]
    killed = asyncio.Event()

    async def one(node: int, client: AsyncClient, request: TxnRequest) -> None:
        try:
            await client.call(request.procedure, request.params, timeout_s=CALL_TIMEOUT_S)
        except NetError:  # the victim died first: not answered
            return
        answered[node].append(_wire((request.procedure, request.params)))
        if sum(map(len, answered)) == kill_after:
            os.kill(cluster.processes[victim].pid, signal.SIGKILL)
            killed.set()

    async def rejoin() -> None:
        await asyncio.wait_for(killed.wait(), CALL_TIMEOUT_S)
        await asyncio.to_thread(cluster.processes[victim].wait, CALL_TIMEOUT_S)
        await asyncio.to_thread(_restart, cluster, victim, crashed)
        address = cluster.config.nodes[victim]
        client = await AsyncClient.connect(address.host, address.port)
        clients.append(client)
        closed = (await client.status(timeout_s=CALL_TIMEOUT_S))["epochs_closed"]
        calls = (drill.epochs - closed) * drill.epoch_calls
        await asyncio.gather(*(one(victim, client, request) for request in fresh[:calls]))

    try:
        calls = [one(n, clients[n], r) for n, batch in enumerate(requests) for r in batch]
        await asyncio.gather(*calls, rejoin())
    finally:
        for client in clients:
            await client.close()
    return answered


def _restart(cluster: LocalCluster, victim: int, crashed: list[bool]) -> None:
    """Restart ``victim``; if ``crashed[0]``, first armed to die in its log replay.

    Appends whether that armed restart did die there (too short a log lets it start).
    """
    if crashed[0]:
        with _crashpoint_for_children("recovery.mid_replay"):
            try:
                cluster.restart(victim, ready_timeout_s=READY_TIMEOUT_S)
            except ConfigError as error:
                if f"(exit {CRASH_EXIT_CODE})" not in str(error):
                    raise DrillFailure(f"node {victim} failed its restart: {error}") from None
                crashed.append(True)
            else:
                crashed.append(False)
                return
    cluster.restart(victim, ready_timeout_s=READY_TIMEOUT_S)


def _check_survivors(cluster: LocalCluster, pids: list[int], victim: int) -> None:
    """The survivors still run as the same processes and logged no error spam meanwhile."""
    for node, entry in enumerate(cluster_status(cluster.config)):
        if node != victim and entry.get("pid") != pids[node]:
            raise DrillFailure(f"node {node} was restarted: pid {entry.get('pid')} != {pids[node]}")
        if entry.get("peers_down"):
            raise DrillFailure(f"node {node} still sees peers {entry['peers_down']} down")
    for node in range(len(pids)):
        if node == victim:
            continue
        lines = (cluster.directory / f"node{node}.log").read_text().splitlines()
        loud = [line for line in lines if " WARNING " in line or " ERROR " in line]
        if len(loud) > WARNINGS_MAX or any("Traceback" in line for line in lines):
            raise DrillFailure(f"node {node} logged {len(loud)} warnings: {loud[:3]}")
