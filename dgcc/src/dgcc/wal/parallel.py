"""Parallel dependency replay in worker processes, one group of data partitions per worker.

At run time the dependency log also records each piece's partition and the outputs of pieces
that feed a piece of another partition (the values that would cross nodes in DistDGCC). At
recovery, after the checkpoint is loaded, ``workers`` processes (this one and forked children)
each replay only their partitions' pieces of every logged epoch: temporal edges never cross
partitions (one key, one partition), logical edges that do are served from the logged values,
aborted and read-only transactions are skipped, and so are pieces that neither write nor feed
one of the worker's writing pieces. Within a worker, ascending piece id is a topological order
(every edge points forward). Each child returns the after-images of the records it wrote; the
parent installs them.

Requirement on procedures (TPC-C meets it): planning reads only data no transaction writes or
data of the partitions the transaction's pieces live in.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import tempfile
import time
from array import array
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from dgcc.api import Piece, PieceContext, PlannedTxn, ProcedureRegistry, run_piece
from dgcc.errors import DgccError
from dgcc.storage import Database
from dgcc.wal import dependency, value

__all__ = ["REPLICATED", "UNSPLITTABLE", "record_partitions", "replay_partitioned"]

REPLICATED = -1  # a piece touching only replicated (read-only) data and no partition
UNSPLITTABLE = -2  # a piece touching several partitions: this epoch cannot be split


def record_partitions(
    txns: Sequence[PlannedTxn],
    partition_of: Callable[[Hashable], int],
    cache: dict[Hashable, int],
) -> tuple[bytes, dict[int, Any]]:
    """Per-piece partition (packed i16) and the outputs that cross partitions, by piece id.

    Args:
        cache: key -> partition, kept by the caller across epochs (keys repeat a lot).
    """
    parts = array("h")
    crossing: dict[int, Any] = {}
    for txn in txns:
        pieces = txn.pieces
        here = [_piece_partition(piece, partition_of, cache) for piece in pieces]
        homes = set(here)
        homes.discard(REPLICATED)
        if REPLICATED in here and homes:  # read-only replicated pieces run at home
            home = next(part for part in here if part >= 0)
            here = [home if part == REPLICATED else part for part in here]
        if len(homes) > 1:  # only a transaction over several partitions sends values
            _record_crossing(txn, here, len(parts), crossing)
        parts.extend(here)
    return parts.tobytes(), crossing


def _record_crossing(txn: PlannedTxn, here: list[int], base: int, crossing: dict[int, Any]) -> None:
    position = {piece.name: k for k, piece in enumerate(txn.pieces)}
    for k, piece in enumerate(txn.pieces):
        for name in piece.after:
            if here[position[name]] != here[k]:
                crossing[base + position[name]] = txn.outputs.get(name)


def _piece_partition(
    piece: Piece, partition_of: Callable[[Hashable], int], cache: dict[Hashable, int]
) -> int:
    part = REPLICATED
    get = cache.get
    for keys in (piece.reads, piece.writes):
        for key in keys:
            found = get(key)
            if found is None:
                found = cache[key] = partition_of(key)
            if found in (REPLICATED, part):
                continue
            if part != REPLICATED:
                return UNSPLITTABLE
            part = found
    return UNSPLITTABLE if part == REPLICATED and piece.writes else part


def splittable(payload: dict[str, Any]) -> bool:
    parts = array("h")
    parts.frombytes(payload.get("parts", b""))
    return "parts" in payload and not payload.get("errors") and UNSPLITTABLE not in parts


def _replay_mine(
    db: Database, registry: ProcedureRegistry, payload: dict[str, Any], mine: set[int]
) -> None:
    """Run this worker's needed pieces of one epoch, in ascending piece id."""
    parts = array("h")
    parts.frombytes(payload["parts"])
    counts: list[int] = payload["piece_counts"]
    crossing: dict[int, Any] = payload["remote_values"]
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + count)
    replayed = dependency.replayed_slots(payload)
    chosen = [
        slot
        for slot in range(len(counts))
        if replayed[slot] and any(parts[g] in mine for g in range(offsets[slot], offsets[slot + 1]))
    ]
    for slot, planned in zip(
        chosen, dependency.plan_replayed(db, registry, payload, chosen), strict=True
    ):
        ctx = PieceContext(db, planned)
        base = offsets[slot]
        for k, piece in enumerate(planned.pieces):
            if base + k in crossing:
                planned.outputs[piece.name] = crossing[base + k]
        for piece in _needed_here(planned.pieces, parts, base, mine):
            run_piece(ctx, planned, piece)
        if planned.error is not None or planned.abort_reason is not None:
            raise DgccError(
                f"replayed transaction {slot} diverged from the log: {planned.outcome()}"
            )


