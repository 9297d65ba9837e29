"""Dependency logging for a DistDGCC node: one block per node per epoch, recovery alone.

A node's block holds what it needs to redo its own share of the epoch without any peer: the
epoch's input batches as this node saw them (every origin's calls in global order, ``None``
for calls routed elsewhere), and the value entries it received from other nodes (outputs,
logic-abort decisions and errors of remote pieces). Replay rebuilds the node's ``EpochRun``
from the inputs, delivers every logged value up front, and runs the pieces by in-degree;
nothing is sent, and values that peers needed are simply dropped. A failed node therefore
recovers alone while the others keep their state, then catches up on the epochs its running
peers went on with (``dgcc.wal.rejoin``); a whole cluster restarts by having every node replay
up to the newest epoch that all nodes made durable (``cluster_durable_epoch``).

Replay re-plans the node's transactions and rebuilds its local graph (as at run time); the
single-node engine's faster replay over logged edges (``dependency``) is not used here yet.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgcc.api import ProcedureRegistry, TxnRequest
from dgcc.cluster import ClusterConfig
from dgcc.errors import DgccError
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.protocols.dist_placement import Router
from dgcc.storage import Database, collector_paused
from dgcc.wal.checkpoint import (
    Checkpointer,
    check_layout_record,
    check_workload_record,
    load_snapshot,
    publish,
    read_acked,
    read_manifest,
    remove_old_snapshots,
    write_acked,
    write_checkpoint,
)
from dgcc.wal.crashpoints import crashpoint
from dgcc.wal.format import Block, BlockKind, WalCorrupt, decode_payload, encode_block
from dgcc.wal.recovery import cut_after, cut_torn_tail, no_checkpoint, read_log
from dgcc.wal.rejoin import RejoinError, RejoinPlan, Retained, plan_rejoin
from dgcc.wal.writer import WalWriter, list_segments

__all__ = [
    "LoggedEpochRun",
    "NodeDurability",
    "NodeLog",
    "NodeRecovered",
    "cluster_durable_epoch",
    "node_directory",
    "node_durability",
    "recover_node",
    "replay_node_epoch",
]

logger = logging.getLogger(__name__)

STEP_PIECES_MAX = 1 << 30


class LoggedEpochRun(EpochRun):
    """An ``EpochRun`` that keeps its inputs and the value entries delivered to it.

    A value delivered twice is taken once: a peer that rejoins re-sends every value of the
    epochs it re-executes (``dgcc.wal.rejoin``), some of which arrived before it died.
    """

    def __init__(
        self,
        node: int,
        db: Database,
        registry: ProcedureRegistry,
        router: Router,
        batches: Sequence[Sequence[TxnRequest | None]],
    ) -> None:
        self.inputs = batches
        self.received: list[Sequence[Any]] = []
        self._delivered: set[tuple[int, int]] = set()  # (txn index, piece index)
        super().__init__(node, db, registry, router, batches)

    def deliver(self, entries: Sequence[Sequence[Any]]) -> None:
        delivered = self._delivered
        fresh = [entry for entry in entries if (entry[0], entry[1]) not in delivered]
        if fresh:
            super().deliver(fresh)  # all or nothing: only applied entries are marked and logged
            delivered.update((entry[0], entry[1]) for entry in fresh)
            self.received.append(fresh)


def record_node_epoch(run: LoggedEpochRun, acked: int = 0) -> dict[str, Any]:
    """The block payload of an executed epoch; ``acked``: the newest epoch this node knew to
    be durable on every node when it wrote the block (clients may have been answered for it:
    a whole-cluster restart must not go back past it)."""
    assert run.finished, f"logging an epoch with {run.remaining} pieces left"
    inputs = [
        [None if request is None else (request.procedure, request.params) for request in batch]
        for batch in run.inputs
    ]
    return {"node": run.node, "inputs": inputs, "values": run.received, "acked": acked}


def replay_node_epoch(
    node: int,
    db: Database,
    registry: ProcedureRegistry,
    router: Router,
    payload: dict[str, Any],
    run_class: type[EpochRun] = EpochRun,
) -> int:
    """Redo one logged epoch of ``node`` on ``db`` alone; returns the pieces run.

    ``run_class`` is the node's epoch run (Calvin's lock-ordered one for a Calvin node).

    Raises:
        WalCorrupt: the block belongs to another node.
        DgccError: the logged values do not let every piece run (a value is missing).
    """
    if payload["node"] != node:
        raise WalCorrupt(f"log block of node {payload['node']} replayed on node {node}")
    batches = [
        [None if call is None else TxnRequest(call[0], call[1]) for call in batch]
        for batch in payload["inputs"]
    ]
    run = run_class(node, db, registry, router, batches)
    for entries in payload["values"]:
        run.deliver(entries)
    ran = 0
    while not run.finished:
        step = run.step(STEP_PIECES_MAX)
        run.take_outbox()  # the peers had these values long ago
        if not step:
            raise DgccError(f"node {node}: {run.remaining} pieces wait for values not in the log")
        ran += step
    return ran


@dataclass
class NodeRecovered:
    db: Database
    epoch: int  # node epochs ``1 .. epoch`` are in ``db`` (node epoch e runs as log epoch e)
    checkpoint_epoch: int
    durable_epoch: int  # the newest intact block on disk (may exceed ``epoch`` when capped)
    dropped: list[str]
    timing_s: dict[str, float]  # read_log, load_checkpoint, replay (wall and CPU), recover


def acked_epoch(directory: Path, checkpoint_epoch: int, blocks: list[Any]) -> int:
    """The newest epoch a node's log records as durable on every node: its checkpoint's, the
    ``ACKED`` record of its last stop, or its last intact block's ``acked``."""
    acked = max(checkpoint_epoch, read_acked(directory))
    if blocks:
        acked = max(acked, decode_payload(blocks[-1]).get("acked", 0))  # 0: older logs
    return acked


