"""OCC: optimistic execution with backward read-set validation at commit.

A transaction's pieces read committed data and buffer their writes privately (reads see the
transaction's own buffered writes, secondary-index lookups included). At commit, every conflict
key the transaction declared must still carry the version it had when the transaction first
reached it; if so the buffer is applied and each written key's version is bumped, else the
transaction is restarted (``occ/cc_aborts/validation``). Validation and write-back happen in one
scheduler step, so they are atomic. ``validate = False`` is the canary the tests must catch.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from dgcc import debug
from dgcc.api import PieceContext, PlannedTxn, ProcedureRegistry
from dgcc.protocols._locking import Attempt, InterleavedProtocol, Verdict
from dgcc.storage import Database, Table

__all__ = ["OccProtocol"]

Row = dict[str, Any]


class BufferedContext(PieceContext):
    """A piece context whose writes go to a private buffer: table -> pk -> row (None: deleted)."""

    __slots__ = ("buffer",)

    def __init__(self, db: Database, txn: PlannedTxn) -> None:
        super().__init__(db, txn)
        self.buffer: dict[str, dict[Hashable, Row | None]] = {}

    def _current(self, table: str, pk: Hashable) -> Row | None:
        mine = self.buffer.get(table)
        if mine is not None and pk in mine:
            return mine[pk]
        return self._db.tables[table].rows.get(pk)

    def get(self, table: str, pk: Hashable) -> Mapping[str, Any] | None:
        if debug.check_invariants:
            self._check_record(self._db.tables[table], pk, write=False)
        row = self._current(table, pk)
        if row is None or not debug.check_invariants:
            return row
        return debug.frozen(row)

    def update(self, table: str, pk: Hashable, changes: Mapping[str, Any]) -> None:
        t = self._db.tables[table]
        if debug.check_invariants:
            self._check_record(t, pk, write=True)
        row = self._current(table, pk)
        if row is None:
            raise KeyError(f"{table}: no row with primary key {pk!r}")
        new = {**row, **changes}
        if debug.check_invariants:
            self._check_index_entries(t, pk, row, new)
        _index_keys(t, pk, new)
        self._wrote = True
        self.buffer.setdefault(table, {})[pk] = new

    def insert(self, table: str, pk: Hashable, row: dict[str, Any]) -> None:
        t = self._db.tables[table]
        if debug.check_invariants:
            self._check_record(t, pk, write=True)
            self._check_index_entries(t, pk, None, row)
        if self._current(table, pk) is not None:
            raise KeyError(f"{table}: duplicate primary key {pk!r}")
        _index_keys(t, pk, row)
        self._wrote = True
        self.buffer.setdefault(table, {})[pk] = dict(row)

    def delete(self, table: str, pk: Hashable) -> None:
        t = self._db.tables[table]
        if debug.check_invariants:
            self._check_record(t, pk, write=True)
        row = self._current(table, pk)
        if row is None:
            raise KeyError(f"{table}: no row with primary key {pk!r}")
        if debug.check_invariants:
            self._check_index_entries(t, pk, row, None)
        self._wrote = True
        self.buffer.setdefault(table, {})[pk] = None

    def lookup(self, table: str, index: str, index_key: Hashable) -> list[Hashable]:
        idx = self._index(table, index, index_key)
        base = idx.lookup(index_key)
        mine = self.buffer.get(table)
        if not mine:
            return base
        pks = [pk for pk in base if pk not in mine]
        pks.extend(
            pk
            for pk, row in mine.items()
            if row is not None and idx.index_key(pk, row) == index_key
        )
        pks.sort()
        return pks

    def first(self, table: str, index: str, index_key: Hashable) -> Hashable | None:
        pks = self.lookup(table, index, index_key)
        return pks[0] if pks else None

    def last(self, table: str, index: str, index_key: Hashable) -> Hashable | None:
        pks = self.lookup(table, index, index_key)
        return pks[-1] if pks else None

    def written_groups(self) -> set[Hashable]:
        """The group keys (see ``storage.Table``) of the records in the buffer. Validation
        sees a record written under its own key only through versions, so a commit versions
        its group too, or a reader of the whole group (TPC-C's Delivery, charging a customer it
        finds as it runs) would validate against a member's concurrent writer (a Payment). Two
        writers of one group's records then conflict, as on a coarse key: OCC validates
        declared keys, not records."""
        tables, groups = self._db.tables, set()
        for table, rows in self.buffer.items():
            group_key = tables[table].group_key
            if group_key is not None:
                groups.update(map(group_key, rows))
        return groups

    def apply(self) -> None:
        """Write the buffer into the database."""
        tables = self._db.tables
        for table, rows in self.buffer.items():
            t = tables[table]
            for pk, row in rows.items():
                exists = pk in t.rows
                if row is None:
                    if exists:
                        t.delete(pk)
                elif not exists:
                    t.insert(pk, row)
                elif t.rows[pk].keys() <= row.keys():
                    t.update(pk, row)
                else:  # deleted and inserted again without some field: the new row alone
                    t.delete(pk)
                    t.insert(pk, row)


def _index_keys(table: Table, pk: Hashable, row: Mapping[str, Any]) -> None:
    """Key ``row`` in each of ``table``'s indexes now: a row an index cannot key fails the
    piece that writes it, as under the other protocols, not the commit that applies it."""
    for index in table.indexes.values():
        hash(index.index_key(pk, row))


class OccProtocol(InterleavedProtocol):
    name = "occ"
    track_versions = True

    def __init__(self, db: Database, registry: ProcedureRegistry, **options: Any) -> None:
        super().__init__(db, registry, **options)
        self.validate = True  # the canary test turns this off

    def make_context(self, txn: PlannedTxn) -> PieceContext:
        return BufferedContext(self.db, txn)

    def before_piece(self, attempt: Attempt) -> tuple[Verdict, str]:
        return Verdict.GO, ""

    def _stale(self, attempt: Attempt) -> bool:
        """Whether a key the attempt read has been written since (backward validation)."""
        versions = self.versions
        return self.validate and any(
            versions.get(key, 0) != version for key, version in attempt.seen.items()
        )

    def check_abort(self, attempt: Attempt) -> str | None:
        """A logic abort decided on stale reads restarts, as a commit would: the abort must
        be one a serial order gives."""
        return "validation" if self._stale(attempt) else None

    def try_commit(self, attempt: Attempt) -> str | None:
        if self._stale(attempt):
            return "validation"
        ctx = attempt.ctx
        assert isinstance(ctx, BufferedContext)
        ctx.apply()
        return None

    def written_groups(self, attempt: Attempt) -> Iterable[Hashable]:
        ctx = attempt.ctx
        assert isinstance(ctx, BufferedContext)
        return ctx.written_groups()

    def finish(self, attempt: Attempt, *, undo: bool) -> None:
        ctx = attempt.ctx
        assert isinstance(ctx, BufferedContext)
        ctx.buffer = {}
