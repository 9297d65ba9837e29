"""Parallel dependency replay in worker processes, one group of data partitions per worker.

At run time the dependency log also records where each transaction lives: its partition when
all of its data is in one (found from the workload's ``route_keys``, a few cached lookups per
transaction), and for a transaction over several partitions each piece's partition plus the
outputs of pieces that feed a piece of another partition (the values that would cross nodes in
DistDGCC). At recovery ``workers`` processes (this one and forked children) each load the
checkpoint and replay only their partitions' part of every logged epoch: temporal edges never
cross partitions (one key, one partition), logical edges that do are served from the logged
values, and aborted and read-only transactions are skipped. A transaction in one partition is
redone whole by its procedure's ``replay`` entry point where it has one; of the others, a worker
runs the pieces that write or feed one of its writing pieces, in ascending piece id (every edge
points forward). Each child then sends what it wrote, once (inserted and deleted rows whole,
updated rows as the final values of their changed fields), and the parent installs it after
its own part: streaming it in chunks between the parent's epochs cost more CPU than it hid.

Requirements on the workload (TPC-C meets them, as DistDGCC's routing already assumes):
``route_keys`` names every partition a call touches, replicated keys are never written, and
planning reads only data no transaction writes or data of the transaction's own partitions.
"""

from __future__ import annotations

import gc
import itertools
import logging
import operator
import os
import pickle
import shutil
import signal
import tempfile
import time
from array import array
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
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
    "Split",
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
    """Run this worker's part of one epoch in log order: its transactions that live in one
    partition redone whole where the procedure can, the needed pieces of the rest."""
    chosen = _chosen_slots(payload, mine)
    piece_parts: dict[int, bytes] = payload["piece_parts"]
    crossing: dict[int, Any] = payload["remote_values"]
    offsets = [0, *itertools.accumulate(payload["piece_counts"])]
    for job in dependency.replay_jobs(db, registry, payload, chosen, piece_parts):
        if type(job) is dependency.Redo:
            dependency.redo(db, job)
            continue
        slot, ctx, pieces = job.index, PieceContext(db, job), job.pieces
        if slot in piece_parts:
            base = offsets[slot]
            for k, piece in enumerate(pieces):
                if base + k in crossing:
                    job.outputs[piece.name] = crossing[base + k]
            pieces = _needed_here(pieces, array("h", piece_parts[slot]), mine)
        else:
            pieces = [p for p, keep in zip(pieces, dependency.needed_pieces(pieces)) if keep]
        for piece in pieces:
            run_piece(ctx, job, piece)
        if job.error is not None or job.abort_reason is not None:
            raise DgccError(f"replayed transaction {slot} diverged from the log: {job.outcome()}")


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


@dataclass(frozen=True, slots=True)
class Split:
    """A partitioned replay's result: the database, when this process had loaded the
    checkpoint (``perf_counter`` seconds), and each worker's replay CPU seconds (worker 0's
    installing included, every worker's checkpoint load excluded)."""

    db: Database
    loaded_s: float
    cpu_s: list[float]


