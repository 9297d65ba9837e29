"""Parallel dependency replay in worker processes, one group of data partitions per worker.

At run time the dependency log also records where each transaction lives: its partition when
all of its data is in one (found from the workload's ``route_keys``, a few cached lookups per
transaction), and for a transaction over several partitions each piece's partition plus the
outputs of pieces that feed a piece of another partition (the values that would cross nodes in
DistDGCC). At recovery ``workers`` processes (this one and forked children) each load the
checkpoint and replay only their partitions' part of every logged epoch: temporal edges never
cross partitions (one key, one partition), logical edges that do are served from the logged
values, and aborted and read-only transactions are skipped. A transaction whose partitions are
all the worker's own is redone whole by its procedure's ``replay`` entry point where it has one;
of the others, a worker runs the pieces that write or feed one of its writing pieces, in
ascending piece id (every edge points forward). Each child then sends what it wrote, once
(inserted rows whole, deleted checkpoint keys, updated rows as the final values of their changed
fields, touched secondary index entries whole), and the parent installs it after its own part
with bulk dict updates: streaming it in chunks between the parent's epochs cost more CPU than it
hid. Partitions are grouped by their logged work (``partition_groups``) so that the parent,
which also installs, may take a larger share than a child, which also ships.

Requirements on the workload (TPC-C meets them, as DistDGCC's routing already assumes):
``route_keys`` names every partition a call touches, replicated keys are never written,
planning reads only data no transaction writes or data of the transaction's own partitions, and
a secondary-index entry holds rows of one partition only (checked at install).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import operator
import os
import pickle
import shutil
import signal
import struct
import tempfile
import time
from array import array
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgcc import debug
from dgcc.api import Piece, PieceContext, PlannedTxn, ProcedureRegistry, run_piece
from dgcc.errors import DgccError
from dgcc.storage import Database, Index, Table
from dgcc.wal import dependency
from dgcc.workloads import REPLICATED  # also a piece touching replicated data alone

__all__ = [
    "REPLICATED",
    "SEVERAL",
    "UNSPLITTABLE",
    "Split",
    "partition_groups",
    "partition_weights",
    "record_partitions",
    "replay_partitioned",
    "splittable",
]

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
    """Run this worker's part of one epoch in log order: its transactions whose partitions
    are all its own redone whole where the procedure can, the needed pieces of the rest."""
    chosen = _chosen_slots(payload, mine)
    piece_parts: dict[int, bytes] = payload["piece_parts"]
    split = {  # the transactions with a piece in another worker's partitions
        slot
        for slot, packed in piece_parts.items()
        if not all(mine[part] for part in array("h", packed) if part >= 0)
    }
    crossing: dict[int, Any] = payload["remote_values"]
    offsets = [0, *itertools.accumulate(payload["piece_counts"])]
    for job in dependency.replay_jobs(db, registry, payload, chosen, split):
        if type(job) is dependency.Redo:
            try:
                job.replay(db, job.params)
            except Exception as error:
                raise dependency.redo_failed(job, error) from error
            continue
        slot, ctx, pieces = job.index, PieceContext(db, job), job.pieces
        if slot in split:
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


# Cost model of a split, per unit of replay CPU: a child also tracks, gathers and pickles what
# it wrote (CHILD_EXTRA), and the parent unpickles and installs it after its own part (INSTALL).
# Measured on TPC-C (dgcc/bench/wal_logging.py); they only steer the balance, never the result.
CHILD_EXTRA = 0.5
INSTALL = 0.3


@dataclass(frozen=True, slots=True)
class Split:
    """A partitioned replay's result: the database, when this process had loaded the
    checkpoint (``perf_counter`` seconds), each worker's partitions, each worker's replay CPU
    seconds (its own partitions; a child's tracking and sending included; every worker's
    checkpoint load excluded), and this process's CPU seconds installing the children's writes
    (reading, unpickling and installing; serial after the workers)."""

    db: Database
    loaded_s: float
    groups: list[list[int]]
    cpu_s: list[float]
    install_cpu_s: float


def partition_weights(payloads: Sequence[dict[str, Any]], partitions: int) -> list[int]:
    """Per partition, the logged transactions with a piece there: the replay work's share."""
    weights = [0] * partitions
    for payload in payloads:
        txn_parts = array("h")
        txn_parts.frombytes(payload["txn_parts"])
        for part in range(partitions):
            weights[part] += txn_parts.count(part)
        for packed in payload["piece_parts"].values():
            for part in set(array("h", packed)) - {REPLICATED}:
                weights[part] += 1
    return weights


