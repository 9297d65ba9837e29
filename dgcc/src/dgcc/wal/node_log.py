"""Dependency logging for a DistDGCC node: one block per node per epoch, recovery alone.

A node's block holds what it needs to redo its own share of the epoch without any peer: the
epoch's input batches as this node saw them (every origin's calls in global order, ``None``
for calls routed elsewhere), and the value entries it received from other nodes (outputs,
logic-abort decisions and errors of remote pieces). Replay rebuilds the node's ``EpochRun``
from the inputs, delivers every logged value up front, and runs the pieces by in-degree;
nothing is sent, and values that peers needed are simply dropped. A failed node therefore
recovers alone while the others keep their state, and a whole cluster restarts by having every
node replay up to the newest epoch that all nodes made durable (``cluster_durable_epoch``).

Replay re-plans the node's transactions and rebuilds its local graph (as at run time); the
single-node engine's faster replay over logged edges (``dependency``) is not used here yet.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgcc.api import ProcedureRegistry, TxnRequest
from dgcc.cluster import ClusterConfig
from dgcc.errors import ConfigError, DgccError
from dgcc.protocols.dist_dgcc import EpochRun, Router
from dgcc.storage import Database
from dgcc.wal.checkpoint import (
    Checkpointer,
    load_snapshot,
    publish,
    read_manifest,
    remove_old_snapshots,
    write_checkpoint,
)
from dgcc.wal.crashpoints import crashpoint
from dgcc.wal.format import BlockKind, WalCorrupt, decode_payload, encode_block
from dgcc.wal.recovery import cut_after, read_log
from dgcc.wal.writer import WalWriter

__all__ = [
    "LoggedEpochRun",
    "NodeDurability",
    "NodeLog",
    "NodeRecovered",
    "cluster_durable_epoch",
    "node_durability",
    "recover_node",
    "replay_node_epoch",
]

logger = logging.getLogger(__name__)

STEP_PIECES_MAX = 1 << 30


class LoggedEpochRun(EpochRun):
    """An ``EpochRun`` that keeps its inputs and the value entries delivered to it."""

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
        super().__init__(node, db, registry, router, batches)

    def deliver(self, entries: Sequence[Sequence[Any]]) -> None:
        self.received.append(entries)
        super().deliver(entries)


def record_node_epoch(run: LoggedEpochRun) -> dict[str, Any]:
    """The block payload of an executed epoch."""
    assert run.finished, f"logging an epoch with {run.remaining} pieces left"
    inputs = [
        [None if request is None else (request.procedure, request.params) for request in batch]
        for batch in run.inputs
    ]
    return {"node": run.node, "inputs": inputs, "values": run.received}


def replay_node_epoch(
    node: int, db: Database, registry: ProcedureRegistry, router: Router, payload: dict[str, Any]
) -> int:
    """Redo one logged epoch of ``node`` on ``db`` alone; returns the pieces run.

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
    run = EpochRun(node, db, registry, router, batches)
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


def recover_node(
    directory: Path,
    node: int,
    schema: Callable[[], Database],
    registry: ProcedureRegistry,
    router: Router,
    *,
    upto_epoch: int | None = None,
    repair: bool = True,
) -> NodeRecovered:
    """Rebuild node ``node``'s state from its own directory, alone.

    Args:
        upto_epoch: stop after this epoch (a whole-cluster restart replays only the epochs
            every node made durable); None = every intact block.

    Raises:
        WalCorrupt: no checkpoint, damage that is not a torn tail, a block of another node,
            or a checkpoint newer than ``upto_epoch``.
    """
    manifest = read_manifest(directory)
    if manifest is None:
        raise WalCorrupt(f"{directory}: no checkpoint manifest; nothing to recover from")
    checkpoint_epoch, snapshot = manifest
    if upto_epoch is not None and checkpoint_epoch > upto_epoch:
        raise WalCorrupt(f"{directory}: checkpoint {checkpoint_epoch} is past epoch {upto_epoch}")
    db = load_snapshot(snapshot, checkpoint_epoch, schema)
    gc.freeze()  # the loaded rows are long-lived: full collections during replay skip them
    blocks, dropped = read_log(directory, checkpoint_epoch, repair=repair)
    durable = blocks[-1].epoch if blocks else checkpoint_epoch
    if upto_epoch is not None:
        blocks = [block for block in blocks if block.epoch <= upto_epoch]
    for count, block in enumerate(blocks, 1):
        if block.kind is not BlockKind.NODE:
            raise WalCorrupt(f"epoch {block.epoch}: a {block.kind.name} block in a node log")
        replay_node_epoch(node, db, registry, router, decode_payload(block))
        if count == len(blocks) // 2:
            crashpoint("recovery.mid_replay")
    epoch = blocks[-1].epoch if blocks else checkpoint_epoch
    logger.info("node %d recovered epoch %d (checkpoint %d)", node, epoch, checkpoint_epoch)
    return NodeRecovered(db, epoch, checkpoint_epoch, durable, dropped)


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
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.node = node
        self.checkpoint_every_epochs = checkpoint_every_epochs
        if read_manifest(directory) is None:
            self.db, self.epoch = initial(), 0
            write_checkpoint(directory, self.db, 0)
        else:
            recovered = recover_node(
                directory, node, schema, registry, router, upto_epoch=upto_epoch
            )
            self.db, self.epoch = recovered.db, recovered.epoch
            if recovered.durable_epoch > self.epoch:
                cut_after(directory, self.epoch)
        self.writer = WalWriter(directory, self.epoch + 1)
        self.checkpointer = Checkpointer(directory, publish=False)
        self._cluster_durable = self.epoch  # every node has made epochs up to here durable
        self._unpublished: int | None = None  # a written snapshot waiting for that

    def record(self, run: LoggedEpochRun, on_durable: Callable[[int], None]) -> int:
        """Start writing the next epoch's block; ``on_durable(epoch)`` runs (on the writer's
        thread) once it is on disk. Returns the epoch."""
        epoch = self.epoch + 1
        block = encode_block(BlockKind.NODE, epoch, record_node_epoch(run))
        self.writer.start(epoch, block, on_durable)
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
        """Wait for the block and the checkpoint in flight, and close the log."""
        self.writer.wait()
        self._snapshot_done(self.checkpointer.poll(wait=True))
        self.writer.close()


