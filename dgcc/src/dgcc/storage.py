"""In-memory tables with primary keys, ordered secondary indexes, and conflict keys.

Rows are plain dicts keyed by a hashable primary key. Each table maps a primary key to the
conflict key that protocols order on (``conflict_key``): by default ``(table, pk)``, or a coarser
virtual record such as a TPC-C district for all of that district's orders. Secondary indexes map
an index key to the sorted primary keys under it and are kept up to date by every write.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from dgcc import debug

__all__ = ["Database", "Index", "ReadView", "Table", "collector_paused"]

Row = dict[str, Any]


class Index:
    """A secondary index: ``index_key(pk, row)`` -> sorted list of primary keys.

    ``fields`` names the row fields the index key depends on (beyond the primary key), so an
    update that changes none of them leaves the index alone; ``None`` means any field may.
    """

    __slots__ = ("_entries", "fields", "index_key", "name")

    def __init__(
        self,
        name: str,
        index_key: Callable[[Hashable, Row], Hashable],
        fields: frozenset[str] | None = None,
    ) -> None:
        self.name = name
        self.index_key = index_key
        self.fields = fields
        self._entries: dict[Hashable, list[Any]] = {}

    def add(self, pk: Any, row: Row) -> None:
        self.add_entry(self.index_key(pk, row), pk)

    def add_entry(self, index_key: Hashable, pk: Any) -> None:
        """``pk`` under ``index_key`` (computed by the caller before it changed anything)."""
        pks = self._entries.get(index_key)
        if pks is None:
            self._entries[index_key] = [pk]
        elif pks[-1] < pk:  # the common case (TPC-C's new orders): one comparison, no bisect
            pks.append(pk)
        else:
            bisect.insort(pks, pk)

    def remove(self, pk: Any, row: Row) -> None:
        ik = self.index_key(pk, row)
        pks = self._entries[ik]
        position = bisect.bisect_left(pks, pk)
        assert position < len(pks) and pks[position] == pk, f"index {self.name}: {pk!r} missing"
        del pks[position]
        if not pks:
            del self._entries[ik]

    def install(self, entries: Mapping[Hashable, list[Any]]) -> None:
        """Set whole entries: index key -> its sorted primary keys (empty: the key goes). The
        lists become the index's own."""
        self._entries.update(entries)
        for index_key in [ik for ik, pks in entries.items() if not pks]:
            del self._entries[index_key]

    def build(self, rows: Mapping[Any, Row]) -> None:
        """Index every row of ``rows`` at once (an empty index: a table being loaded)."""
        assert not self._entries, f"index {self.name}: built twice"
        entries: dict[Hashable, list[Any]] = {}
        index_key = self.index_key
        for pk, row in rows.items():
            pks = entries.get(ik := index_key(pk, row))
            if pks is None:
                entries[ik] = [pk]
            else:
                pks.append(pk)
        for pks in entries.values():
            pks.sort()
        self._entries = entries

    def rebuild(self, rows: Mapping[Any, Row]) -> None:
        """Drop every entry and index ``rows`` at once (a table that lost rows in bulk)."""
        self._entries = {}
        self.build(rows)

    def lookup(self, index_key: Hashable) -> list[Any]:
        """Primary keys under ``index_key`` in ascending order (a copy)."""
        return list(self._entries.get(index_key, ()))

    def first(self, index_key: Hashable) -> Any | None:
        pks = self._entries.get(index_key)
        return pks[0] if pks else None

    def last(self, index_key: Hashable) -> Any | None:
        pks = self._entries.get(index_key)
        return pks[-1] if pks else None