def partition_groups(weights: Sequence[float], workers: int) -> list[list[int]]:
    """Partitions per worker (worker 0 is the installing parent; a child may get none).

    Greedy, heaviest partition first, onto the worker that keeps the predicted makespan
    ``max(parent's work, max of child's work * (1 + CHILD_EXTRA)) + INSTALL * children's work``
    lowest (ties: the lower worker).

    Raises:
        ValueError: ``workers`` below 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    groups: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers

    def makespan(loads: list[float]) -> float:
        children = loads[1:]
        slowest = max(children, default=0.0) * (1 + CHILD_EXTRA)
        return max(loads[0], slowest) + INSTALL * sum(children)

    for part in sorted(range(len(weights)), key=lambda p: (-weights[p], p)):
        trials = []
        for worker in range(workers):
            loads[worker] += weights[part]
            trials.append(makespan(loads))
            loads[worker] -= weights[part]
        best = trials.index(min(trials))
        groups[best].append(part)
        loads[best] += weights[part]
    return [sorted(group) for group in groups]


def replay_partitioned(
    load: Callable[[], Database],
    registry: ProcedureRegistry,
    payloads: Sequence[dict[str, Any]],
    *,
    workers: int,
    partitions: int,
) -> Split:
    """Replay splittable dependency epochs with up to ``workers`` processes onto ``load()``'s
    state.

    The partitions are grouped by ``partition_groups`` over the log's per-partition work; a
    child is forked per non-empty group but the first, before loading, and each loads the
    checkpoint itself (as this process does meanwhile), so no process pays copy-on-write page
    copies for tables it shares with another. Each child replays its group and sends what it
    wrote; this process replays group 0, then installs the children's writes.

    Raises:
        DgccError: a worker failed, the log no longer matches the procedures, or two workers
            wrote the same index entry (the workload broke the partitioning contract).
    """
    assert all(splittable(payload) for payload in payloads), "an epoch cannot be split"
    groups = partition_groups(partition_weights(payloads, partitions), workers)
    scratch = Path(tempfile.mkdtemp(prefix="dgcc_replay_"))
    children: dict[int, int] = {}  # worker -> pid
    try:  # (from the first fork: a failed fork or a Ctrl-C still kills the children made)
        for worker, group in enumerate(groups):
            if worker == 0 or not group:
                continue
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    mine = _mine(group, partitions)
                    _replay_child(load, registry, payloads, mine, scratch / f"worker{worker}.pkl")
                    code = 0
                except BaseException as error:  # the parent reports it, with this reason
                    logger.exception("replay worker %d failed", worker)
                    _write_reason(scratch / f"worker{worker}.err", error)
                finally:
                    os._exit(code)
            children[worker] = pid
        db = load()
        gc.freeze()  # the loaded rows are long-lived: full collections later skip them
        loaded_s, started_cpu_s = time.perf_counter(), time.process_time()
        mine = _mine(groups[0], partitions)
        for payload in payloads:
            _replay_mine(db, registry, payload, mine)
        replayed_cpu_s = time.process_time()
        _reap(children, scratch)
        cpu_s = [replayed_cpu_s - started_cpu_s] + [0.0] * (workers - 1)
        for worker in children:
            shipment, cpu_s[worker] = _receive(scratch / f"worker{worker}.pkl")
            _apply(db, shipment)
        install_cpu_s = time.process_time() - replayed_cpu_s
        return Split(db, loaded_s, groups, cpu_s, install_cpu_s)
    finally:
        alive = {worker: pid for worker, pid in children.items() if _alive(pid)}
        for pid in alive.values():  # this process failed first: its children's work is moot
            os.kill(pid, signal.SIGKILL)
        _reap(alive, scratch, quiet=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _mine(group: Sequence[int], partitions: int) -> list[bool]:
    """Per partition: is it in ``group``?"""
    mine = [False] * partitions
    for part in group:
        mine[part] = True
    return mine


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
    shipment = pickle.dumps(changes.take(), pickle.HIGHEST_PROTOCOL)
    cpu_s = time.process_time() - started_cpu_s
    staging = path.with_suffix(".tmp")
    staging.write_bytes(_CPU.pack(cpu_s) + shipment)
    staging.rename(path)


_CPU = struct.Struct("<d")  # a shipment file: the child's replay CPU seconds, then its pickle


def _receive(path: Path) -> tuple[Any, float]:
    """A child's shipment and replay CPU seconds from its file."""
    sent = path.read_bytes()
    (cpu_s,) = _CPU.unpack_from(sent)
    return pickle.loads(memoryview(sent)[_CPU.size :]), cpu_s