def _needed_here(pieces: Sequence[Piece], parts: array, base: int, mine: set[int]) -> list[Piece]:
    """This worker's pieces that write or feed one of its writing pieces, in piece order."""
    wanted: set[str] = set()
    needed: list[Piece] = []
    for k in range(len(pieces) - 1, -1, -1):
        piece = pieces[k]
        if parts[base + k] in mine and (piece.writes or piece.name in wanted):
            needed.append(piece)
            wanted.update(piece.after)
    needed.reverse()
    return needed


def replay_partitioned(
    db: Database,
    registry: ProcedureRegistry,
    payloads: Sequence[dict[str, Any]],
    *,
    workers: int,
    partitions: int,
) -> list[float]:
    """Replay splittable dependency epochs with ``workers`` processes, into ``db``.

    This process replays partition group 0 itself; ``workers - 1`` forked children replay the
    others and hand back the after-images of what they wrote, installed here at the end.
    Returns each worker's CPU seconds (its share of the work, whatever else shares the host),
    the installing included in worker 0's.
    """
    assert all(splittable(payload) for payload in payloads), "an epoch cannot be split"
    scratch = Path(tempfile.mkdtemp(prefix="dgcc_replay_"))
    children = []
    gc.freeze()  # the children's collector then leaves the shared heap alone (no COW copies)
    for worker in range(1, workers):
        out = scratch / f"worker{worker}.pkl"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                tracker = value.WriteTracker(db)
                _replay_group(db, registry, payloads, worker, workers, partitions)
                out.write_bytes(pickle.dumps(value.record_epoch(db, tracker.take()), 5))
                code = 0
            finally:
                os._exit(code)
        children.append((pid, out))
    try:
        started_cpu_s = time.process_time()
        _replay_group(db, registry, payloads, 0, workers, partitions)
        cpu_s = _reap(children)
        for _, out in children:
            value.replay_epoch(db, pickle.loads(out.read_bytes()))
        return [time.process_time() - started_cpu_s, *cpu_s]
    finally:
        if any(_alive(pid) for pid, _ in children):  # this process failed first
            _reap(children, quiet=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _reap(children: list[tuple[int, Path]], *, quiet: bool = False) -> list[float]:
    """Wait for every child; their CPU seconds.

    Raises:
        DgccError: a child failed (unless ``quiet``).
    """
    failed, cpu_s = [], []
    for pid, _ in children:
        try:
            _, status, usage = os.wait4(pid, 0)
        except ChildProcessError:  # reaped already
            continue
        cpu_s.append(usage.ru_utime + usage.ru_stime)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(pid)
    if failed and not quiet:
        raise DgccError(f"replay workers {failed} failed")
    return cpu_s


def _alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def _replay_group(
    db: Database,
    registry: ProcedureRegistry,
    payloads: Sequence[dict[str, Any]],
    worker: int,
    workers: int,
    partitions: int,
) -> None:
    mine = {p for p in range(partitions) if p % workers == worker}
    for payload in payloads:
        _replay_mine(db, registry, payload, mine)