def recover_node(
    directory: Path,
    node: int,
    schema: Callable[[], Database],
    registry: ProcedureRegistry,
    router: Router,
    *,
    upto_epoch: int | None = None,
    repair: bool = True,
    run_class: type[EpochRun] = EpochRun,
) -> NodeRecovered:
    """Rebuild node ``node``'s state from its own directory, alone.

    Args:
        upto_epoch: stop after this epoch (a whole-cluster restart replays only the epochs
            every node made durable); None = every intact block.

    Raises:
        WalCorrupt: no checkpoint, damage that is not a torn tail, a block of another node,
            a checkpoint newer than ``upto_epoch``, or a log that ends before the epoch it
            records as durable on every node (a tail cut there was no crash's).
    """
    started_s = time.perf_counter()
    manifest = read_manifest(directory)
    if manifest is None:
        raise no_checkpoint(directory)
    checkpoint_epoch, snapshot = manifest
    if upto_epoch is not None and checkpoint_epoch > upto_epoch:
        raise WalCorrupt(f"{directory}: checkpoint {checkpoint_epoch} is past epoch {upto_epoch}")
    blocks, dropped = read_log(directory, checkpoint_epoch)
    read_s = time.perf_counter()
    durable = blocks[-1].epoch if blocks else checkpoint_epoch
    acked = acked_epoch(directory, checkpoint_epoch, blocks)
    if durable < acked:  # (before anything is cut)
        raise WalCorrupt(
            f"{directory}: node {node}'s log ends at epoch {durable}, before epoch {acked}, "
            "which it records as durable on every node (clients may have been answered for "
            "it): damage no crash leaves, or not the log this node wrote; nothing was cut"
        )
    if upto_epoch is not None:
        blocks = [block for block in blocks if block.epoch <= upto_epoch]
    with collector_paused():  # as in single-node recovery: none while loading and replaying
        db = load_snapshot(snapshot, checkpoint_epoch, schema)
        gc.freeze()  # the loaded rows are long-lived: later full collections skip them
        loaded_s, loaded_cpu_s = time.perf_counter(), time.process_time()
        _replay_blocks(node, db, registry, router, blocks, run_class)
    if repair and dropped:  # recovered: only now the torn tail goes
        cut_torn_tail(directory)
    done_s = time.perf_counter()
    timing = {
        "timing_s/read_log": read_s - started_s,
        "timing_s/load_checkpoint": loaded_s - read_s,
        "timing_s/replay": done_s - loaded_s,  # decoding the blocks included
        "timing_s/replay_cpu": time.process_time() - loaded_cpu_s,
        "timing_s/recover": done_s - started_s,
    }
    epoch = blocks[-1].epoch if blocks else checkpoint_epoch
    logger.info("node %d recovered epoch %d (checkpoint %d)", node, epoch, checkpoint_epoch)
    return NodeRecovered(db, epoch, checkpoint_epoch, durable, dropped, timing)


