"""Recovery: load the newest checkpoint, then replay the intact log epochs after it.

Each block is replayed by its own scheme: command (serial re-execution), value (install the
after-images) or dependency (re-execution over the logged graph; see ``dependency``, and
``parallel`` for worker processes over partitions, which each load the checkpoint). A torn or
damaged tail of the *last* segment is an epoch that was never acknowledged: it is reported
(file, offset, reason), cut off the file, and dropped. Damage anywhere else would lose
acknowledged epochs and raises ``WalCorrupt``. Recovery changes nothing on disk besides that
cut, so a crash during recovery followed by recovery gives the same state.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dgcc.api import ProcedureRegistry
from dgcc.storage import Database, collector_paused
from dgcc.wal import command, dependency, parallel, value
from dgcc.wal.checkpoint import load_snapshot, read_manifest
from dgcc.wal.crashpoints import crashpoint
from dgcc.wal.format import Block, BlockKind, WalCorrupt, decode_payload, scan_bytes
from dgcc.wal.writer import fsync_dir, list_segments

__all__ = ["Recovered", "cut_after", "no_checkpoint", "read_log", "recover", "replay_block"]

logger = logging.getLogger(__name__)


@dataclass
class Recovered:
    db: Database
    epoch: int  # the last durable epoch: state = checkpoint + log up to here
    checkpoint_epoch: int
    replayed_epochs: int
    dropped: list[str] = field(default_factory=list)  # messages about dropped tails
    timing_s: dict[str, float] = field(default_factory=dict)


def read_log(directory: Path, after_epoch: int) -> tuple[list[Block], list[str]]:
    """The intact blocks with epochs above ``after_epoch``, in order, and the drop messages.

    Reads only: a torn tail is dropped from the result, and a caller that recovers cuts it
    off the disk (``cut_torn_tail``) once its own checks passed too.

    Raises:
        WalCorrupt: damage that is not a torn tail (in an earlier segment, or with an intact
            block after it): recovery stops before changing anything. A segment whose epochs
            the checkpoint holds (the next one starts by ``after_epoch + 1``) is not read.
    """
    segments = list_segments(directory)
    blocks: list[Block] = []
    dropped: list[str] = []
    expected = after_epoch + 1
    for position, (_, path) in enumerate(segments):
        if position + 1 < len(segments) and segments[position + 1][0] <= after_epoch + 1:
            continue  # every epoch of it is in the checkpoint: not read (nor its damage)
        scan = scan_bytes(path.read_bytes(), str(path))
        if scan.problem is not None:
            if position != len(segments) - 1:
                raise WalCorrupt(f"damage before the log's end: {scan.damage}; nothing was changed")
            scan.refuse_damage()
            dropped.append(scan.problem)  # (said once the caller cuts it: `cut_torn_tail`)
        for block in scan.blocks:
            if block.epoch <= after_epoch:
                continue
            if block.epoch != expected:
                raise WalCorrupt(
                    f"{path}: the log jumps to epoch {block.epoch} at offset {block.offset}, "
                    f"expected epoch {expected} (a segment of {directory} missing, or one out "
                    "of place); nothing was changed"
                )
            blocks.append(block)
            expected += 1
    return blocks, dropped


def cut_torn_tail(directory: Path) -> None:
    """Cut the torn tail ``read_log`` reported off the last segment (after the caller's own
    checks passed: an error on the way leaves the log as it was)."""
    segments = list_segments(directory)
    if segments:
        path = segments[-1][1]
        scan = scan_bytes(path.read_bytes(), str(path))
        if scan.problem is not None:
            scan.refuse_damage()
            logger.warning("%s", scan.problem)
            _cut(path, scan.valid_bytes)


def cut_after(directory: Path, epoch: int) -> None:
    """Drop every log block past ``epoch`` (unacknowledged epochs a restart must not keep)."""
    for _, path in reversed(list_segments(directory)):
        scan = scan_bytes(path.read_bytes(), str(path))
        if not scan.blocks and path != list_segments(directory)[0][1]:
            path.unlink()  # an empty segment rolled to after a checkpoint: look further back
            fsync_dir(directory)
            continue
        later = [block for block in scan.blocks if block.epoch > epoch]
        if not later:
            return
        if len(later) == len(scan.blocks) and path != list_segments(directory)[0][1]:
            path.unlink()
            fsync_dir(directory)
            continue
        _cut(path, later[0].offset)
        logger.warning("%s: dropped unacknowledged epochs %d..", path, later[0].epoch)


def no_checkpoint(directory: Path) -> WalCorrupt:
    """The error for ``directory`` without a checkpoint manifest, saying what it holds instead.

    A 2PC node's log (``twopc_log``) never has one: its branches in doubt need their
    coordinators' decisions, so only the restarted node recovers it, from its cluster.
    """
    segments = list_segments(directory)
    if not segments:
        return WalCorrupt(f"{directory}: no checkpoint manifest and no log: nothing to recover")
    first = scan_bytes(segments[0][1].read_bytes(), str(segments[0][1])).blocks
    if first and first[0].kind is BlockKind.TWOPC:
        return WalCorrupt(
            f"{directory} is a 2PC node's log: it has no checkpoint and its transactions in "
            "doubt need their coordinators' decisions, so it cannot be recovered offline; "
            "restart its whole cluster (dgcc cluster stop, then dgcc cluster start, or every "
            "node with dgcc node): each node redoes its log (2PC nodes do not rejoin running "
            "peers)"
        )
    return WalCorrupt(f"{directory}: a log but no checkpoint manifest; nothing to recover from")


def _cut(path: Path, valid_bytes: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, valid_bytes)
        os.fsync(fd)
    finally:
        os.close(fd)


def replay_block(
    db: Database, registry: ProcedureRegistry, block: Block, *, workers: int = 1
) -> None:
    """Apply one epoch's block to ``db`` according to its scheme."""
    payload = decode_payload(block)
    if block.kind is BlockKind.COMMAND:
        command.replay_epoch(db, registry, payload)
    elif block.kind is BlockKind.VALUE:
        value.replay_epoch(db, payload)
    elif block.kind is BlockKind.DEPENDENCY:
        dependency.replay_epoch(db, registry, payload, workers=workers)
    elif block.kind is BlockKind.NODE:
        raise WalCorrupt(
            f"epoch {block.epoch}: a cluster node's log block: recover it with --cluster CONFIG "
            "--node ID"
        )
    else:
        raise WalCorrupt(f"epoch {block.epoch}: a {block.kind.name} block is not a log block")


