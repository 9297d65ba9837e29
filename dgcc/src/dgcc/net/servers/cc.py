"""Per-node concurrency control for the two-phase-commit baselines: 2PL NO_WAIT, WAIT_DIE, OCC.

Each node runs one ``NodeCC`` over the rows it owns. A ``Branch`` is one attempt of one
transaction on one node: the pieces it ran here, their context (undo log or write buffer), its
locks, and the version of each conflict key when the attempt first reached it. The server
drives a branch through ``before_piece`` (may wait, or name a concurrency-control abort cause),
``prepare`` (the 2PC vote), ``commit`` and ``abort``. Versions are bumped once per committed
writer, exactly as in the single-process baselines (``protocols._history``), so the cluster's
committed history can be checked for conflict-serializability the same way. ``after_images``
gives a branch's redo for the write-ahead log (``dgcc.wal.twopc_log``).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dgcc.api import PieceContext, PlannedTxn
from dgcc.protocols._locking import LockTable, UndoContext
from dgcc.protocols.occ import BufferedContext
from dgcc.storage import Database

__all__ = ["Branch", "NoWaitCC", "NodeCC", "OccCC", "WaitDieCC"]

Key = Hashable
Timestamp = tuple[int, int, int]  # (first-attempt start ns, origin node, sequence)


@dataclass(eq=False, slots=True)
class Branch:
    """One attempt of a transaction on one node."""

    ts: Timestamp
    txn: PlannedTxn
    ctx: PieceContext
    seen: dict[Key, int] = field(default_factory=dict)
    written: set[Key] = field(default_factory=set)
    locks: dict[Key, str] = field(default_factory=dict)  # LockTable's bookkeeping
    prepared: bool = False


class NodeCC(ABC):
    """One node's concurrency control; subclasses are the protocols."""

    name: ClassVar[str]

    def __init__(self, db: Database) -> None:
        self.db = db
        self.versions: dict[Key, int] = {}

    def branch(self, ts: Timestamp, txn: PlannedTxn) -> Branch:
        return Branch(ts, txn, self.make_context(txn))

    def make_context(self, txn: PlannedTxn) -> PieceContext:
        return UndoContext(self.db, txn)

    @abstractmethod
    async def before_piece(self, branch: Branch, keys: dict[Key, str]) -> str | None:
        """Get ready to run a piece touching ``keys`` (key -> "S"/"X"); an abort cause or None."""

    def note(self, branch: Branch, keys: dict[Key, str]) -> None:
        """Record the versions of keys first reached, and the keys written."""
        seen, versions = branch.seen, self.versions
        for key, mode in keys.items():
            if key not in seen:
                seen[key] = versions.get(key, 0)
            if mode == "X":
                branch.written.add(key)

    def prepare(self, branch: Branch) -> bool:
        """The 2PC vote: True when the branch can commit (it then must, if told to)."""
        branch.prepared = True
        return True

    def after_images(self, branch: Branch) -> dict[str, dict[Key, dict[str, Any] | None]]:
        """Copies of the rows the branch wrote as they are now (None: deleted), by table.

        Called while the branch still holds what it wrote (before commit releases it).
        """
        ctx = branch.ctx
        assert isinstance(ctx, UndoContext), f"{self.name}: no undo log to take images from"
        tables = self.db.tables
        images: dict[str, dict[Key, dict[str, Any] | None]] = {}
        for _, table, pk, _ in ctx.undo_log:
            row = tables[table].rows.get(pk)
            images.setdefault(table, {})[pk] = None if row is None else dict(row)
        return images

    def commit(self, branch: Branch) -> dict[Key, int]:
        """Make the branch's writes durable in memory; the versions it installed."""
        versions = self.versions
        installed = {}
        for key in branch.written:
            installed[key] = versions[key] = versions.get(key, 0) + 1
        self.release(branch)
        return installed

    def abort(self, branch: Branch) -> None:
        ctx = branch.ctx
        if isinstance(ctx, UndoContext):
            ctx.rollback()
        self.release(branch)

    @abstractmethod
    def release(self, branch: Branch) -> None:
        """Drop whatever the branch holds (locks, buffer)."""