class _Changes:
    """What a child wrote, by table: the rows it inserted (whole, live), the checkpoint rows it
    deleted, the rows it only updated (as the current values of every field the table's
    updates changed), and per secondary index the entries it touched (original and current
    primary keys).

    Any current value of a row or index entry of the child's partitions is its final one (no
    other worker writes it), so an updated row is sent once however often it changed (stock,
    customer and district rows change many times), and sending fields a row's own updates did
    not change is harmless, which lets an update cost one set insertion. Index entries are
    sent whole so the parent installs them with dict updates instead of redoing every insort;
    the originals let it check that no other worker changed them. The wrappers replace the
    child's table writers (every one: ``insert``, ``insert_many``, ``update``, ``changer``,
    ``delete``); the child exits after replay.
    """

    def __init__(self, db: Database) -> None:
        self.tables = db.tables
        self.whole: dict[str, dict[Hashable, Any]] = {}
        self.gone: dict[str, set[Hashable]] = {}
        self.updated: dict[str, set[Hashable]] = {}
        self.names: dict[str, set[str]] = {}
        self.touched: dict[str, dict[str, dict[Hashable, list]]] = {}
        for table in db.tables.values():
            name = table.name
            self.whole[name], self.gone[name] = {}, set()
            self.updated[name], self.names[name] = set(), set()
            self.touched[name] = {index: {} for index in table.indexes}
            self._wrap(table, self.whole[name], self.gone[name], self.updated[name],
                       self.names[name], self.touched[name])  # fmt: skip

    @staticmethod
    def _wrap(
        table: Table, whole: dict, gone: set, updated: set, names: set, touched: dict
    ) -> None:
        insert, update, delete, rows = table.insert, table.update, table.delete, table.rows
        insert_many, table_changer = table.insert_many, table.changer
        mark, note, indexes = updated.add, names.update, tuple(table.indexes.values())

        def touch(pk: Hashable, row: Mapping[str, Any], moved: Sequence[Index]) -> None:
            for index in moved:  # first touch of an entry: keep its original primary keys
                originals, ik = touched[index.name], index.index_key(pk, row)
                if ik not in originals:
                    originals[ik] = index.lookup(ik)

        watched = frozenset().union(*(index.fields or () for index in indexes))
        if any(index.fields is None for index in indexes):
            watched = None  # some index may depend on any field

        def inserted(pk: Hashable, row: dict[str, Any]) -> None:
            touch(pk, row, indexes)
            insert(pk, row)
            whole[pk] = row  # the live row: its state when the changes are taken

        def changed(pk: Hashable, changes: Mapping[str, Any]) -> None:
            if watched is not None and watched.isdisjoint(changes):
                rows[pk].update(changes)  # no index moves: all Table.update does then
            else:  # the entries it leaves and the ones it joins, before either changes
                moved = [
                    index
                    for index in indexes
                    if index.fields is None or not index.fields.isdisjoint(changes)
                ]
                touch(pk, rows[pk], moved)
                touch(pk, {**rows[pk], **changes}, moved)
                update(pk, changes)
            mark(pk)
            note(changes)

        def inserted_plain(pk: Hashable, row: dict[str, Any]) -> None:
            if pk in rows:  # Table.insert's own check: a table without indexes does no more
                raise KeyError(f"{table.name}: duplicate primary key {pk!r}")
            rows[pk] = row
            whole[pk] = row

        def changed_plain(pk: Hashable, changes: Mapping[str, Any]) -> None:
            rows[pk].update(changes)  # all Table.update does without indexes
            mark(pk)
            note(changes)

        def deleted(pk: Hashable) -> None:
            if indexes:
                touch(pk, rows[pk], indexes)
            delete(pk)
            if whole.pop(pk, None) is None:  # a checkpoint row (one the child inserted: moot)
                gone.add(pk)

        def inserted_many(new_rows: Mapping[Hashable, dict[str, Any]]) -> None:
            for pk, row in new_rows.items() if indexes else ():
                touch(pk, row, indexes)
            insert_many(new_rows)
            whole.update(new_rows)

        def changer(fields: Collection[str]) -> Callable[[Hashable], dict[str, Any]]:
            table_changer(fields)  # the table's own check: no index depends on ``fields``
            note(fields)

            def row_to_change(pk: Hashable) -> dict[str, Any]:
                mark(pk)
                return rows[pk]

            return row_to_change

        if not indexes:  # most writes: one call per write, not two
            inserted, changed = inserted_plain, changed_plain
        table.insert, table.update, table.delete = inserted, changed, deleted  # type: ignore[method-assign]
        table.insert_many, table.changer = inserted_many, changer  # type: ignore[method-assign]

    def take(self) -> tuple[dict, dict, dict, dict]:
        """By table (non-empty only): the inserted rows, the deleted checkpoint keys, the
        changed field names with each updated row's values of them (one value, not a tuple,
        when there is one name; rows sent whole or deleted are left out), and per index the
        touched entries as ``index key -> (original, current primary keys)``."""
        whole = {name: rows for name, rows in self.whole.items() if rows}
        gone = {name: list(pks) for name, pks in self.gone.items() if pks}
        fields = {}
        for name, updated in self.updated.items():
            if updated:
                columns, rows, skip = (
                    tuple(self.names[name]),
                    self.tables[name].rows,
                    self.whole[name],
                )
                live = [pk for pk in updated if pk not in skip and pk in rows]
                # In memory order: the parent loaded the same checkpoint the same way, so it
                # then visits its rows nearly in address order too (fewer cache misses).
                live.sort(key=lambda pk: id(rows[pk]))
                values = operator.itemgetter(*columns)
                fields[name] = (columns, {pk: values(rows[pk]) for pk in live})
        entries = {}
        for name, by_index in self.touched.items():
            indexes = self.tables[name].indexes
            kept = {index: {ik: (original, indexes[index].lookup(ik))
                            for ik, original in originals.items()}
                    for index, originals in by_index.items() if originals}  # fmt: skip
            if kept:
                entries[name] = kept
        return whole, gone, fields, entries


