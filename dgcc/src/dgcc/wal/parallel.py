"""Parallel dependency replay in worker processes, one group of data partitions per worker.

At run time the dependency log also records where each transaction lives: its partition when
all of its data is in one (found from the workload's ``route_keys``, a few cached lookups per
transaction), and for a transaction over several partitions each piece's partition plus the
outputs of pieces that feed a piece of another partition (the values that would cross nodes in
DistDGCC). At recovery, after the checkpoint is loaded, ``workers`` processes (this one and
forked children) each replay only their partitions' pieces of every logged epoch: temporal
edges never cross partitions (one key, one partition), logical edges that do are served from
the logged values, aborted and read-only transactions are skipped, and so are pieces that
neither write nor feed one of the worker's writing pieces. Within a worker, ascending piece id
is a topological order (every edge points forward). Each child sends the rows it wrote in a
few chunks as it goes (one image per row per chunk); the parent installs them between its own
epochs, so the transfer overlaps the replay.

Requirements on the workload (TPC-C meets them, as DistDGCC's routing already assumes):
``route_keys`` names every partition a call touches, replicated keys are never written, and
planning reads only data no transaction writes or data of the transaction's own partitions.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import pickle
import shutil
import signal
import tempfile
import time
from array import array
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dgcc import debug
from dgcc.api import Piece, PieceContext, PlannedTxn, ProcedureRegistry, run_piece
from dgcc.errors import DgccError
from dgcc.storage import Database, Table
from dgcc.wal import dependency, value

__all__ = [
    "REPLICATED",
    "SEVERAL",
    "UNSPLITTABLE",
    "record_partitions",
    "replay_partitioned",
    "splittable",
]

REPLICATED = -1  # a piece touching only replicated (read-only) data and no partition
UNSPLITTABLE = -2  # a piece touching several partitions: this epoch cannot be split
SEVERAL = -3  # a transaction whose pieces live in several partitions (logged per piece)

logger = logging.getLogger(__name__)

RouteKeys = Callable[[str, Mapping[str, Any]], Sequence[Hashable] | None]


def record_partitions(
    txns: Sequence[PlannedTxn],
    partition_of: Callable[[Hashable], int],
    cache: dict[Hashable, int],
    route_keys: RouteKeys | None = None,
) -> tuple[bytes, dict[int, bytes], dict[int, Any]]:
    """Where each planned transaction lives, for the partitioned replay.

    Args:
        cache: key -> partition, kept by the caller across epochs (keys repeat a lot).
        route_keys: the workload's ``route_keys``; without it (or when it cannot tell) every
            piece's keys are looked at.

    Returns:
        per transaction its partition, ``SEVERAL`` or ``UNSPLITTABLE`` (packed i16); the
        per-piece partitions (packed i16) of the ``SEVERAL`` ones by slot; and the outputs
        crossing partitions, by piece id.
    """
    txn_parts = array("h")
    piece_parts: dict[int, bytes] = {}
    crossing: dict[int, Any] = {}
    base = 0
    for slot, txn in enumerate(txns):
        part = REPLICATED
        if route_keys is not None:
            part = _routed_partition(txn, route_keys, partition_of, cache)
            if debug.check_invariants and part >= 0:
                _check_routed(txn, part, partition_of, cache)
        if part < 0:  # not routed to one partition: look at every piece
            here = _piece_partitions(txn.pieces, partition_of, cache)
            homes = set(here) or {REPLICATED}
            part = homes.pop() if len(homes) == 1 else SEVERAL
            if UNSPLITTABLE in homes or part == UNSPLITTABLE:
                part = UNSPLITTABLE
            elif part == SEVERAL:
                piece_parts[slot] = array("h", here).tobytes()
                _record_crossing(txn, here, base, crossing)
        txn_parts.append(part)
        base += len(txn.pieces)
    return txn_parts.tobytes(), piece_parts, crossing


def _routed_partition(
    txn: PlannedTxn,
    route_keys: RouteKeys,
    partition_of: Callable[[Hashable], int],
    cache: dict[Hashable, int],
) -> int:
    """The one partition the workload routes ``txn`` to, else ``SEVERAL``/``REPLICATED``."""
    try:
        keys = route_keys(txn.procedure.name, txn.params)
    except (KeyError, TypeError, IndexError, ValueError):
        return REPLICATED
    if not keys:
        return REPLICATED
    part, get = REPLICATED, cache.get
    for key in keys:
        found = get(key)
        if found is None:
            found = cache[key] = partition_of(key)
        if found != part and found != REPLICATED:
            if part != REPLICATED:
                return SEVERAL
            part = found
    return part


def _check_routed(
    txn: PlannedTxn, part: int, partition_of: Callable[[Hashable], int], cache: dict[Hashable, int]
) -> None:
    """The routing contract: a transaction routed to one partition touches only that one."""
    here = set(_piece_partitions(txn.pieces, partition_of, cache))
    if here != {part}:
        raise DgccError(
            f"{txn.procedure.name} routed to partition {part} touches partitions {sorted(here)}"
        )


def _piece_partitions(
    pieces: Sequence[Piece], partition_of: Callable[[Hashable], int], cache: dict[Hashable, int]
) -> list[int]:
    """Each piece's partition; pieces on replicated data only run at the first home."""
    here = [_piece_partition(piece, partition_of, cache) for piece in pieces]
    home = next((part for part in here if part >= 0), None)
    if home is not None:
        here = [home if part == REPLICATED else part for part in here]
    return here


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
    """Can the epoch be replayed partition by partition (partitions logged, none crossed)?"""
    if "txn_parts" not in payload or payload["errors"]:
        return False
    parts = array("h")
    parts.frombytes(payload["txn_parts"])
    return UNSPLITTABLE not in parts