class NodeDurability:
    """A node server's durability: log each executed epoch, gate answers on every node's fsync.

    Nodes tell each other the newest epoch they made durable (``peer_durable``); an origin
    answers an epoch's clients only once every node has reached it (``when_durable``). At start,
    every node reports the newest epoch on its disk, and all recover up to the smallest one
    (``recover``), cutting unacknowledged blocks past it.

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
        self._durable = [-1] * nodes  # per node: newest durable epoch it reported
        self._reported = asyncio.Event()
        self._held: list[tuple[int, Callable[[], None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def on_disk(self) -> int:
        """The newest intact epoch in the directory (0 when it is new)."""
        manifest = read_manifest(self.directory) if self.directory.exists() else None
        if manifest is None:
            return 0
        blocks, _ = read_log(self.directory, manifest[0], repair=False)
        return blocks[-1].epoch if blocks else manifest[0]

    async def recover(
        self,
        registry: ProcedureRegistry,
        router: Router,
        initial: Callable[[], Database],
        schema: Callable[[], Database],
    ) -> tuple[Database, int]:
        """Agree with the peers on the epoch to restart from, recover to it; (db, epoch)."""
        self._loop = asyncio.get_running_loop()
        self.peer_durable(self.node, self.on_disk())
        self.broadcast(self._durable[self.node])
        await self._reported.wait()
        upto = cluster_durable_epoch(self._durable)
        self.log = NodeLog(
            self.directory,
            self.node,
            registry,
            router,
            initial,
            schema,
            upto_epoch=upto,
            checkpoint_every_epochs=self.checkpoint_every_epochs,
        )
        assert self.log.epoch == upto, f"node {self.node} recovered {self.log.epoch}, not {upto}"
        self._durable = [upto] * len(self._durable)
        logger.info("node %d restarts after epoch %d", self.node, upto)
        return self.log.db, upto

    def executed(self, run: LoggedEpochRun) -> None:
        """Start the group commit of the epoch ``run`` just finished."""
        assert self.log is not None and self._loop is not None, "recover first"
        loop = self._loop
        self.log.record(run, lambda epoch: loop.call_soon_threadsafe(self._durable_here, epoch))

    def _durable_here(self, epoch: int) -> None:
        self.broadcast(epoch)
        self.peer_durable(self.node, epoch)

    def peer_durable(self, node: int, epoch: int) -> None:
        """Node ``node`` has made every epoch up to ``epoch`` durable."""
        if epoch <= self._durable[node]:
            return
        self._durable[node] = epoch
        if min(self._durable) >= 0:
            self._reported.set()
        if self.log is not None:
            self.log.cluster_durable(cluster_durable_epoch(self._durable))
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


def node_durability(config: ClusterConfig, node: int) -> NodeDurability | None:
    """The durability of node ``node`` of ``config``: None unless ``config.data_dir`` is set.

    Raises:
        ConfigError: logging asked for a protocol other than DistDGCC.
    """
    if config.data_dir is None:
        return None
    if config.protocol != "dgcc":
        raise ConfigError(
            f"data_dir (dependency logging) needs protocol dgcc, not {config.protocol!r}"
        )
    directory = Path(config.data_dir) / f"node{node}"
    return NodeDurability(directory, node, len(config.nodes), config.checkpoint_every_epochs)