def _replay_blocks(
    node: int,
    db: Database,
    registry: ProcedureRegistry,
    router: Router,
    blocks: Sequence[Block],
    run_class: type[EpochRun],
) -> None:
    for count, block in enumerate(blocks, 1):
        if block.kind is not BlockKind.NODE:
            raise WalCorrupt(f"epoch {block.epoch}: a {block.kind.name} block in a node log")
        replay_node_epoch(node, db, registry, router, decode_payload(block), run_class)
        if count == len(blocks) // 2:
            crashpoint("recovery.mid_replay")


def cluster_durable_epoch(durable_epochs: Sequence[int]) -> int:
    """The newest epoch every node made durable: the last one clients may have been answered."""
    assert durable_epochs, "no nodes"
    return min(durable_epochs)


class NodeLog:
    """A node's log at run time: group commit per epoch on a background thread, checkpoints.

    Args:
        directory: the node's data directory (created if missing).
        node: the node id (checked against every block).
        initial: builds the initial database when the directory is new.
        schema: the empty tables, to load a checkpoint into.
        upto_epoch: cap recovery there (whole-cluster restart); blocks past it are unacked and
            are cut off the log so the next epochs follow on.
        checkpoint_every_epochs: checkpoint after every this many epochs (forked); 0 = never.
        keep_upto: keep the blocks past ``upto_epoch`` up to this epoch instead (a rejoining
            node re-executes those epochs, with the same inputs, for its stalled peers;
            ``record`` does not log them twice); blocks past it are cut all the same.
        cluster_durable: the newest epoch every node is known to have made durable, where
            that is less than the recovered epoch (a rejoin); None: the recovered epoch.
    """

    def __init__(
        self,
        directory: Path,
        node: int,
        registry: ProcedureRegistry,
        router: Router,
        initial: Callable[[], Database],
        schema: Callable[[], Database],
        *,
        upto_epoch: int | None = None,
        checkpoint_every_epochs: int = 0,
        run_class: type[EpochRun] = EpochRun,
        keep_upto: int | None = None,
        cluster_durable: int | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.node = node
        self.checkpoint_every_epochs = checkpoint_every_epochs
        if read_manifest(directory) is None:
            if list_segments(directory):  # e.g. a 2PC node's log, from before LAYOUT records
                raise WalCorrupt(
                    f"{directory} holds log segments but no checkpoint manifest: it is not an "
                    "epoch log (DistDGCC's or Calvin's); give this node the data dir it wrote"
                )
            self.db, self.epoch, self.logged = initial(), 0, 0
            write_checkpoint(directory, self.db, 0)
        else:
            recovered = recover_node(
                directory,
                node,
                schema,
                registry,
                router,
                upto_epoch=upto_epoch,
                run_class=run_class,
            )
            self.db, self.epoch = recovered.db, recovered.epoch
            self.logged = self.epoch  # the blocks kept on disk
            if keep_upto is not None:
                self.logged = max(self.epoch, min(recovered.durable_epoch, keep_upto))
            if self.logged < recovered.durable_epoch:
                cut_after(directory, self.logged)
        self.writer = WalWriter(directory, self.logged + 1)
        self.checkpointer = Checkpointer(directory, publish=False)
        # Every node has made epochs up to here durable (blocks record it as ``acked``): the
        # recovered epoch, which a whole-cluster restart agreed on, or less where given (a
        # rejoin restarts from an epoch peers executed, not all made durable yet).
        self._cluster_durable = self.epoch
        if cluster_durable is not None:
            self._cluster_durable = min(self.epoch, cluster_durable)
        self._unpublished: int | None = None  # a written snapshot waiting for that

    def record(
        self,
        run: LoggedEpochRun,
        on_durable: Callable[[int], None],
        on_failed: Callable[[OSError], None] | None = None,
    ) -> int:
        """Start writing the next epoch's block; ``on_durable(epoch)`` runs (on the writer's
        thread) once it is on disk, ``on_failed(error)`` if the write fails. Returns the
        epoch."""
        epoch = self.epoch + 1
        if epoch <= self.logged:  # a rejoining node re-ran it: its block is on disk already
            self.epoch = epoch
            return epoch
        block = encode_block(BlockKind.NODE, epoch, record_node_epoch(run, self._cluster_durable))
        self.writer.start(epoch, block, on_durable, on_failed)
        self.epoch = epoch
        self._maybe_checkpoint()
        return epoch

    def cluster_durable(self, epoch: int) -> None:
        """Every node has made epochs up to ``epoch`` durable (a checkpoint may go public)."""
        self._cluster_durable = max(self._cluster_durable, epoch)
        self._publish()

    def _maybe_checkpoint(self) -> None:
        self._snapshot_done(self.checkpointer.poll())
        every = self.checkpoint_every_epochs
        idle = not self.checkpointer.busy and self._unpublished is None
        if every and not self.epoch % every and idle:
            self.writer.roll(self.epoch + 1)  # waits for the block in flight first
            self._snapshot_done(self.checkpointer.start(self.db, self.epoch))

    def _snapshot_done(self, epoch: int | None) -> None:
        if epoch is not None:
            self._unpublished = epoch
            self._publish()

    def _publish(self) -> None:
        """Publish the written snapshot once its epoch is durable on every node.

        Before that, a whole-cluster restart may have to stop short of it (some node lacks
        the epoch), which a published checkpoint would make impossible for this node.
        """
        epoch = self._unpublished
        if epoch is None or epoch > self._cluster_durable:
            return
        publish(self.directory, epoch)
        self._unpublished = None
        self.writer.truncate_before(epoch + 1)  # the log and snapshots before it are not needed
        remove_old_snapshots(self.directory, epoch)

    def close(self) -> None:
        """Wait for the block and the checkpoint in flight, close the log, and record the
        newest epoch durable on every node (``ACKED``): no later block records it, and a
        restart must not take a log that lost it (its clients may have been answered) for
        one that stopped before it. After a failed write (reported as it happened: the
        node stopped on it) only the file is closed."""
        try:
            self.writer.close()
        except OSError as error:
            logger.warning("log of %s closed after a failed write: %s", self.directory, error)
            self.checkpointer.poll(wait=True)  # (its snapshot is not published)
            return
        self._snapshot_done(self.checkpointer.poll(wait=True))
        if self._cluster_durable > read_acked(self.directory):
            write_acked(self.directory, self._cluster_durable)


class NodeDurability:
    """A node server's durability: log each executed epoch, gate answers on every node's fsync.

    Nodes tell each other the newest epoch they made durable (``peer_durable``); an origin
    answers an epoch's clients only once every node has reached it (``when_durable``). At start,
    every node reports the newest epoch on its disk, and all recover up to the smallest one
    (``recover``), cutting unacknowledged blocks past it; or, when the peers are running, the
    node rejoins them (``rejoin``, see ``dgcc.wal.rejoin``). ``retained`` keeps what a
    rejoining peer may need, up to the epoch every node made durable.

    Args:
        directory: this node's data directory.
        node: this node's id; ``nodes``: how many nodes.
        checkpoint_every_epochs: forked checkpoint after every this many epochs; 0 = never.
    """

    def __init__(
        self, directory: Path, node: int, nodes: int, checkpoint_every_epochs: int = 0
    ) -> None:
        self.directory = directory
        self.node = node
        self.checkpoint_every_epochs = checkpoint_every_epochs
        self.log: NodeLog | None = None
        self.broadcast: Callable[[int], None] = lambda epoch: None  # set by the node
        self.failed: Callable[[OSError], None] = lambda error: None  # (a block's write failed)
        # "restarting, my log ends at epoch E (new: the directory holds no log yet), and it
        # records epoch A as durable on every node"
        self.announce: Callable[[int, bool, int], None] = lambda epoch, new, acked: None
        self.retained = Retained(node)
        self.rejoin: RejoinPlan | None = None  # set by ``recover`` when the peers run
        self._states: dict[int, Any] = {}  # running peer -> what it keeps for this node
        self._refused: list[str] = []
        self._durable = [-1] * nodes  # per node: newest durable epoch it reported
        self._new: set[int] = set()  # restarting nodes whose directory holds no log
        self._acked = 0  # the newest epoch a restarting node's log records as durable on all
        self._acked_by = self.node  # (the node whose log records it)
        self._reported = asyncio.Event()
        self._held: list[tuple[int, Callable[[], None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def on_disk(self) -> int:
        """The newest intact epoch in the directory (0 when it is new)."""
        return self._disk()[0]

    def _disk(self) -> tuple[int, int]:
        """(the newest intact epoch, the newest epoch the log records as durable on every
        node: its checkpoint's, the last block's ``acked``, or the ``ACKED`` record of its last
        stop); (0, 0) when it is new."""
        manifest = read_manifest(self.directory) if self.directory.exists() else None
        if manifest is None:
            return 0, 0
        blocks, _ = read_log(self.directory, manifest[0])
        acked = acked_epoch(self.directory, manifest[0], blocks)
        return (blocks[-1].epoch if blocks else manifest[0]), acked

    @property
    def durable_epoch(self) -> int:
        """The newest epoch this node made durable."""
        return self._durable[self.node]

    async def recover(
        self,
        registry: ProcedureRegistry,
        router: Router,
        initial: Callable[[], Database],
        schema: Callable[[], Database],
        run_class: type[EpochRun] = EpochRun,
    ) -> tuple[Database, int]:
        """Agree with the peers on the epoch to restart from, recover to it; (db, epoch).

        Peers restarting too report the end of their logs, and every node recovers to the
        smallest (a whole-cluster restart). Running peers answer with what they keep for this
        node instead (``peer_rejoin``): the node recovers to the plan's ``restart`` epoch and
        ``rejoin`` holds the rest of the plan. ``run_class`` replays the log's epochs (the
        node's epoch run, not its logged variant).

        Raises:
            RejoinError: a peer refused the rejoin, some peers run while others restart, or
                in a whole-cluster restart some nodes start with a new directory while others
                hold logged epochs (recovering to the smallest would drop those, which may
                have been answered: the lost directories must come back first).
        """
        self._loop = asyncio.get_running_loop()
        on_disk, acked = self._disk()
        new = not self.directory.exists() or read_manifest(self.directory) is None
        self.peer_restarting(self.node, on_disk, new, acked)
        self.announce(on_disk, new, acked)
        await self._reported.wait()
        if self._refused:
            raise RejoinError(self._refused[0])
        if self._states:
            return self._rejoin(on_disk, registry, router, initial, schema, run_class)
        holders = {n: e for n, e in enumerate(self._durable) if e > 0 and n not in self._new}
        if self._new and holders:
            raise RejoinError(
                f"nodes {sorted(self._new)} start with no log while nodes {sorted(holders)} "
                f"hold logged epochs (up to {max(holders.values())}): recovering would drop "
                "them; give each node the data dir it wrote (or start afresh in a new data dir)"
            )
        upto = cluster_durable_epoch(self._durable)
        short = {n: e for n, e in enumerate(self._durable) if e < self._acked}
        if short:
            raise RejoinError(
                f"the logs of nodes {sorted(short)} end at epochs {list(short.values())}, before "
                f"epoch {self._acked}, which node {self._acked_by}'s log records as durable on "
                "every node (clients may have been answered for it): those logs are damaged or "
                "not the ones the nodes wrote; nothing was cut (give each node the data dir it "
                "wrote)"
            )
        self.log = NodeLog(
            self.directory,
            self.node,
            registry,
            router,
            initial,
            schema,
            upto_epoch=upto,
            checkpoint_every_epochs=self.checkpoint_every_epochs,
            run_class=run_class,
        )
        assert self.log.epoch == upto, f"node {self.node} recovered {self.log.epoch}, not {upto}"
        self._durable = [upto] * len(self._durable)
        if upto:
            logger.info("node %d restarts after epoch %d", self.node, upto)
        else:  # (a new data dir, or a cluster that never made an epoch durable)
            logger.info("node %d starts at epoch 0", self.node)
        return self.log.db, upto

    def _rejoin(
        self,
        on_disk: int,
        registry: ProcedureRegistry,
        router: Router,
        initial: Callable[[], Database],
        schema: Callable[[], Database],
        run_class: type[EpochRun],
    ) -> tuple[Database, int]:
        """Recover to the epoch the running peers' answers call for; keep the log's tail as far
        as the plan re-runs it with the same inputs (``plan.closed``).

        Blocks past that come from epochs no running peer has this node's inputs of: a life
        before a whole-cluster restart that cut the others' logs while this node died before
        cutting its own, or an epoch it closed and logged but whose inputs never left. The
        peers run those epochs anew with other calls, so the blocks are cut; kept, they would
        stand for the new epochs (``record`` writes no block it thinks it has) and a later
        recovery would replay the old calls.
        """
        restarting = [n for n in range(len(self._durable)) if n != self.node]
        restarting = [n for n in restarting if n not in self._states]
        if restarting:
            raise RejoinError(
                f"nodes {sorted(self._states)} are running but nodes {restarting} restart too: "
                f"node {self.node} cannot rejoin (restart them all, or one at a time)"
            )
        try:
            plan = plan_rejoin(self.node, on_disk, self._states)
        except (KeyError, TypeError, ValueError, IndexError) as error:  # a peer's garbled answer
            raise RejoinError(
                f"node {self.node} cannot rejoin: a peer's rejoin answer is ill-shaped "
                f"({type(error).__name__}: {error})"
            ) from None
        self.log = NodeLog(
            self.directory,
            self.node,
            registry,
            router,
            initial,
            schema,
            upto_epoch=plan.restart,
            checkpoint_every_epochs=self.checkpoint_every_epochs,
            run_class=run_class,
            keep_upto=plan.closed,
            cluster_durable=cluster_durable_epoch(self._durable),
        )
        logged = self.log.logged
        assert self.log.epoch == plan.restart, f"recovered {self.log.epoch}, not {plan.restart}"
        assert logged == min(on_disk, plan.closed), f"log ends at {logged}, not {plan.closed}"
        if logged < on_disk:
            self._durable[self.node] = logged  # (announced as on_disk; peer_durable only rises)
            logger.warning(
                "node %d cut epochs %d..%d off its log: no running peer has its inputs of "
                "them (a life before a whole-cluster restart, or inputs that never left)",
                *(self.node, logged + 1, on_disk),
            )
        self.rejoin = plan
        self.log.cluster_durable(cluster_durable_epoch(self._durable))
        self.broadcast(logged)  # the peers answer their clients as epochs become durable
        return self.log.db, plan.restart

    def executed(self, run: LoggedEpochRun) -> None:
        """Start the group commit of the epoch ``run`` just finished."""
        assert self.log is not None and self._loop is not None, "recover first"
        loop = self._loop
        self.log.record(
            run,
            lambda epoch: loop.call_soon_threadsafe(self._durable_here, epoch),
            lambda error: loop.call_soon_threadsafe(self.failed, error),
        )

    def _durable_here(self, epoch: int) -> None:
        self.broadcast(epoch)
        self.peer_durable(self.node, epoch)

    def peer_rejoin(self, node: int, state: dict[str, Any] | str) -> None:
        """Running peer ``node`` answered this node's restart: what it keeps, or a refusal."""
        if isinstance(state, str):
            self._refused.append(state)
            self._reported.set()
            return
        self._states[node] = state
        self.peer_durable(node, state["durable"])

    def peer_restarting(self, node: int, epoch: int, new: bool, acked: int = 0) -> None:
        """Node ``node`` restarts too (a whole-cluster restart), its log ending at ``epoch``;
        ``new``: its directory holds no log yet; ``acked``: the newest epoch its log records as
        durable on every node."""
        if new:
            self._new.add(node)
        if acked > self._acked:
            self._acked, self._acked_by = acked, node
        self.peer_durable(node, epoch)

    def peer_durable(self, node: int, epoch: int) -> None:
        """Node ``node`` has made every epoch up to ``epoch`` durable."""
        if epoch <= self._durable[node]:
            return
        self._durable[node] = epoch
        if min(self._durable) >= 0:
            self._reported.set()
        if self.log is not None:
            self.log.cluster_durable(cluster_durable_epoch(self._durable))
            self.retained.drop_before(cluster_durable_epoch(self._durable))
        if self.log is not None and self._held:
            ready = cluster_durable_epoch(self._durable)
            held, self._held = self._held, []
            for waits_for, answer in held:
                if waits_for <= ready:
                    answer()
                else:
                    self._held.append((waits_for, answer))

    def when_durable(self, epoch: int, answer: Callable[[], None]) -> None:
        """Call ``answer`` once every node has made ``epoch`` durable (now, if they have)."""
        if epoch <= cluster_durable_epoch(self._durable):
            answer()
        else:
            self._held.append((epoch, answer))

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def node_directory(config: ClusterConfig, node: int) -> Path:
    """Where node ``node`` of ``config`` logs (``config.data_dir`` must be set)."""
    assert config.data_dir is not None, "a cluster without data_dir logs nowhere"
    return Path(config.data_dir) / f"node{node}"


def node_layout(config: ClusterConfig, node: int) -> dict[str, Any]:
    """What node ``node``'s directory records of its cluster (``LAYOUT``): protocol, node
    count, partition map and node id."""
    return {"protocol": config.protocol, "nodes": len(config.nodes), "node": node,
            "partition_nodes": list(config.placement().partition_nodes)}  # fmt: skip


def node_durability(config: ClusterConfig, node: int) -> NodeDurability | None:
    """The durability of node ``node`` of ``config``: None unless ``config.data_dir`` is set.
    A new directory records the cluster's workload and layout (protocol, node count, partition
    map, node id); one that records another is refused.

    The epoch log serves DistDGCC and Calvin; the 2PC servers replace it with their own.
    """
    if config.data_dir is None:
        return None
    directory = node_directory(config, node)
    check_workload_record(directory, config.workload, config.workload_options, claim=True)
    check_layout_record(directory, node_layout(config, node), claim=True)
    return NodeDurability(directory, node, len(config.nodes), config.checkpoint_every_epochs)