def _chosen_slots(payload: dict[str, Any], mine: list[bool]) -> list[int]:
    """The replayed transactions with a piece in this worker's partitions, in slot order."""
    txn_parts = array("h")
    txn_parts.frombytes(payload["txn_parts"])
    piece_parts: dict[int, bytes] = payload["piece_parts"]
    chosen = []
    for slot, replayed in enumerate(dependency.replayed_slots(payload)):
        if not replayed:
            continue
        part = txn_parts[slot]
        if part >= 0:
            if mine[part]:
                chosen.append(slot)
        elif part == SEVERAL:
            if any(mine[p] for p in array("h", piece_parts[slot]) if p >= 0):
                chosen.append(slot)
        else:
            raise DgccError(f"transaction {slot} has partition {part}; the epoch cannot be split")
    return chosen


def _replay_mine(
    db: Database, registry: ProcedureRegistry, payload: dict[str, Any], mine: list[bool]
) -> None:
    """Run this worker's needed pieces of one epoch, in ascending piece id."""
    chosen = _chosen_slots(payload, mine)
    piece_parts: dict[int, bytes] = payload["piece_parts"]
    crossing: dict[int, Any] = payload["remote_values"]
    offsets = [0, *itertools.accumulate(payload["piece_counts"])]
    for slot, planned in zip(
        chosen, dependency.plan_replayed(db, registry, payload, chosen), strict=True
    ):
        ctx = PieceContext(db, planned)
        pieces = planned.pieces
        if slot in piece_parts:
            base = offsets[slot]
            for k, piece in enumerate(pieces):
                if base + k in crossing:
                    planned.outputs[piece.name] = crossing[base + k]
            pieces = _needed_here(pieces, array("h", piece_parts[slot]), mine)
        else:
            pieces = [p for p, keep in zip(pieces, dependency.needed_pieces(pieces)) if keep]
        for piece in pieces:
            run_piece(ctx, planned, piece)
        if planned.error is not None or planned.abort_reason is not None:
            raise DgccError(
                f"replayed transaction {slot} diverged from the log: {planned.outcome()}"
            )


