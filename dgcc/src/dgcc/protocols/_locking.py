"""Shared machinery for the interleaving baselines (2PL NO_WAIT, 2PL WAIT_DIE, OCC).

Python runs one thread, so concurrency is simulated: up to ``inflight`` transactions are active
at once and a seeded cooperative scheduler picks which one runs its next piece. Interleaving at
piece granularity is what makes transactions conflict. A transaction aborted by concurrency
control is undone and restarted within the same ``run_batch`` (keeping its first-attempt
timestamp), up to ``retries_max`` times (so at most ``retries_max + 1`` attempts); past that it
ends ABORTED with a reason starting ``retry`` (``api.RETRY_PREFIX``) so the closed-loop
driver resubmits it. Logic aborts and errors are final; an error's writes are undone. With
``record_history``, committed and logic-aborted transactions are recorded for the
serializability check (``_history``).
"""

from __future__ import annotations

import enum
import itertools
import random
import time
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dgcc.api import (
    Outcome,
    PieceContext,
    PlannedTxn,
    ProcedureRegistry,
    Protocol,
    TxnRequest,
    plan_batch,
    run_piece,
)
from dgcc.errors import ConfigError
from dgcc.protocols._history import CommittedTxn
from dgcc.storage import Database

__all__ = [
    "Attempt",
    "InterleavedProtocol",
    "LockTable",
    "TwoPhaseLocking",
    "UndoContext",
    "Verdict",
]

Key = Hashable
INFLIGHT_DEFAULT = 8
RETRIES_MAX = 100


class Verdict(enum.Enum):
    GO = "go"  # run the piece
    WAIT = "wait"  # blocked; try again after some lock is released
    ABORT = "abort"  # concurrency-control abort: undo and restart


@dataclass(eq=False, slots=True)
class Attempt:
    """One in-flight transaction: its planned txn, progress, and protocol bookkeeping."""

    txn: PlannedTxn
    request: TxnRequest
    ts: tuple[int, int]  # (batch number, batch position): kept across restarts
    ctx: PieceContext
    next_piece: int = 0
    tries: int = 1
    waiting: bool = False  # blocked on a lock (WAIT_DIE)
    backoff: bool = False  # restarted: sits out until another transaction finishes
    seen: dict[Key, int] = field(default_factory=dict)  # key -> version when first reached
    locks: dict[Key, str] = field(default_factory=dict)  # key -> "S" or "X"


class LockTable:
    """Shared/exclusive locks on conflict keys; holders are attempts."""

    def __init__(self) -> None:
        self._holders: dict[Key, dict[Attempt, str]] = {}

    def acquire(self, attempt: Attempt, key: Key, mode: str) -> list[Attempt]:
        """Grant ``mode`` on ``key`` to ``attempt`` and return [], or return the blockers."""
        holders = self._holders.setdefault(key, {})
        held = holders.get(attempt)
        if held == "X" or held == mode:
            return []
        others = [other for other in holders if other is not attempt]
        if mode == "S":
            blockers = [other for other in others if holders[other] == "X"]
        else:
            blockers = others
        if blockers:
            return blockers
        holders[attempt] = mode
        attempt.locks[key] = mode
        return []

    def release_all(self, attempt: Attempt) -> None:
        for key in attempt.locks:
            holders = self._holders[key]
            del holders[attempt]
            if not holders:
                del self._holders[key]
        attempt.locks.clear()


class UndoContext(PieceContext):
    """A piece context that logs before-images of every write so an attempt can be undone."""

    __slots__ = ("undo_log",)

    def __init__(self, db: Database, txn: PlannedTxn) -> None:
        super().__init__(db, txn)
        self.undo_log: list[tuple[Any, ...]] = []

    def update(self, table: str, pk: Hashable, changes: Mapping[str, Any]) -> None:
        row = self._db.tables[table].rows[pk]
        if all(name in row for name in changes):
            before: tuple[Any, ...] = ("fields", table, pk, {name: row[name] for name in changes})
        else:
            before = ("row", table, pk, dict(row))
        super().update(table, pk, changes)
        self.undo_log.append(before)

    def insert(self, table: str, pk: Hashable, row: dict[str, Any]) -> None:
        super().insert(table, pk, row)
        self.undo_log.append(("insert", table, pk, None))

    def delete(self, table: str, pk: Hashable) -> None:
        row = self._db.tables[table].rows.get(pk)
        super().delete(table, pk)
        self.undo_log.append(("delete", table, pk, row))

    def rollback(self) -> None:
        """Restore every before-image, newest first."""
        tables = self._db.tables
        for kind, table, pk, image in reversed(self.undo_log):
            t = tables[table]
            if kind == "fields":
                t.update(pk, image)
            elif kind == "insert":
                t.delete(pk)
            else:  # a deleted row, or an update that added fields: put the old row back
                if kind == "row":
                    t.delete(pk)
                t.insert(pk, image)
        self.undo_log.clear()


