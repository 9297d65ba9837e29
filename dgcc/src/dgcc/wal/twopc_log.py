"""Write-ahead log of a two-phase-commit node (2PL NO_WAIT, WAIT_DIE, OCC): redo records + 2PC.

A 2PC node logs as 2PC systems do (presumed abort). Transaction ids are the server's branch
ids, ``(coordinator node, sequence, attempt, coordinator incarnation)``. Records:

  * ``("prepare", txn, images)``: a participant's redo, the after-images of the rows its branch
    wrote (``table -> pk -> row``, None for a deleted row); forced before it votes yes;
  * ``("decide", txn)``: the coordinator's commit decision; forced before any commit is sent;
  * ``("commit", txn, images)``: this node's branch committed: lazy after a prepare (images
    None), or forced with the images for a one-node transaction (one-phase commit);
  * ``("abort", txn)``: an in-doubt branch a restart resolved as aborted (no decision logged).

Group commit: the records appended during an event-loop turn, and while a write is in flight,
go out as one block (``format``'s checksummed framing; the block's epoch counts the node's
flushes) with one write and one fsync on a background thread (``WalWriter``); waiters are woken
once their record is on disk. Each run opens with a forced ``start`` block whose epoch is the
node's incarnation, so transaction ids never repeat across restarts; it also carries the
resolutions of the branches that were in doubt. Recovery redoes, in log order, the images of
every committed branch onto the initial load (no checkpoints: the log covers the whole run).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Collection, Hashable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dgcc.errors import brief
from dgcc.storage import Database
from dgcc.wal import value
from dgcc.wal.format import (
    BlockKind,
    WalCorrupt,
    decode_payload,
    encode_block,
)
from dgcc.wal.recovery import cut_torn_tail, read_log
from dgcc.wal.writer import WalWriter, list_segments

__all__ = [
    "Images",
    "TwoPhaseLog",
    "TxnId",
    "committed_txns",
    "in_doubt",
    "read_records",
    "redo",
]

logger = logging.getLogger(__name__)

TxnId = tuple[int, ...]  # (coordinator node, sequence, attempt, coordinator incarnation)
Images = dict[str, dict[Hashable, dict[str, Any] | None]]
Record = tuple[Any, ...]
KINDS = ("start", "prepare", "decide", "commit", "abort")


def read_records(directory: Path, *, repair: bool = True) -> tuple[list[Record], int, list[str]]:
    """The records of every intact block in order, the last block's epoch, the drop messages.

    A torn tail (an unacknowledged flush) is dropped and, with ``repair``, cut off the file.

    Raises:
        WalCorrupt: a damaged block followed by intact ones, or an unknown record: damage no
            crash leaves, so acknowledged records may be lost.
    """
    if not directory.exists() or not list_segments(directory):
        return [], 0, []
    blocks, dropped = read_log(directory, 0)
    records: list[Record] = []
    for block in blocks:
        if block.kind is not BlockKind.TWOPC:
            raise WalCorrupt(f"epoch {block.epoch}: a {block.kind.name} block in a 2PC log")
        for record in decode_payload(block):
            if not isinstance(record, tuple) or not record or record[0] not in KINDS:
                raise WalCorrupt(f"epoch {block.epoch}: unknown 2PC log record {brief(record)}")
            records.append(record)
    if repair and dropped:  # every record read: only now the torn tail goes
        cut_torn_tail(directory)
    return records, blocks[-1].epoch if blocks else 0, dropped


def committed_txns(records: Collection[Record], decided_elsewhere: Collection[TxnId]) -> set[TxnId]:
    """Ids of the branches logged here that committed: a local commit record, or a branch
    prepared here whose coordinator logged its decision (``decided_elsewhere``)."""
    committed = {record[1] for record in records if record[0] == "commit"}
    prepared = {record[1] for record in records if record[0] == "prepare"}
    return committed | (prepared & set(decided_elsewhere))


def in_doubt(records: Collection[Record]) -> list[TxnId]:
    """Branches prepared here with no commit or abort record: the coordinator decides."""
    ended = {record[1] for record in records if record[0] in ("commit", "abort")}
    return sorted({record[1] for record in records if record[0] == "prepare"} - ended)


def redo(db: Database, records: list[Record], committed: Collection[TxnId]) -> int:
    """Install the after-images of the ``committed`` branches, in log order; returns how many.

    A branch's images sit at its prepare record (or its one-phase commit record): no other
    branch wrote those rows between its prepare and its commit (it held them), so log order is
    the order the writes were installed in memory.
    """
    committed = set(committed)
    merged: Images = {}
    applied = 0
    for record in records:
        kind = record[0]
        images = record[2] if kind in ("prepare", "commit") else None
        if images is None or record[1] not in committed:
            continue
        applied += 1
        for table, rows in images.items():
            merged.setdefault(table, {}).update(rows)
    value.replay_epoch(db, {"images": merged})
    return applied


class TwoPhaseLog:
    """A 2PC node's log at run time: records appended, grouped, forced on a background thread.

    Args:
        directory: the node's data directory (created if missing); its log is read at once,
            a torn tail cut off.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.records, last_epoch, self.dropped = read_records(directory)
        self.incarnation = last_epoch + 1  # the epoch of this run's start block
        self.writer = WalWriter(directory, self.incarnation)
        self.decided = {record[1] for record in self.records if record[0] == "decide"}
        self.stats = {"wal/flushes": 0, "wal/records": 0, "wal/bytes": 0}
        self._pending: list[Record] = []
        self._appended = 0  # records appended so far (a record's lsn is its count)
        self._durable = 0  # records on disk
        self._flushing = False
        self._scheduled = False
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._tiebreak = itertools.count()
        self._error: OSError | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="wal")
        self._closed = False

    def in_doubt(self) -> list[TxnId]:
        return in_doubt(self.records)

    def recover(self, db: Database, decided_elsewhere: Collection[TxnId]) -> int:
        """Redo the committed branches onto ``db`` (the initial load), then force the start
        block with the in-doubt resolutions; returns the branches redone."""
        records = self.records
        committed = committed_txns(records, decided_elsewhere)
        applied = redo(db, records, committed)
        doubtful = in_doubt(records)
        start: list[Record] = [("start",)]
        start += [("commit", txn, None) if txn in committed else ("abort", txn) for txn in doubtful]
        self.writer.append(self.incarnation, encode_block(BlockKind.TWOPC, self.incarnation, start))
        self.records = []  # ``decided`` stays: a peer restarting with us may still ask
        logger.info(
            "2PC log %s: redid %d branches, resolved %d in doubt, incarnation %d",
            self.directory,
            applied,
            len(doubtful),
            self.incarnation,
        )
        return applied

    def append(self, record: Record) -> int:
        """Queue ``record`` for the next flush; returns its lsn (for ``wait``)."""
        if self._error is not None:
            raise self._error
        self._pending.append(record)
        self._appended += 1
        if not self._scheduled and not self._flushing:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return self._appended

    async def wait(self, lsn: int) -> None:
        """Return once record ``lsn`` (and every record before it) is on disk.

        Raises:
            OSError: the write or fsync of its block failed.
        """
        if lsn <= self._durable:
            return
        if self._error is not None:
            raise self._error
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (lsn, next(self._tiebreak), future))
        await future

    def _flush(self) -> None:
        self._scheduled = False
        if self._flushing or not self._pending or self._closed:
            return
        records, self._pending = self._pending, []
        epoch = self.writer.next_epoch
        block = encode_block(BlockKind.TWOPC, epoch, records)
        self._flushing = True
        self.stats["wal/flushes"] += 1
        self.stats["wal/records"] += len(records)
        self.stats["wal/bytes"] += len(block)
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._executor, self.writer.append, epoch, block)
        upto = self._appended
        done.add_done_callback(lambda future: self._written(future, upto))

    def _written(self, future: asyncio.Future, upto: int) -> None:
        self._flushing = False
        error = future.exception()
        if error is not None:
            assert isinstance(error, OSError), f"log write failed with {error!r}"
            self._error = error
            logger.error("2PC log %s: write failed: %s", self.directory, error)
            for _, _, waiter in self._waiters:
                if not waiter.done():
                    waiter.set_exception(error)
            self._waiters = []
            return
        assert upto > self._durable, f"flush up to {upto} after {self._durable} was durable"
        self._durable = upto
        waiters = self._waiters
        while waiters and waiters[0][0] <= upto:
            waiter = heapq.heappop(waiters)[2]
            if not waiter.done():
                waiter.set_result(None)
        if self._pending:
            self._flush()

    def close(self) -> None:
        """Write what is pending (a clean stop loses nothing) and close the file."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        if self._pending and self._error is None:
            epoch = self.writer.next_epoch
            self.writer.append(epoch, encode_block(BlockKind.TWOPC, epoch, self._pending))
            self._pending = []
        self.writer.close()