class Table:
    """Rows by primary key, with optional secondary indexes.

    Args:
        name: the table's name.
        conflict_key: maps a primary key to the conflict key protocols order on.
        indexes: secondary indexes maintained on every insert, update and delete.
        index_conflict_key: maps ``(index name, index key)`` to the conflict key that guards
            that index entry; by default the entry itself.
        group_key: maps a primary key to a coarser key covering a group of records (TPC-C: a
            district's customers), for pieces that cannot name the record before they run. A
            piece may touch a record under its group key, or under its own key if it also
            declares the group key (reading it at least), so that protocols order it against
            a piece that declares the whole group.
    """

    def __init__(
        self,
        name: str,
        *,
        conflict_key: Callable[[Any], Hashable] | None = None,
        indexes: tuple[Index, ...] = (),
        index_conflict_key: Callable[[str, Hashable], Hashable] | None = None,
        group_key: Callable[[Any], Hashable] | None = None,
    ) -> None:
        self.name = name
        self.group_key = group_key
        self.rows: dict[Any, Row] = {}
        self.conflict_key: Callable[[Any], Hashable] = conflict_key or (lambda pk: (name, pk))
        self.index_conflict_key: Callable[[str, Hashable], Hashable] = index_conflict_key or (
            lambda index, ik: (name, index, ik)
        )
        self.indexes = {index.name: index for index in indexes}
        self._indexes = tuple(indexes)  # every write walks them: a tuple, not dict values
        # The fields some index depends on (None: any may be), so an update of none of them
        # skips the per-index walk (TPC-C: every customer and order update).
        self._watched: frozenset[str] | None = frozenset().union(
            *(index.fields or () for index in indexes)
        )
        if any(index.fields is None for index in indexes):
            self._watched = None

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, pk: Any) -> Row | None:
        return self.rows.get(pk)

    def load(self, rows: Mapping[Any, Row]) -> None:
        """Take ``rows`` into this empty table (a checkpoint's): the row dicts become the
        table's own, and each index is built once instead of row by row."""
        assert not self.rows, f"{self.name}: loading into a table that has rows"
        self.rows.update(rows)
        for index in self._indexes:
            index.build(self.rows)

    def insert(self, pk: Any, row: Row) -> None:
        rows = self.rows
        if pk in rows:
            raise KeyError(f"{self.name}: duplicate primary key {pk!r}")
        if not self._indexes:
            rows[pk] = row
            return
        # every index key first: a row an index cannot key (a missing field) changes nothing
        keys = [index.index_key(pk, row) for index in self._indexes]
        list(map(hash, keys))  # (an unhashable key raises here too, before any change)
        rows[pk] = row
        for index, key in zip(self._indexes, keys, strict=True):
            index.add_entry(key, pk)

    def update(self, pk: Any, changes: Mapping[str, Any]) -> None:
        row = self.rows[pk]
        if not self._indexes or (  # most tables and writes: nothing to keep in step
            self._watched is not None and self._watched.isdisjoint(changes)
        ):
            row.update(changes)
            return
        touched = [
            index
            for index in self._indexes
            if index.fields is None or not index.fields.isdisjoint(changes)
        ]
        changed = {**row, **changes}  # the new index keys first: one that fails changes nothing
        keys = [index.index_key(pk, changed) for index in touched]
        list(map(hash, keys))  # (an unhashable key raises here too, before any change)
        for index in touched:
            index.remove(pk, row)
        row.update(changes)
        for index, key in zip(touched, keys, strict=True):
            index.add_entry(key, pk)

    def insert_many(self, rows: Mapping[Any, Row]) -> None:
        """Insert several new rows at once, as ``insert`` each (recovery's bulk path: one call
        per order's lines, not one per line; value logging's ``WriteTracker`` does not see
        it). The row dicts become the table's own.

        Raises:
            KeyError: a primary key was already in the table; its row is then overwritten
                (checked by the count after the insert, which hashes each key once): for
                callers that give up the table on error, as recovery does.
        """
        present = self.rows
        expected = len(present) + len(rows)
        present.update(rows)
        if len(present) != expected:
            raise KeyError(
                f"{self.name}: {expected - len(present)} duplicate primary keys among "
                f"{list(rows)!r}"
            )
        for index in self._indexes:
            for pk, row in rows.items():
                index.add(pk, row)

    def changer(self, fields: Collection[str]) -> Callable[[Any], Row]:
        """A function from a primary key to its live row, for the caller to change ``fields``
        of it in place: what ``update`` does for them, with no changes dict and no call of
        ours per write (recovery's fast path, which value logging's ``WriteTracker`` does not
        see; call it once per transaction, not per row).

        Raises:
            ValueError: an index depends on one of ``fields`` (in place, it would go stale).
            TypeError: ``fields`` is one string (its characters are not field names).
        """
        if isinstance(fields, str):
            raise TypeError(
                f"{self.name}: changer takes a collection of field names, not {fields!r}"
            )
        for index in self._indexes:
            if index.fields is None or not index.fields.isdisjoint(fields):
                raise ValueError(
                    f"{self.name}: index {index.name} depends on {sorted(fields)}; use update"
                )
        return self.rows.__getitem__

    def delete(self, pk: Any) -> None:
        row = self.rows.pop(pk)
        for index in self._indexes:
            index.remove(pk, row)

    def items(self) -> Iterator[tuple[Any, Row]]:
        return iter(self.rows.items())

    def retain(self, keep: Callable[[Any], bool]) -> None:
        """Drop every row whose primary key ``keep`` rejects, and rebuild the indexes once
        (a node keeping only its partitions of a freshly built database)."""
        self.rows = {pk: row for pk, row in self.rows.items() if keep(pk)}
        for index in self._indexes:
            index.rebuild(self.rows)