class InterleavedProtocol(Protocol):
    """Base of the interleaving baselines; subclasses decide what happens around each piece.

    Args:
        inflight: transactions active at once (the simulated concurrency).
        seed: seeds the scheduler's choices.
        retries_max: concurrency-control restarts of one transaction within a batch (retries:
            a transaction makes at most ``retries_max + 1`` attempts).
        record_history: keep ``history`` (the read/write versions of committed and
            logic-aborted transactions) for the checker.
    """

    deterministic = False
    track_versions = False  # OCC needs versions to validate even without a history

    def __init__(
        self,
        db: Database,
        registry: ProcedureRegistry,
        *,
        inflight: int = INFLIGHT_DEFAULT,
        seed: int = 0,
        retries_max: int = RETRIES_MAX,
        record_history: bool = False,
    ) -> None:
        super().__init__(db, registry)
        if isinstance(inflight, bool) or not isinstance(inflight, int) or inflight < 1:
            raise ConfigError(f"inflight must be an int >= 1, got {inflight!r}")
        if isinstance(retries_max, bool) or not isinstance(retries_max, int) or retries_max < 0:
            raise ConfigError(f"retries_max must be an int >= 0, got {retries_max!r}")
        self.inflight = inflight
        self.retries_max = retries_max
        self.record_history = record_history
        self.history: list[CommittedTxn] = []
        self.versions: dict[Key, int] = {}
        self._rng = random.Random(seed)
        self._batches = 0
        self._active: list[Attempt] = []
        self.stats: dict[str, float] = {
            "timing_s/execute": 0.0,
            f"{self.name}/commits": 0,
            f"{self.name}/retries": 0,
            f"{self.name}/gave_up": 0,
        }

    # -- subclass hooks -------------------------------------------------------------------

    def make_context(self, txn: PlannedTxn) -> PieceContext:
        return UndoContext(self.db, txn)

    def before_piece(self, attempt: Attempt) -> tuple[Verdict, str]:
        """Get ready to run the attempt's next piece; an ABORT names its cause."""
        raise NotImplementedError

    def try_commit(self, attempt: Attempt) -> str | None:
        """Make the attempt's writes visible in the database, or return an abort cause."""
        return None

    def check_abort(self, attempt: Attempt) -> str | None:
        """Before a logic abort is final: a cause to restart instead when the attempt may have
        decided it on reads no serial order gives (None: locks made them consistent)."""
        return None

    def finish(self, attempt: Attempt, *, undo: bool) -> None:
        """Release whatever the attempt holds; undo its writes when ``undo``."""
        raise NotImplementedError

    # -- the scheduler --------------------------------------------------------------------

    def run_batch(self, batch: Sequence[TxnRequest]) -> list[Outcome]:
        started_s = time.perf_counter()
        planned = plan_batch(self.registry, self.db, batch)
        queue = deque(
            Attempt(item, batch[item.index], (self._batches, item.index), self.make_context(item))
            for item in planned
            if isinstance(item, PlannedTxn)
        )
        active: list[Attempt] = []
        self._active = active
        while queue or active:
            while queue and len(active) < self.inflight:
                active.append(queue.popleft())
            runnable = [a for a in active if not (a.waiting or a.backoff)]
            if not runnable:  # only backed-off restarts can go: let them
                for attempt in active:
                    attempt.backoff = False
                runnable = [a for a in active if not a.waiting]
            assert runnable, "every active transaction is waiting: a deadlock"
            attempt = runnable[self._rng.randrange(len(runnable))]
            if self._step(attempt):
                active.remove(attempt)
                self._end_backoff()
        self._batches += 1
        self.stats["timing_s/execute"] += time.perf_counter() - started_s
        return [item.outcome() if isinstance(item, PlannedTxn) else item for item in planned]

    def _step(self, attempt: Attempt) -> bool:
        """Advance the attempt by one piece (or its commit); True once it has finished."""
        txn = attempt.txn
        if attempt.next_piece == len(txn.pieces):
            cause = self.try_commit(attempt)
            if cause is not None:
                return self._cc_abort(attempt, cause)
            self._record_commit(attempt)
            self.finish(attempt, undo=False)
            self.stats[f"{self.name}/commits"] += 1
            return True
        verdict, cause = self.before_piece(attempt)
        if verdict is Verdict.WAIT:
            attempt.waiting = True
            return False
        if verdict is Verdict.ABORT:
            return self._cc_abort(attempt, cause)
        piece = txn.pieces[attempt.next_piece]
        self._note_versions(attempt, (*piece.reads, *piece.writes))  # (lists too)
        run_piece(attempt.ctx, txn, piece)
        attempt.next_piece += 1
        if txn.abort_reason is not None or txn.error is not None:
            # A logic abort or a raising piece decided on a view no order had (OCC's stale
            # reads) restarts: only one a serial order gives may end the call.
            if (cause := self.check_abort(attempt)) is not None:
                return self._cc_abort(attempt, cause)
            if txn.error is None and self.record_history:  # on the reads the abort rests on
                ts = attempt.ts
                self.history.append(
                    CommittedTxn(ts[0], ts[1], attempt.request, attempt.seen, {}, aborted=True)
                )
            # Final. A logic abort wrote nothing; an error's writes are undone (2PL held them
            # under X locks, so nobody saw them; OCC never installed them), as on a cluster.
            self.finish(attempt, undo=txn.error is not None)
            return True
        return False

    def _note_versions(self, attempt: Attempt, keys: tuple[Key, ...]) -> None:
        if not (self.record_history or self.track_versions):
            return
        seen, versions = attempt.seen, self.versions
        for key in keys:
            if key not in seen:
                seen[key] = versions.get(key, 0)

    def written_groups(self, attempt: Attempt) -> Iterable[Key]:
        """Group keys (see ``storage.Table``) whose version the attempt's commit bumps besides
        its declared writes: none under locks, where a member's writer holds the group key
        shared and a whole-group reader or writer waits for it."""
        return ()

    def _record_commit(self, attempt: Attempt) -> None:
        if not (self.record_history or self.track_versions):
            return
        versions = self.versions
        writes: dict[Key, int] = {}
        declared = (key for piece in attempt.txn.pieces for key in piece.writes)
        for key in itertools.chain(declared, self.written_groups(attempt)):
            if key not in writes:
                writes[key] = versions[key] = versions.get(key, 0) + 1
        if self.record_history:
            ts = attempt.ts
            self.history.append(CommittedTxn(ts[0], ts[1], attempt.request, attempt.seen, writes))

    def _end_backoff(self) -> None:
        for attempt in self._active:
            attempt.backoff = False

    def _cc_abort(self, attempt: Attempt, cause: str) -> bool:
        """Undo and restart the attempt; past the retry budget it ends with a retry reason."""
        stats = self.stats
        stats[f"{self.name}/cc_aborts/{cause}"] = stats.get(f"{self.name}/cc_aborts/{cause}", 0) + 1
        self.finish(attempt, undo=True)
        txn = attempt.txn
        if attempt.tries > self.retries_max:
            stats[f"{self.name}/gave_up"] += 1
            txn.outputs, txn.error = {}, None  # (an error on a view no order had is not final)
            txn.abort_reason = (
                f"retry: {self.name} cc_abort ({cause}) after {attempt.tries} attempts"
            )
            return True
        stats[f"{self.name}/retries"] += 1
        self._end_backoff()
        attempt.backoff = True
        attempt.tries += 1
        attempt.next_piece = 0
        attempt.waiting = False
        attempt.seen = {}
        txn.outputs = {}
        txn.abort_reason = None
        txn.error = None
        attempt.ctx = self.make_context(txn)
        return False