def _partitioned_payloads(blocks: list[Block]) -> list[dict] | None:
    """The decoded payloads when every block is a splittable dependency epoch, else None."""
    if not blocks or any(block.kind is not BlockKind.DEPENDENCY for block in blocks):
        return None
    payloads = [decode_payload(block) for block in blocks]
    if not all(parallel.splittable(payload) for payload in payloads):
        return None
    if len({payload["partitions"] for payload in payloads}) != 1:
        return None
    return payloads


def _replay_serially(
    db: Database, registry: ProcedureRegistry, blocks: list[Block], workers: int
) -> None:
    for count, block in enumerate(blocks, 1):
        replay_block(db, registry, block, workers=workers)
        if count == len(blocks) // 2:
            crashpoint("recovery.mid_replay")


def recover(
    directory: Path,
    schema: Callable[[], Database],
    registry: ProcedureRegistry,
    *,
    workers: int = 1,
    repair: bool = True,
) -> Recovered:
    """Rebuild the state of the last durable epoch from ``directory``.

    Args:
        schema: returns the empty tables (with their indexes) to load the checkpoint into.
        workers: replay workers for dependency blocks: forked processes over partitions when
            every block logged its partitions (each loads the checkpoint itself), else logical
            workers in this process.
        repair: cut torn tails off the log (off to inspect a directory read-only).

    Raises:
        WalCorrupt: no checkpoint, or damage that is not a torn tail.
    """
    started_s = time.perf_counter()
    manifest = read_manifest(directory)
    if manifest is None:
        raise no_checkpoint(directory)
    checkpoint_epoch, snapshot = manifest
    blocks, dropped = read_log(directory, checkpoint_epoch)
    read_s, read_cpu_s = time.perf_counter(), time.process_time()
    load = functools.partial(load_snapshot, snapshot, checkpoint_epoch, schema)
    # Replay's short-lived objects hold no cycles: reference counts free them.
    with collector_paused():
        payloads = _partitioned_payloads(blocks) if workers > 1 else None
        # Decoding is part of replay, as it is for every block replayed serially.
        decode_s, decode_cpu_s = time.perf_counter() - read_s, time.process_time() - read_cpu_s
        worker_cpu_s: list[float] = []
        serial_cpu_s = 0.0
        if payloads:
            crashpoint("recovery.mid_replay")
            split = parallel.replay_partitioned(
                load, registry, payloads, workers=workers, partitions=payloads[0]["partitions"]
            )
            db, load_s = split.db, split.loaded_s - read_s - decode_s
            worker_cpu_s = split.cpu_s
            serial_cpu_s = decode_cpu_s + split.install_cpu_s
            replay_cpu_s = worker_cpu_s[0] + serial_cpu_s
        else:
            db = load()
            gc.freeze()  # the loaded rows are long-lived: full collections later skip them
            load_s, loaded_cpu_s = time.perf_counter() - read_s, time.process_time()
            _replay_serially(db, registry, blocks, workers)
            replay_cpu_s = time.process_time() - loaded_cpu_s
    if repair and dropped:  # recovered: only now the torn tail goes
        cut_torn_tail(directory)
    done_s = time.perf_counter()
    epoch = blocks[-1].epoch if blocks else checkpoint_epoch
    logger.info(
        "recovered epoch %d: checkpoint %d + %d log epochs", epoch, checkpoint_epoch, len(blocks)
    )
    timing = {
        "timing_s/read_log": read_s - started_s,
        "timing_s/load_checkpoint": load_s,
        "timing_s/replay": done_s - read_s - load_s,
        "timing_s/recover": done_s - started_s,
        "timing_s/replay_cpu": replay_cpu_s,  # this process only
    }
    if worker_cpu_s:  # each worker's own partitions; decoding and installing are serial
        timing["timing_s/replay_worker_cpu_max"] = max(worker_cpu_s)
        timing["timing_s/replay_worker_cpu_sum"] = sum(worker_cpu_s)
        timing["timing_s/replay_serial_cpu"] = serial_cpu_s
    return Recovered(db, epoch, checkpoint_epoch, len(blocks), dropped, timing)
