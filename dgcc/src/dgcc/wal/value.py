"""Value (redo) logging: an epoch's block is the after-image of every record it wrote.

ARIES-style physical redo without undo (an epoch's writes reach the log only after the epoch ran,
and the log is the only durable copy besides checkpoints). Replay installs the images; nothing
is re-executed, but the log is the largest of the three schemes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from dgcc.storage import Database

__all__ = ["WriteTracker", "record_epoch", "replay_epoch"]

Image = tuple[str, Hashable, dict[str, Any] | None]  # (table, primary key, row or None=deleted)


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
    """After-images of the touched records (distinct records, so any order replays alike)."""
    images: list[Image] = []
    for table_name, pk in touched:
        row = db.tables[table_name].rows.get(pk)
        images.append((table_name, pk, None if row is None else dict(row)))
    return {"images": images}


def replay_epoch(db: Database, payload: dict[str, Any]) -> int:
    """Install the epoch's after-images (indexes follow); returns how many were applied."""
    images: list[Image] = payload["images"]
    for table_name, pk, image in images:
        table = db.tables[table_name]
        if pk in table.rows:
            table.delete(pk)
        if image is not None:
            table.insert(pk, dict(image))
    return len(images)
