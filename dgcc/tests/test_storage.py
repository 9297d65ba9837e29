"""Tables: a bulk load (as from a checkpoint) equals inserting the same rows one by one; a
plan's bulk read access (``ReadView.rows``) sees the live rows and refuses writes.

Goal: ``Table.load`` builds each secondary index once, and must leave exactly the rows and index
entries that row-by-row inserts leave, so recovery can use it. Method: random rows (hypothesis)
into two tables of the same shape, one loaded in bulk and one by inserts; then the same writes
on both.
"""

from __future__ import annotations

import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgcc import debug
from dgcc.storage import Database, Index, Table, collector_paused

GROUPS = 4


def _table() -> Table:
    by_group = Index("by_group", lambda pk, row: row["group"], frozenset({"group"}))
    by_parity = Index("by_parity", lambda pk, row: pk % 2)
    return Table("t", indexes=(by_group, by_parity))


def _entries(table: Table) -> dict:
    keys = {"by_group": range(GROUPS), "by_parity": range(2)}
    return {name: {ik: index.lookup(ik) for ik in keys[name]}
            for name, index in table.indexes.items()}  # fmt: skip


rows_strategy = st.dictionaries(
    st.integers(0, 200), st.integers(0, GROUPS - 1).map(lambda g: {"group": g, "v": 0})
)


@given(rows=rows_strategy, moves=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 3))))
def test_load_equals_inserts(rows: dict, moves: list) -> None:
    loaded, inserted = _table(), _table()
    loaded.load({pk: dict(row) for pk, row in rows.items()})
    for pk, row in rows.items():
        inserted.insert(pk, dict(row))
    assert loaded.rows == inserted.rows
    assert _entries(loaded) == _entries(inserted)
    for pk, group in moves:  # the loaded indexes stay right under later writes
        for table in (loaded, inserted):
            if pk in table.rows and group == 0 and pk % 3 == 0:
                table.delete(pk)
            elif pk in table.rows:
                table.update(pk, {"group": group})
    assert _entries(loaded) == _entries(inserted)


def _group_index() -> Index:
    return Index("by_group", lambda pk, row: row["group"], frozenset({"group"}))


@given(
    rows=rows_strategy,
    writes=st.lists(
        st.tuples(st.integers(0, 200), st.sampled_from(["group", "v"]), st.integers(0, 3))
    ),
)
def test_updates_move_index_entries_only_for_watched_fields(rows: dict, writes: list) -> None:
    # An update that changes no field an index depends on skips the index walk (``_watched``);
    # one that changes a watched field moves the entry. Either way the index equals a rebuild.
    table = Table("t", indexes=(_group_index(),))
    table.load({pk: dict(row) for pk, row in rows.items()})
    for pk, field, value in writes:
        if pk in table.rows:
            table.update(pk, {field: value})
    rebuilt = _group_index()
    rebuilt.build(table.rows)
    live = table.indexes["by_group"]
    assert [live.lookup(g) for g in range(GROUPS)] == [rebuilt.lookup(g) for g in range(GROUPS)]


@given(rows=rows_strategy, modulus=st.integers(1, 4))
def test_retain_equals_loading_the_kept_rows(rows: dict, modulus: int) -> None:
    retained, loaded = _table(), _table()
    retained.load({pk: dict(row) for pk, row in rows.items()})
    retained.retain(lambda pk: pk % modulus == 0)
    loaded.load({pk: dict(row) for pk, row in rows.items() if pk % modulus == 0})
    assert retained.rows == loaded.rows
    assert _entries(retained) == _entries(loaded)
    for pk in list(retained.rows)[:3]:  # the rebuilt indexes stay right under later writes
        for table in (retained, loaded):
            table.update(pk, {"group": (pk + 1) % GROUPS})
    assert _entries(retained) == _entries(loaded)


def test_index_add_keeps_primary_keys_sorted_in_any_insert_order() -> None:
    # ``Index.add`` appends a key above the last one and bisects the others in.
    for order in ([1, 2, 3, 4], [4, 3, 2, 1], [2, 4, 1, 3]):
        table = Table("t", indexes=(_group_index(),))
        for pk in order:
            table.insert(pk, {"group": 0, "v": 0})
        assert table.indexes["by_group"].lookup(0) == [1, 2, 3, 4], order


def test_load_refuses_a_table_with_rows() -> None:
    table = _table()
    table.insert(1, {"group": 0, "v": 0})
    with pytest.raises(AssertionError, match="loading into a table that has rows"):
        table.load({2: {"group": 1, "v": 0}})


@pytest.fixture
def accounts() -> Database:
    database = Database((Table("account"),))
    database["account"].insert(1, {"balance": 10})
    database["account"].insert(2, {"balance": 20})
    return database


def test_view_rows_read_the_live_rows_and_refuse_writes(accounts: Database) -> None:
    rows = accounts.read_view().rows("account")
    assert rows[1]["balance"] == 10 and len(rows) == 2 and 3 not in rows
    accounts["account"].update(1, {"balance": 11})  # a view of the live table, not a copy
    assert rows[1]["balance"] == 11
    with pytest.raises(TypeError):
        rows[3] = {"balance": 0}  # type: ignore[index]


def test_view_rows_are_frozen_under_invariant_checks(accounts: Database) -> None:
    with debug.invariants():
        rows = accounts.read_view().rows("account")
        assert sorted(rows) == [1, 2] and rows[2] == {"balance": 20}
        with pytest.raises(TypeError):
            rows[2]["balance"] = 0  # type: ignore[index]
        with pytest.raises(KeyError):
            rows[3]
    assert accounts["account"].get(2) == {"balance": 20}


def test_view_rows_of_an_unknown_table_raise(accounts: Database) -> None:
    with pytest.raises(KeyError):
        accounts.read_view().rows("nope")


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_paused_restores_the_collector_state(enabled: bool) -> None:
    before = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(RuntimeError), collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("the block failed")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if before else gc.disable)()


def test_changer_refuses_indexed_fields_and_a_bare_string() -> None:
    table = Table(
        "c", indexes=(Index("by_last", lambda pk, row: row["c_last"], frozenset({"c_last"})),)
    )
    table.insert(1, {"c_last": "BAR", "n": 0})
    table.changer(("n",))(1)["n"] = 5
    assert table.get(1) == {"c_last": "BAR", "n": 5}
    with pytest.raises(ValueError, match="index by_last depends on"):
        table.changer(("c_last",))
    with pytest.raises(TypeError, match="not 'c_last'"):  # its characters miss the index
        table.changer("c_last")