def replay_partitioned(
    load: Callable[[], Database],
    registry: ProcedureRegistry,
    payloads: Sequence[dict[str, Any]],
    *,
    workers: int,
    partitions: int,
) -> Split:
    """Replay splittable dependency epochs with ``workers`` processes onto ``load()``'s state.

    ``workers - 1`` children are forked first and each loads the checkpoint itself (as this
    process does meanwhile), so no process pays copy-on-write page copies for tables it shares
    with another. Each child replays its partition group and sends the rows it wrote; this
    process replays group 0, then installs the children's rows.

    Raises:
        DgccError: a worker failed, or the log no longer matches the procedures.
    """
    assert all(splittable(payload) for payload in payloads), "an epoch cannot be split"
    scratch = Path(tempfile.mkdtemp(prefix="dgcc_replay_"))
    children: list[int] = []
    for worker in range(1, workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                mine = _mine(worker, workers, partitions)
                _replay_child(load, registry, payloads, mine, scratch / f"worker{worker}.pkl")
                code = 0
            except Exception:  # the parent reports the failure; the reason goes to the log
                logger.exception("replay worker %d failed", worker)
            finally:
                os._exit(code)
        children.append(pid)
    try:
        db = load()
        gc.freeze()  # the loaded rows are long-lived: full collections later skip them
        loaded_s, started_cpu_s = time.perf_counter(), time.process_time()
        mine = _mine(0, workers, partitions)
        for payload in payloads:
            _replay_mine(db, registry, payload, mine)
        _reap(children)
        cpu_s = []
        for worker in range(1, workers):
            sent = (scratch / f"worker{worker}.pkl").read_bytes()
            whole, fields, child_cpu_s = pickle.loads(sent)
            _apply(db, (whole, fields))
            cpu_s.append(child_cpu_s)
        return Split(db, loaded_s, [time.process_time() - started_cpu_s, *cpu_s])
    finally:
        alive = [pid for pid in children if _alive(pid)]
        for pid in alive:  # this process failed first: its children's work is moot
            os.kill(pid, signal.SIGKILL)
        _reap(alive, quiet=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _mine(worker: int, workers: int, partitions: int) -> list[bool]:
    """Per partition: does ``worker`` replay it?"""
    return [p % workers == worker for p in range(partitions)]


def _replay_child(
    load: Callable[[], Database],
    registry: ProcedureRegistry,
    payloads: Sequence[dict[str, Any]],
    mine: list[bool],
    path: Path,
) -> None:
    """A child's replay of its partitions' part; writes what it wrote, with its replay CPU
    seconds, to ``path`` (under a temporary name, then renamed: the parent never sees half)."""
    db = load()
    started_cpu_s = time.process_time()
    changes = _Changes(db)
    for payload in payloads:
        _replay_mine(db, registry, payload, mine)
    staging = path.with_suffix(".tmp")
    sent = (*changes.take(), time.process_time() - started_cpu_s)
    staging.write_bytes(pickle.dumps(sent, pickle.HIGHEST_PROTOCOL))
    staging.rename(path)


class _Changes:
    """What a child wrote, by table: the rows it inserted or deleted (whole, None when
    deleted), and the rows it only updated, as the current values of every field the table's
    updates changed.

    Any current value of a row of the child's partitions is its final one (no other worker
    writes it), so an updated row is sent once however often it changed (stock, customer and
    district rows change many times), and sending fields a row's own updates did not change is
    harmless, which lets an update cost one set insertion. The wrappers replace the child's
    table writers; the child exits after replay.
    """

    def __init__(self, db: Database) -> None:
        self.tables = db.tables
        self.whole: dict[str, dict[Hashable, Any]] = {}
        self.updated: dict[str, set[Hashable]] = {}
        self.names: dict[str, set[str]] = {}
        for table in db.tables.values():
            name = table.name
            self.whole[name], self.updated[name], self.names[name] = {}, set(), set()
            self._wrap(table, self.whole[name], self.updated[name], self.names[name])

    @staticmethod
    def _wrap(table: Table, whole: dict, updated: set, names: set) -> None:
        insert, update, delete = table.insert, table.update, table.delete
        mark, note = updated.add, names.update

        def inserted(pk: Hashable, row: dict[str, Any]) -> None:
            insert(pk, row)
            whole[pk] = row  # the live row: its state when the changes are taken

        def changed(pk: Hashable, changes: Mapping[str, Any]) -> None:
            update(pk, changes)
            mark(pk)
            note(changes)

        def deleted(pk: Hashable) -> None:
            delete(pk)
            whole[pk] = None

        table.insert, table.update, table.delete = inserted, changed, deleted  # type: ignore[method-assign]

    def take(self) -> tuple[dict, dict]:
        """Whole rows by table (non-empty tables only), and by table the changed field names
        with each updated row's values of them (one value, not a tuple, when there is one
        name); a row sent whole is not sent again as fields."""
        whole = {name: rows for name, rows in self.whole.items() if rows}
        fields = {}
        for name, updated in self.updated.items():
            if updated:
                columns, rows, skip = tuple(self.names[name]), self.tables[name].rows, self.whole
                values = operator.itemgetter(*columns)
                sent = {pk: values(rows[pk]) for pk in updated if pk not in skip[name]}
                fields[name] = (columns, sent)
        return whole, fields


def _apply(db: Database, changes: tuple[dict, dict]) -> None:
    """Install a child's changes: its whole rows, then its updated rows' fields (never the
    same row). Fields no index depends on go straight into the row dicts."""
    whole, fields = changes
    value.replay_epoch(db, {"images": whole})
    for name, (columns, values) in fields.items():
        table, rows = db.tables[name], db.tables[name].rows
        indexed = any(index.fields is None or not index.fields.isdisjoint(columns)
                      for index in table.indexes.values())  # fmt: skip
        if indexed:
            for pk, row_values in values.items():
                changes = zip(columns, row_values if len(columns) > 1 else (row_values,))
                table.update(pk, dict(changes))
        elif len(columns) == 1:
            (column,) = columns
            for pk, field in values.items():
                rows[pk][column] = field
        else:
            for pk, row_values in values.items():
                rows[pk].update(zip(columns, row_values))


def _reap(children: list[int], *, quiet: bool = False) -> None:
    """Wait for every child.

    Raises:
        DgccError: a child failed (unless ``quiet``).
    """
    failed = []
    for pid in children:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already
            continue
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(pid)
    if failed and not quiet:
        raise DgccError(f"replay workers {failed} failed")


def _alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False