def _apply(db: Database, shipment: tuple[dict, dict, dict, dict]) -> None:
    """Install a child's writes with bulk dict updates: deletions, whole rows, updated fields
    (never a row sent whole), then the touched index entries.

    Raises:
        DgccError: an index entry the child touched was changed here too (by this process or
            an earlier child): the workload broke the partitioning contract.
    """
    whole, gone, fields, entries = shipment
    for name, pks in gone.items():
        rows = db.tables[name].rows
        for pk in pks:
            del rows[pk]
    for name, rows in whole.items():
        db.tables[name].rows.update(rows)
    for name, (columns, values) in fields.items():
        rows = db.tables[name].rows
        if len(columns) == 1:
            (column,) = columns
            for pk, field in values.items():
                rows[pk][column] = field
        else:
            for pk, row_values in values.items():
                rows[pk].update(zip(columns, row_values))
    for name, by_index in entries.items():
        for index_name, touched in by_index.items():
            index = db.tables[name].indexes[index_name]
            for ik, (original, _) in touched.items():
                if index.lookup(ik) != original:
                    raise DgccError(
                        f"index {name}.{index_name} entry {ik!r} was written by two replay workers"
                    )
            index.install({ik: current for ik, (_, current) in touched.items()})


def _write_reason(path: Path, error: BaseException) -> None:
    with contextlib.suppress(OSError):
        path.write_text(f"{type(error).__name__}: {error}"[:500])


def _reap(children: dict[int, int], scratch: Path, *, quiet: bool = False) -> None:
    """Wait for every child (worker -> pid).

    Raises:
        DgccError: a child failed (unless ``quiet``): which worker, how it ended, and the
            reason it wrote, if it could.
    """
    failed = []
    for worker, pid in children.items():
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already
            continue
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            continue
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        try:
            reason = (scratch / f"worker{worker}.err").read_text()
        except OSError:
            reason = "no reason written (out of memory?)" if code < 0 else "no reason written"
        failed.append(f"worker {worker} (pid {pid}, {how}): {reason}")
    if failed and not quiet:
        raise DgccError(f"replay {'; '.join(failed[:3])}")


def _alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False
