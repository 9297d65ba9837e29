"""A single-node durable engine: runs a protocol epoch by epoch, logs each epoch, then acks.

An outcome may be given to its client only once its epoch's block is on disk (one write, one
fsync). ``submit`` runs an epoch and starts its write in the background, returning the epochs
that have become durable meanwhile, so the fsync of epoch e overlaps the execution of e + 1;
``flush`` waits for the last one. ``run_epoch`` does both for one epoch. The logging mode is a
run-time setting: ``none | command | value | dependency`` (``wal/``). Checkpoints are taken every
``checkpoint_every_epochs`` epochs by a forked child; the log is truncated when one completes.
Opening a directory that holds a checkpoint recovers from it. A new directory records the
workload that writes it, when the config names one (``dgcc recover`` reads it).
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgcc.api import Outcome, PlannedTxn, ProcedureRegistry, TxnRequest
from dgcc.errors import ConfigError, DgccError
from dgcc.protocols import get_protocol
from dgcc.protocols.dgcc import DgccProtocol, Graph
from dgcc.storage import Database
from dgcc.wal import command, dependency, parallel, value
from dgcc.wal.checkpoint import (
    LAYOUT_RECORD,
    Checkpointer,
    check_workload_record,
    read_manifest,
    remove_old_snapshots,
    write_checkpoint,
)
from dgcc.wal.dirlock import DirLock
from dgcc.wal.format import BlockKind, encode_block
from dgcc.wal.recovery import no_checkpoint, recover
from dgcc.wal.writer import WalWriter, list_segments

__all__ = ["LOG_MODES", "Acked", "DurableConfig", "DurableEngine"]

logger = logging.getLogger(__name__)

LOG_MODES = ("none", "command", "value", "dependency")


@dataclass(frozen=True)
class DurableConfig:
    """Durability settings of one node.

    Args:
        directory: where the log segments, snapshots and manifest live (created if missing).
        mode: one of ``LOG_MODES``.
        protocol: the protocol running each epoch (``dependency`` needs ``dgcc``; ``command``
            a deterministic one, whose epoch equals the requests run serially in batch order,
            which is how recovery replays them).
        checkpoint_every_epochs: take a checkpoint after every this many epochs; 0 = never
            (besides the initial one written when the directory is new).
        fork_checkpoint: write checkpoints from a forked child without stopping epochs.
        recovery_workers: dependency replay workers: processes, one per group of partitions,
            when the log recorded partitions, else logical workers in this process.
        sync: fsync each block (off only to measure fsync's share of the cost).
        partitions: with ``dependency``, also log each piece's partition (of this many) and the
            values crossing partitions, so recovery can replay partitions in parallel
            processes; 0 = off. Needs ``partition_of`` on the engine.
        workload: the name of the workload whose procedures and data the engine runs, or None;
            a new directory records it with ``workload_options`` (JSON values), so recovery
            rebuilds that workload and refuses another.
        workload_options: that workload's options.
    """

    directory: Path
    mode: str = "dependency"
    protocol: str = "dgcc"
    checkpoint_every_epochs: int = 0
    fork_checkpoint: bool = True
    recovery_workers: int = 1
    sync: bool = True
    partitions: int = 0
    workload: str | None = None
    workload_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in LOG_MODES:
            raise ConfigError(f"unknown logging mode {self.mode!r}; choose one of {LOG_MODES}")
        if self.mode == "dependency" and self.protocol != "dgcc":
            raise ConfigError(f"mode 'dependency' needs protocol 'dgcc', got {self.protocol!r}")
        if self.mode == "command" and not get_protocol(self.protocol).deterministic:
            raise ConfigError(
                f"mode 'command' needs a deterministic protocol (recovery replays the logged "
                f"requests serially in batch order, which {self.protocol!r} does not reproduce: "
                "it may abort or reorder them); use mode 'value' with it"
            )
        every = self.checkpoint_every_epochs
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ConfigError(f"checkpoint_every_epochs must be an int >= 0, got {every!r}")
        parts = self.partitions
        if isinstance(parts, bool) or not isinstance(parts, int) or not 0 <= parts <= 4096:
            raise ConfigError(f"partitions must be in 0..4096, got {parts!r}")
        workers = self.recovery_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 1024:
            raise ConfigError(f"recovery_workers must be in 1..1024, got {workers!r}")
        if self.workload is not None and not isinstance(self.workload, str):
            raise ConfigError(f"workload must be a name, got {self.workload!r}")
        if self.workload is None and self.workload_options:
            raise ConfigError(f"workload_options {dict(self.workload_options)} without a workload")
        try:
            json.dumps(dict(self.workload_options))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"workload_options must be JSON values: {error}") from None


@dataclass(frozen=True, slots=True)
class Acked:
    """An epoch whose block is durable, with its outcomes: these may now be answered."""

    epoch: int
    outcomes: list[Outcome]


class DurableEngine:
    """One node's engine with durability; see the module docstring.

    Args:
        config: the durability settings.
        registry: the procedures.
        schema: returns empty tables with their indexes (to load checkpoints into).
        initial: returns the initial database, used only when the directory is new.
        partition_of: ``partition_of(key, partitions)`` (a workload's), when
            ``config.partitions`` is set.
        route_keys: the workload's ``route_keys(procedure, params)``: with partitions, a
            transaction it routes to one partition is logged without looking at its pieces.
    """

    def __init__(
        self,
        config: DurableConfig,
        registry: ProcedureRegistry,
        schema: Callable[[], Database],
        initial: Callable[[], Database],
        partition_of: Callable[[Hashable, int], int] | None = None,
        route_keys: parallel.RouteKeys | None = None,
    ) -> None:
        if config.partitions and partition_of is None:
            raise ConfigError(f"partitions={config.partitions} needs a partition_of function")
        self.config = config
        self._partition_of = partition_of
        self._partition_cache: dict[Hashable, int] = {}
        self._route_keys = route_keys
        self.registry = registry
        directory = Path(config.directory)
        if (directory / LAYOUT_RECORD).exists():
            raise ConfigError(
                f"{directory} holds a cluster node's log ({LAYOUT_RECORD}): run it as that "
                "node (dgcc cluster start / dgcc node), or give this engine its own directory"
            )
        # One process at a time, as a node: `dgcc recover` never cuts the tail of a log this
        # engine is still writing, nor do two engines share a directory (freed by ``close``,
        # or by the kernel however the process ends).
        self._lock = DirLock(directory, "a DurableEngine")
        try:
            self._open(directory, schema, initial)
        except BaseException:
            self._lock.release()
            raise

    def _open(
        self, directory: Path, schema: Callable[[], Database], initial: Callable[[], Database]
    ) -> None:
        """The rest of ``__init__``, under the directory's lock: recover or start the log."""
        config, registry = self.config, self.registry
        fresh = read_manifest(directory) is None
        if fresh and list_segments(directory):  # a log without its checkpoint: not ours to start
            raise no_checkpoint(directory)
        if config.workload is not None:  # a new directory records it; a reopened one must match
            check_workload_record(directory, config.workload, config.workload_options, claim=fresh)
        self.recovered = None
        if fresh:
            self.db = initial()
            write_checkpoint(directory, self.db, 0)
            self.epoch = 0
        else:
            self.recovered = recover(directory, schema, registry, workers=config.recovery_workers)
            self.db, self.epoch = self.recovered.db, self.recovered.epoch
        gc.freeze()  # as a node does: full collections skip the long-lived loaded rows
        self.protocol = get_protocol(config.protocol)(self.db, registry)
        self._graph: tuple[list[PlannedTxn], Graph] | None = None
        if config.mode == "dependency":
            assert isinstance(self.protocol, DgccProtocol)
            self.protocol.graph_sink = self._keep_graph
        self._tracker = value.WriteTracker(self.db) if config.mode == "value" else None
        self.writer = WalWriter(directory, self.epoch + 1, sync=config.sync)
        self.checkpointer = Checkpointer(directory, fork=config.fork_checkpoint)
        self._pending: Acked | None = None
        self._broken: str | None = None  # why an epoch failed midway (``submit``)

    def _keep_graph(self, txns: list[PlannedTxn], graph: Graph) -> None:
        self._graph = (txns, graph)

    def run_epoch(self, batch: Sequence[TxnRequest]) -> list[Outcome]:
        """Run one epoch, make it durable, and return its (now acknowledgeable) outcomes."""
        acked = self.submit(batch) + self.flush()
        assert acked[-1].epoch == self.epoch, f"acked {acked[-1].epoch}, ran {self.epoch}"
        return acked[-1].outcomes

    def submit(self, batch: Sequence[TxnRequest]) -> list[Acked]:
        """Run one epoch and start its write; returns the earlier epochs now durable.

        Raises:
            DgccError: an earlier epoch failed after it began to change the tables (its run,
                its log block or its write raised): the tables may hold changes the log does
                not, so no epoch may follow them; reopen the directory to recover.
        """
        if self._broken is not None:
            raise DgccError(
                f"this engine stopped at epoch {self.epoch + 1} ({self._broken}); the tables "
                "may be ahead of the log: reopen the directory to recover from it"
            )
        epoch = self.epoch + 1
        try:
            outcomes = self.protocol.run_batch(batch)
            block = None
            if self.config.mode != "none":
                kind, payload = self._payload(batch)
                block = encode_block(kind, epoch, payload)
            acked = self.flush()  # the previous epoch's fsync ran while this one executed
            if block is None:
                self.writer.skip(epoch)
            else:
                self.writer.start(epoch, block)
        except BaseException as error:
            self._broken = f"{type(error).__name__}: {error}"
            raise
        self._pending = Acked(epoch, outcomes)
        self.epoch = epoch
        self._maybe_checkpoint()
        return acked

    def flush(self) -> list[Acked]:
        """Wait until every submitted epoch is durable; returns those not yet returned."""
        self.writer.wait()
        acked = [] if self._pending is None else [self._pending]
        self._pending = None
        return acked

    def _payload(self, batch: Sequence[TxnRequest]) -> tuple[BlockKind, object]:
        mode = self.config.mode
        if mode == "command":
            return BlockKind.COMMAND, command.record_epoch(batch)
        if mode == "value":
            assert self._tracker is not None
            return BlockKind.VALUE, value.record_epoch(self.db, self._tracker.take())
        assert self._graph is not None, "dgcc did not report the epoch's graph"
        txns, graph = self._graph
        self._graph = None
        partitioning = None
        if self.config.partitions:
            partitioning = (
                self.config.partitions,
                *parallel.record_partitions(
                    txns, self._partition, self._partition_cache, self._route_keys
                ),
            )
        return BlockKind.DEPENDENCY, dependency.record_epoch(batch, txns, graph, partitioning)

    def _partition(self, key: Hashable) -> int:
        assert self._partition_of is not None
        return self._partition_of(key, self.config.partitions)

    def _maybe_checkpoint(self) -> None:
        self._finish_checkpoint(self.checkpointer.poll())
        every = self.config.checkpoint_every_epochs
        if not every or self.epoch % every or self.checkpointer.busy:
            return
        # The log after the checkpoint starts a new segment (``roll`` first waits for the block
        # in flight, so no writer thread is alive at the fork).
        self.writer.roll(self.epoch + 1)
        self._finish_checkpoint(self.checkpointer.start(self.db, self.epoch))

    def _finish_checkpoint(self, epoch: int | None) -> None:
        if epoch is None:
            return
        self.writer.truncate_before(epoch + 1)
        remove_old_snapshots(Path(self.config.directory), epoch)
        logger.debug("checkpoint of epoch %d complete", epoch)

    def close(self) -> None:
        """Wait for an in-flight checkpoint and close the log (``flush`` first to get acks)."""
        try:
            self._finish_checkpoint(self.checkpointer.poll(wait=True))
            self.writer.close()
        finally:
            self._lock.release()