class _Locking(NodeCC):
    """Strict 2PL on conflict keys; ``on_conflict`` decides between waiting and dying."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.locks = LockTable()
        self._released = asyncio.Event()

    async def before_piece(self, branch: Branch, keys: dict[Key, str]) -> str | None:
        while True:
            blockers = self._acquire(branch, keys)
            if not blockers:
                self.note(branch, keys)
                return None
            cause = self.on_conflict(branch, blockers)
            if cause is not None:
                return cause
            self._released.clear()
            await self._released.wait()

    def _acquire(self, branch: Branch, keys: dict[Key, str]) -> list[Any]:
        for key, mode in keys.items():
            blockers = self.locks.acquire(branch, key, mode)  # type: ignore[arg-type]
            if blockers:
                return blockers
        return []

    def on_conflict(self, branch: Branch, blockers: list[Branch]) -> str | None:
        raise NotImplementedError

    def release(self, branch: Branch) -> None:
        if branch.locks:
            self.locks.release_all(branch)  # type: ignore[arg-type]
            self._released.set()


class NoWaitCC(_Locking):
    name = "no_wait"

    def on_conflict(self, branch: Branch, blockers: list[Branch]) -> str | None:
        return "lock_conflict"


class WaitDieCC(_Locking):
    """An older requester waits for a younger holder; a younger one dies (no deadlock)."""

    name = "wait_die"

    def on_conflict(self, branch: Branch, blockers: list[Branch]) -> str | None:
        if all(branch.ts < other.ts for other in blockers):
            return None
        return "die"


class OccCC(NodeCC):
    """Read phase on committed data with private writes; validation and write phase at 2PC.

    ``prepare`` validates every key the branch reached (its version is unchanged) and locks
    them until commit or abort, exclusively the keys it writes and shared the ones it only
    read; a key another prepared branch holds in a conflicting mode fails the vote. Holding
    the read keys too is what keeps validation sound when one transaction validates on
    several nodes at different moments.
    """

    name = "occ"
    validate = True  # only the canary test turns version validation off

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._prepared = LockTable()

    def make_context(self, txn: PlannedTxn) -> PieceContext:
        return BufferedContext(self.db, txn)

    async def before_piece(self, branch: Branch, keys: dict[Key, str]) -> str | None:
        self.note(branch, keys)
        return None

    def prepare(self, branch: Branch) -> bool:
        versions, prepared = self.versions, self._prepared
        ctx = branch.ctx
        assert isinstance(ctx, BufferedContext)
        branch.written.update(ctx.written_groups())  # locked X, versioned at commit
        for key, version in branch.seen.items():
            mode = "X" if key in branch.written else "S"
            stale = self.validate and versions.get(key, 0) != version
            if stale or prepared.acquire(branch, key, mode):  # type: ignore[arg-type]
                prepared.release_all(branch)  # type: ignore[arg-type]
                return False
        branch.prepared = True
        return True

    def after_images(self, branch: Branch) -> dict[str, dict[Key, dict[str, Any] | None]]:
        """The write buffer (copied): exactly what ``commit`` will install."""
        ctx = branch.ctx
        assert isinstance(ctx, BufferedContext), f"{self.name}: no write buffer"
        return {
            table: {pk: None if row is None else dict(row) for pk, row in rows.items()}
            for table, rows in ctx.buffer.items()
        }

    def commit(self, branch: Branch) -> dict[Key, int]:
        ctx = branch.ctx
        assert isinstance(ctx, BufferedContext) and branch.prepared, "commit before prepare"
        ctx.apply()
        return super().commit(branch)

    def release(self, branch: Branch) -> None:
        if branch.locks:
            self._prepared.release_all(branch)  # type: ignore[arg-type]
        ctx = branch.ctx
        assert isinstance(ctx, BufferedContext)
        ctx.buffer = {}


PROTOCOLS: dict[str, type[NodeCC]] = {cc.name: cc for cc in (NoWaitCC, WaitDieCC, OccCC)}