class TwoPhaseLocking(InterleavedProtocol):
    """Strict 2PL on conflict keys: each piece locks its keys (S for reads, X for writes) before
    it runs; every lock is held until commit or abort. Subclasses resolve conflicts."""

    def __init__(self, db: Database, registry: ProcedureRegistry, **options: Any) -> None:
        super().__init__(db, registry, **options)
        self.locks = LockTable()

    def on_conflict(self, attempt: Attempt, blockers: list[Attempt]) -> tuple[Verdict, str]:
        raise NotImplementedError

    def before_piece(self, attempt: Attempt) -> tuple[Verdict, str]:
        piece = attempt.txn.pieces[attempt.next_piece]
        attempt.waiting = False
        for key in piece.writes:
            blockers = self.locks.acquire(attempt, key, "X")
            if blockers:
                return self.on_conflict(attempt, blockers)
        for key in piece.reads:
            blockers = self.locks.acquire(attempt, key, "S")
            if blockers:
                return self.on_conflict(attempt, blockers)
        return Verdict.GO, ""

    def finish(self, attempt: Attempt, *, undo: bool) -> None:
        ctx = attempt.ctx
        assert isinstance(ctx, UndoContext)
        if undo:
            ctx.rollback()
        if attempt.locks:
            self.locks.release_all(attempt)
            for other in self._active:
                other.waiting = False