def _needed_here(pieces: Sequence[Piece], parts: array, mine: list[bool]) -> list[Piece]:
    """This worker's pieces that write or feed one of its writing pieces, in piece order."""
    wanted: set[str] = set()
    needed: list[Piece] = []
    for k in range(len(pieces) - 1, -1, -1):
        piece = pieces[k]
        if parts[k] >= 0 and mine[parts[k]] and (piece.writes or piece.name in wanted):
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
    others and send the rows they wrote in ``CHUNKS`` batches as they go, which this process
    installs between its own epochs (and the rest once the children are done). Returns each
    worker's CPU seconds (its share of the work, whatever else shares the host), the
    installing included in worker 0's.
    """
    assert all(splittable(payload) for payload in payloads), "an epoch cannot be split"
    scratch = Path(tempfile.mkdtemp(prefix="dgcc_replay_"))
    children: list[int] = []
    gc.freeze()  # the children's collector then leaves the shared heap alone (no COW copies)
    for worker in range(1, workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _replay_child(db, registry, payloads, _mine(worker, workers, partitions), scratch)
                code = 0
            except Exception:  # the parent reports the failure; the reason goes to the log
                logger.exception("replay worker %d failed", worker)
            finally:
                os._exit(code)
        children.append(pid)
    try:
        started_cpu_s = time.process_time()
        inbox = _Inbox(db, scratch)
        mine = _mine(0, workers, partitions)
        for payload in payloads:
            _replay_mine(db, registry, payload, mine)
            inbox.install_arrived()
        cpu_s = _reap(children)
        inbox.install_arrived()
        assert not any(scratch.glob("child*")), f"chunks left uninstalled in {scratch}"
        return [time.process_time() - started_cpu_s, *cpu_s]
    finally:
        alive = [pid for pid in children if _alive(pid)]
        for pid in alive:  # this process failed first: its children's work is moot
            os.kill(pid, signal.SIGKILL)
        _reap(alive, quiet=True)
        shutil.rmtree(scratch, ignore_errors=True)


CHUNKS = 4  # batches of changes each child sends while it replays


def _mine(worker: int, workers: int, partitions: int) -> list[bool]:
    """Per partition: does ``worker`` replay it?"""
    return [p % workers == worker for p in range(partitions)]


def _chunk_path(scratch: Path, child: int, number: int) -> Path:
    return scratch / f"child{child}-{number:06d}.pkl"


def _replay_child(
    db: Database,
    registry: ProcedureRegistry,
    payloads: Sequence[dict[str, Any]],
    mine: list[bool],
    scratch: Path,
) -> None:
    """A child's replay: its partitions' pieces, sending what it wrote every few epochs.

    A chunk is written under a temporary name and renamed, so the parent sees whole chunks.
    """
    child = os.getpid()
    changes = _Changes(db)
    every, sent = max(1, -(-len(payloads) // CHUNKS)), 0
    for count, payload in enumerate(payloads, 1):
        _replay_mine(db, registry, payload, mine)
        if count % every and count != len(payloads):
            continue
        path = _chunk_path(scratch, child, sent)
        staging = path.with_suffix(".tmp")
        staging.write_bytes(pickle.dumps(changes.take(), pickle.HIGHEST_PROTOCOL))
        staging.rename(path)
        sent += 1


class _Changes:
    """What a child wrote since its last chunk, by table: the rows it inserted or deleted
    (whole, None when deleted), and the merged field changes of rows it only updated.

    Sending only the changed fields of updated rows (a stock row's counts, an order line's
    delivery date) keeps chunks small. The wrappers replace the child's table writers; the
    child exits after replay.
    """

    def __init__(self, db: Database) -> None:
        self.whole: dict[str, dict[Hashable, Any]] = {}
        self.fields: dict[str, dict[Hashable, dict[str, Any]]] = {}
        for table in db.tables.values():
            self.whole[table.name], self.fields[table.name] = {}, {}
            self._wrap(table, self.whole[table.name], self.fields[table.name])

    @staticmethod
    def _wrap(table: Table, whole: dict, fields: dict) -> None:
        insert, update, delete = table.insert, table.update, table.delete

        def inserted(pk: Hashable, row: dict[str, Any]) -> None:
            insert(pk, row)
            whole[pk] = row  # the live row: its state when the chunk is pickled
            fields.pop(pk, None)

        def updated(pk: Hashable, changes: Mapping[str, Any]) -> None:
            update(pk, changes)
            if pk not in whole:
                merged = fields.get(pk)
                if merged is None:
                    fields[pk] = dict(changes)
                else:
                    merged.update(changes)

        def deleted(pk: Hashable) -> None:
            delete(pk)
            whole[pk] = None
            fields.pop(pk, None)

        table.insert, table.update, table.delete = inserted, updated, deleted  # type: ignore[method-assign]

    def take(self) -> tuple[dict, dict]:
        """The changes so far (non-empty tables only), forgetting them."""
        taken = (
            {name: dict(rows) for name, rows in self.whole.items() if rows},
            {name: dict(rows) for name, rows in self.fields.items() if rows},
        )
        for kept in (*self.whole.values(), *self.fields.values()):
            kept.clear()  # the wrappers hold these dicts
        return taken


def _apply(db: Database, chunk: tuple[dict, dict]) -> None:
    """Install a child's chunk: its whole rows, then its field changes (never the same row)."""
    whole, fields = chunk
    value.replay_epoch(db, {"images": whole})
    for name, changes in fields.items():
        update = db.tables[name].update
        for pk, merged in changes.items():
            update(pk, merged)


class _Inbox:
    """The parent's side: installs each child's chunks in the order they were sent."""

    def __init__(self, db: Database, scratch: Path) -> None:
        self.db = db
        self.scratch = scratch
        self.next_chunk: dict[int, int] = {}  # child pid -> number of its next chunk

    def install_arrived(self) -> int:
        """Install every chunk that has fully arrived; returns how many."""
        installed = 0
        for path in sorted(self.scratch.glob("child*-*.pkl")):
            child, number = (int(part) for part in path.stem[len("child") :].split("-"))
            if number != self.next_chunk.get(child, 0):
                continue  # an earlier chunk of this child is still being written
            _apply(self.db, pickle.loads(path.read_bytes()))
            path.unlink()
            self.next_chunk[child] = number + 1
            installed += 1
        return installed


def _reap(children: list[int], *, quiet: bool = False) -> list[float]:
    """Wait for every child; their CPU seconds.

    Raises:
        DgccError: a child failed (unless ``quiet``).
    """
    failed, cpu_s = [], []
    for pid in children:
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
