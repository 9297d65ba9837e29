"""Value (redo) logging: an epoch's block is the after-image of every record it wrote.

ARIES-style physical redo without undo (an epoch's writes reach the log only after the epoch ran,
and the log is the only durable copy besides checkpoints). Replay installs the images; nothing
is re-executed, but the log is the largest of the three schemes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from dgcc.storage import Database, Table

__all__ = ["WriteTracker", "record_epoch", "replay_epoch"]


class WriteTracker:
    """Records which (table, primary key) an epoch wrote, by wrapping each table's writers.

    The wrappers are instance attributes, so only this database pays for them, and only when
    value logging is on.
    """

    def __init__(self, db: Database) -> None:
        self.touched: set[tuple[str, Hashable]] = set()
        for table in db.tables.values():
            for method in ("insert", "update", "delete"):
                setattr(table, method, self._wrap(table.name, getattr(table, method)))

    def _wrap(self, table_name: str, write: Callable[..., None]) -> Callable[..., None]:
        add = self.touched.add

        def tracked(pk: Hashable, *args: Any) -> None:
            add((table_name, pk))
            write(pk, *args)

        return tracked

    def take(self) -> set[tuple[str, Hashable]]:
        touched = set(self.touched)  # the wrappers hold ``self.touched.add``: keep that set
        self.touched.clear()
        return touched


def record_epoch(db: Database, touched: set[tuple[str, Hashable]]) -> dict[str, Any]:
    """After-images of the touched records, by table (None: the record was deleted)."""
    images: dict[str, dict[Hashable, dict[str, Any] | None]] = {}
    for table_name, pk in touched:
        row = db.tables[table_name].rows.get(pk)
        images.setdefault(table_name, {})[pk] = None if row is None else dict(row)
    return {"images": images}


def replay_epoch(db: Database, payload: dict[str, Any]) -> int:
    """Install the epoch's after-images; returns how many were applied.

    A table without secondary indexes takes its images in one bulk dict update; elsewhere an
    index is touched only where the image changes one of its fields. The payload's row dicts
    become the table's rows (a decoded payload is used once).
    """
    images: dict[str, dict[Hashable, dict[str, Any] | None]] = payload["images"]
    for table_name, table_images in images.items():
        table = db.tables[table_name]
        if not table.indexes:
            table.rows.update(table_images)
            for pk in [pk for pk, image in table_images.items() if image is None]:
                table.rows.pop(pk, None)  # inserted and deleted within the epoch: never there
            continue
        for pk, image in table_images.items():
            _install(table, pk, image)
    return sum(map(len, images.values()))


def _install(table: Table, pk: Hashable, image: dict[str, Any] | None) -> None:
    row = table.rows.get(pk)
    if image is None:
        if row is not None:
            table.delete(pk)
    elif row is None:
        table.insert(pk, image)
    else:
        moved = [
            index
            for index in table.indexes.values()
            if index.fields is None or any(row.get(f) != image.get(f) for f in index.fields)
        ]
        for index in moved:
            index.remove(pk, row)
        table.rows[pk] = image
        for index in moved:
            index.add(pk, image)
