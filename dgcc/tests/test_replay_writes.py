"""Replay's write paths: ``Table.insert_many`` and ``Table.changer``, alone and in a replay child.

Goal: inserting rows in bulk leaves exactly the rows and index entries that inserting them one
by one leaves, and refuses a duplicate key; changing fields in place through a ``changer``
equals ``update`` and is refused for fields an index depends on; a partitioned-replay child
that writes through every path (``insert``, ``insert_many``, ``update``, ``changer``,
``delete``) ships changes that rebuild its rows and indexes in the parent; and the child's
tracking wraps every table writer, so a writer added later without a wrapper fails here
instead of losing writes in recovery. Method: random write sequences (hypothesis) on a toy
table with a secondary index and one without, mirrored by the one-row-at-a-time methods.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgcc.storage import Database, Index, Table
from dgcc.wal import parallel

GROUPS = 4


def _db() -> Database:
    by_group = Index("by_group", lambda pk, row: row["group"], frozenset({"group"}))
    by_parity = Index("by_parity", lambda pk, row: pk % 2, frozenset())
    return Database((Table("t", indexes=(by_group, by_parity)), Table("u")))


def _state(db: Database) -> tuple[dict, dict]:
    """Every row, and every index entry of the indexed table."""
    indexes = db.tables["t"].indexes
    entries = {
        "by_group": {group: indexes["by_group"].lookup(group) for group in range(GROUPS)},
        "by_parity": {parity: indexes["by_parity"].lookup(parity) for parity in range(2)},
    }
    return db.dump(), entries


_batches = st.lists(
    st.dictionaries(
        st.integers(0, 30),
        st.fixed_dictionaries({"group": st.integers(0, GROUPS - 1), "n": st.integers(0, 9)}),
        max_size=6,
    ),
    max_size=5,
)


@given(_batches)
def test_insert_many_equals_inserting_each(batches: list[dict[int, dict]]) -> None:
    bulk, single = _db(), _db()
    for batch in batches:
        fresh = {pk: row for pk, row in batch.items() if pk not in bulk.tables["t"].rows}
        for name in ("t", "u"):
            bulk.tables[name].insert_many({pk: dict(row) for pk, row in fresh.items()})
            for pk, row in fresh.items():
                single.tables[name].insert(pk, dict(row))
    assert _state(bulk) == _state(single)


def test_insert_many_refuses_a_duplicate_key() -> None:
    db = _db()
    db.tables["u"].insert(3, {"group": 0, "n": 0})
    with pytest.raises(KeyError, match=r"u: 1 duplicate primary keys among \[2, 3\]"):
        db.tables["u"].insert_many({2: {"group": 1, "n": 1}, 3: {"group": 1, "n": 1}})


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9)), max_size=20))
def test_changer_changes_fields_as_update_does(changes: list[tuple[int, int]]) -> None:
    in_place, updated = _db(), _db()
    for db in (in_place, updated):
        for pk in range(6):
            db.tables["t"].insert(pk, {"group": pk % GROUPS, "n": 0})
    row_of = in_place.tables["t"].changer(("n",))
    for pk, number in changes:
        row_of(pk)["n"] += number
        updated.tables["t"].update(pk, {"n": updated.tables["t"].rows[pk]["n"] + number})
    assert _state(in_place) == _state(updated)


def test_changer_refuses_fields_an_index_depends_on() -> None:
    table = _db().tables["t"]
    with pytest.raises(ValueError, match=r"t: index by_group depends on \['group', 'n'\]"):
        table.changer(("n", "group"))
    anything = Table("v", indexes=(Index("by_any", lambda pk, row: row["n"]),))
    with pytest.raises(ValueError, match=r"v: index by_any depends on \['n'\]"):
        anything.changer(("n",))


_ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert_many", "update", "changer", "delete"]),
        st.integers(0, 8),
        st.integers(0, GROUPS - 1),
    ),
    max_size=40,
)


def _write(table: Table, op: str, pk: int, number: int) -> None:
    """One write of ``op`` on ``table`` where it applies (a no-op where it would fail)."""
    exists = pk in table.rows
    if op == "insert" and not exists:
        table.insert(pk, {"group": number, "n": number})
    elif op == "insert_many" and not exists and pk + 10 not in table.rows:
        table.insert_many({pk: {"group": number, "n": 0}, pk + 10: {"group": 0, "n": number}})
    elif op == "update" and exists:
        table.update(pk, {"group": number} if number % 2 else {"n": number})
    elif op == "changer" and exists:
        table.changer(("n",))(pk)["n"] += number + 1
    elif op == "delete" and exists:
        table.delete(pk)


@given(_ops)
def test_a_childs_writes_through_every_path_rebuild_its_state(
    ops: list[tuple[str, int, int]],
) -> None:
    """Whatever a child writes, by any writer, the parent that applies its changes ends with
    the child's rows and index entries."""
    child, parent = _db(), _db()
    for db in (child, parent):
        for name in ("t", "u"):
            for pk in range(3):
                db.tables[name].insert(pk, {"group": pk % GROUPS, "n": pk})
    changes = parallel._Changes(child)
    for op, pk, number in ops:
        for table in child.tables.values():
            _write(table, op, pk, number)
    parallel._apply(parent, changes.take())
    assert _state(parent) == _state(child)


def test_the_child_tracks_every_table_writer() -> None:
    """Canary: every public ``Table`` method but the readers, the checkpoint ``load`` (before
    replay) and ``retain`` (a node cutting its initial load down, before any log exists) is
    replaced by the child's tracking; a new writer must get a wrapper too."""
    not_replay_writers = {"get", "items", "load", "retain"}
    public = {name for name, member in vars(Table).items() if callable(member)}
    writers = {name for name in public if not name.startswith("_")} - not_replay_writers
    assert {"insert", "insert_many", "update", "changer", "delete"} <= writers
    db = _db()
    parallel._Changes(db)
    for table in db.tables.values():
        unwrapped = sorted(name for name in writers if name not in vars(table))
        assert not unwrapped, f"{table.name}: writers not tracked by the replay child: {unwrapped}"