class Database:
    """A set of tables. ``dump()`` gives a plain comparable copy of the whole state."""

    def __init__(self, tables: tuple[Table, ...] = ()) -> None:
        self.tables: dict[str, Table] = {}
        for table in tables:
            self.add_table(table)

    def add_table(self, table: Table) -> Table:
        if table.name in self.tables:
            raise KeyError(f"table {table.name!r} already exists")
        self.tables[table.name] = table
        return table

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def read_view(self) -> ReadView:
        return ReadView(self)

    def dump(self) -> dict[str, dict[Any, Row]]:
        """A deep, plain copy of every table: equal dumps mean equal states."""
        return {
            name: {pk: dict(row) for pk, row in table.rows.items()}
            for name, table in self.tables.items()
        }


class ReadView:
    """Read-only access for reconnaissance while a batch is being planned."""

    __slots__ = ("_db",)

    def __init__(self, db: Database) -> None:
        self._db = db

    def get(self, table: str, pk: Any) -> Mapping[str, Any] | None:
        """The live row, not a copy (plans read it before the batch runs); a read-only view of
        it under ``debug.check_invariants``, as pieces get."""
        row = self._db.tables[table].rows.get(pk)
        if row is None or not debug.check_invariants:
            return row
        return MappingProxyType(row)

    def rows(self, table: str) -> Mapping[Any, Mapping[str, Any]]:
        """A table's live rows by primary key, for plans that read many (one lookup per row
        instead of a ``get`` call); read-only, and its rows too under ``debug.check_invariants``.

        Raises:
            KeyError: no such table.
        """
        rows = self._db.tables[table].rows
        if not debug.check_invariants:
            return MappingProxyType(rows)
        return _FrozenRows(rows)

    def lookup(self, table: str, index: str, index_key: Hashable) -> list[Any]:
        return self._db.tables[table].indexes[index].lookup(index_key)

    def first(self, table: str, index: str, index_key: Hashable) -> Any | None:
        return self._db.tables[table].indexes[index].first(index_key)

    def last(self, table: str, index: str, index_key: Hashable) -> Any | None:
        return self._db.tables[table].indexes[index].last(index_key)


class _FrozenRows(Mapping[Any, Mapping[str, Any]]):
    """Rows by primary key where each row reads as ``debug.frozen`` (``ReadView.rows``)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: dict[Any, Row]) -> None:
        self._rows = rows

    def __getitem__(self, pk: Any) -> Mapping[str, Any]:
        return debug.frozen(self._rows[pk])

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Turn Python's cyclic garbage collector off for the block (back on after it, if it was).

    For work that builds or rewrites many long-lived, acyclic rows (loading a database,
    recovering one): with the collector on, it rescans the growing heap again and again, while
    reference counts free the short-lived objects anyway.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
