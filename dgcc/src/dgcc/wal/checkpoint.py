"""Transaction-consistent checkpoints at epoch boundaries, taken without stopping the node.

Between two epochs the state is exactly "all epochs up to E", so a copy taken there needs no
undo. ``Checkpointer`` forks a child that holds a copy-on-write image of that state and writes
the snapshot while the parent runs the next epochs. The snapshot is one checksummed block
(``format``); the manifest names the newest complete snapshot and is replaced atomically (tmp,
fsync, rename, directory fsync), so a crash at any point leaves the previous checkpoint usable.
A directory may also record, the same way, the workload and options that wrote it
(``WORKLOAD``), so recovery can rebuild that workload and refuse another, and a cluster node's
directory the cluster it belongs to (``LAYOUT``: protocol, node count, partition map, node id),
so a node started into another cluster's directory is refused before it touches the log.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dgcc.errors import ConfigError, DgccError
from dgcc.storage import Database
from dgcc.wal.crashpoints import crashpoint
from dgcc.wal.format import BlockKind, WalCorrupt, decode_payload, encode_block, scan_bytes
from dgcc.wal.writer import fsync_dir, write_all

__all__ = [
    "ACKED_RECORD",
    "LAYOUT_RECORD",
    "MANIFEST",
    "WORKLOAD_RECORD",
    "Checkpointer",
    "check_layout_record",
    "check_workload_record",
    "load_snapshot",
    "publish",
    "read_acked",
    "read_manifest",
    "read_workload_record",
    "write_acked",
    "write_checkpoint",
    "write_snapshot",
    "write_workload_record",
]

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST"
# A cluster node's record, written as it stops, of the newest epoch durable on every node: its
# blocks record that only for earlier epochs (each block carries what was known as it was cut).
ACKED_RECORD = "ACKED"
WORKLOAD_RECORD = "WORKLOAD"
LAYOUT_RECORD = "LAYOUT"
_SNAPSHOT = re.compile(r"^ckpt-(\d{12})\.snap$")


def _write_file(path: Path, data: bytes, crash_name: str | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        half = len(data) // 2
        write_all(fd, data[:half])
        if crash_name is not None:
            crashpoint(crash_name)
        write_all(fd, data[half:])
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(directory: Path, db: Database, epoch: int) -> Path:
    """Write the snapshot of ``db`` after ``epoch`` and point the manifest at it."""
    write_snapshot(directory, db, epoch)
    return publish(directory, epoch)


def write_snapshot(directory: Path, db: Database, epoch: int) -> None:
    """Write the snapshot file of ``db`` after ``epoch``; the manifest does not name it yet."""
    name = _snapshot_name(epoch)
    tmp = directory / (name + ".tmp")
    _write_file(tmp, encode_block(BlockKind.SNAPSHOT, epoch, db.dump()), "ckpt.mid_write")
    os.replace(tmp, directory / name)
    fsync_dir(directory)


def publish(directory: Path, epoch: int) -> Path:
    """Point the manifest at the (complete) snapshot of ``epoch``: recovery starts there."""
    name = _snapshot_name(epoch)
    assert (directory / name).exists(), f"publishing missing snapshot {name}"
    manifest_tmp = directory / (MANIFEST + ".tmp")
    _write_file(manifest_tmp, json.dumps({"epoch": epoch, "snapshot": name}).encode())
    crashpoint("ckpt.before_rename")
    os.replace(manifest_tmp, directory / MANIFEST)
    fsync_dir(directory)
    crashpoint("ckpt.after_rename")
    return directory / name


def write_acked(directory: Path, epoch: int) -> None:
    """Record (durably) that epochs up to ``epoch`` are durable on every node of the cluster."""
    path = directory / ACKED_RECORD
    _write_file(path.with_suffix(".tmp"), json.dumps({"epoch": epoch}).encode())
    os.replace(path.with_suffix(".tmp"), path)
    fsync_dir(directory)


def read_acked(directory: Path) -> int:
    """The epoch ``write_acked`` last recorded in ``directory``; 0 without a record.

    Raises:
        WalCorrupt: the record is not what ``write_acked`` writes.
    """
    path = directory / ACKED_RECORD
    found = _read_json(path, "acked record")
    if found is None:
        return 0
    record, text = found
    epoch = record.get("epoch") if isinstance(record, dict) else None
    if type(epoch) is not int or epoch < 0:
        raise WalCorrupt(f'{path}: bad acked record {text.strip()!r:.80}: expected {{"epoch": E}}')
    return epoch


def _read_json(path: Path, what: str) -> tuple[Any, str] | None:
    """The JSON value in ``path`` and its text, or None when there is no such file.

    Raises:
        WalCorrupt: the file is not JSON (naming it as ``what``).
    """
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    try:
        return json.loads(text), text
    except ValueError as error:
        raise WalCorrupt(f"{path}: unreadable {what}: {error}") from None


def read_manifest(directory: Path) -> tuple[int, Path] | None:
    """(epoch, snapshot path) of the newest complete checkpoint, or None if there is none."""
    path = directory / MANIFEST
    found = _read_json(path, "manifest")
    if found is None:
        return None
    manifest, text = found
    epoch = manifest.get("epoch") if isinstance(manifest, dict) else None
    # ``publish`` writes exactly this shape; anything else was not written by us
    if type(epoch) is not int or epoch < 0 or manifest.get("snapshot") != _snapshot_name(epoch):
        raise WalCorrupt(
            f"{path}: bad manifest {text.strip()!r:.120}: expected "
            '{"epoch": E >= 0, "snapshot": "ckpt-<E, 12 digits>.snap"}'
        )
    return epoch, directory / manifest["snapshot"]


def write_workload_record(directory: Path, name: str, options: Mapping[str, Any]) -> None:
    """Record in ``directory`` that workload ``name`` with ``options`` (JSON values) writes it."""
    tmp = directory / (WORKLOAD_RECORD + ".tmp")
    _write_file(tmp, json.dumps({"workload": name, "options": dict(options)}).encode())
    os.replace(tmp, directory / WORKLOAD_RECORD)
    fsync_dir(directory)


def read_workload_record(directory: Path) -> tuple[str, dict[str, Any]] | None:
    """(name, options) of the workload ``directory`` records, or None if it records none.

    Raises:
        WalCorrupt: the record is not one ``write_workload_record`` writes.
    """
    path = directory / WORKLOAD_RECORD
    found = _read_json(path, "workload record")
    if found is None:
        return None
    record, text = found
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("workload"), str)
        or not isinstance(record.get("options"), dict)
    ):
        raise WalCorrupt(
            f'{path}: bad workload record {text.strip()!r:.120}: expected {{"workload": NAME, '
            '"options": {...}}'
        )
    return record["workload"], record["options"]


def check_workload_record(
    directory: Path, name: str, options: Mapping[str, Any], *, claim: bool
) -> None:
    """Refuse to run or recover workload ``name`` with ``options`` on a directory another
    workload wrote; with ``claim``, a directory that records none (new, or written before
    directories recorded their workload) is recorded as this workload's.

    Raises:
        ConfigError: the directory records another workload or other options.
        WalCorrupt: its record is damaged.
    """
    wanted = json.loads(json.dumps(dict(options)))  # as the record holds them (lists, not tuples)
    recorded = read_workload_record(directory) if directory.is_dir() else None
    if recorded is None:
        if claim:
            directory.mkdir(parents=True, exist_ok=True)
            write_workload_record(directory, name, wanted)
        return
    if recorded != (name, wanted) and not _same_workload(recorded, (name, wanted)):
        raise ConfigError(
            f"{directory} holds the log of workload {recorded[0]!r} with options {recorded[1]}, "
            f"not {name!r} with {wanted}: give this cluster a new data dir, or the config that "
            "wrote it"
        )


def check_layout_record(directory: Path, layout: Mapping[str, Any], *, claim: bool) -> None:
    """Refuse to run a cluster node on a directory another cluster layout wrote: ``layout`` is
    a JSON object (protocol, nodes, partition map, node id); with ``claim``, a directory that
    records none (new, or written before directories recorded it) is recorded as this one's.

    Raises:
        ConfigError: the directory records another layout.
        WalCorrupt: its record is damaged.
    """
    wanted = json.loads(json.dumps(dict(layout)))
    path = directory / LAYOUT_RECORD
    found = _read_json(path, "layout record") if directory.is_dir() else None
    if found is None:
        if claim:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / (LAYOUT_RECORD + ".tmp")
            _write_file(tmp, json.dumps(wanted, sort_keys=True).encode())
            os.replace(tmp, path)
            fsync_dir(directory)
        return
    recorded, text = found
    if not isinstance(recorded, dict):
        raise WalCorrupt(f"{path}: bad layout record {text.strip()!r:.120}: expected an object")
    if recorded != wanted and {**recorded, "node": wanted.get("node")} == wanted:
        raise ConfigError(
            f"{directory} holds the log of node {recorded.get('node')!r} of this cluster, not "
            f"of node {wanted.get('node')!r}: give each node the data dir it wrote"
        )
    if recorded != wanted:
        changed = ", ".join(
            f"{key} {recorded.get(key)!r} (not {wanted.get(key)!r})"
            for key in sorted(set(recorded) | set(wanted))
            if recorded.get(key) != wanted.get(key)
        )
        raise ConfigError(
            f"{directory} holds the log of another cluster: {changed}; give this cluster a new "
            "data dir, or the config that wrote it"
        )


def _same_workload(first: tuple[str, dict], second: tuple[str, dict]) -> bool:
    """Whether two (name, options) build the same workload: options spelled differently (a
    default given or left out) compare by what the workload reports it was built with."""
    from dgcc.workloads import get_workload

    if first[0] != second[0]:
        return False
    try:
        built = [get_workload(name, **options).describe() for name, options in (first, second)]
    except (DgccError, TypeError):  # options the workload rejects: they cannot be the same
        return False
    return bool(built[0]) and built[0] == built[1]


def _snapshot_name(epoch: int) -> str:
    return f"ckpt-{epoch:012d}.snap"


def load_snapshot(path: Path, epoch: int, schema: Callable[[], Database]) -> Database:
    """Rebuild the database of a snapshot into ``schema()``'s empty tables (indexes follow).

    Raises:
        WalCorrupt: the snapshot is missing, damaged, or of another epoch.
        ConfigError: it holds a table ``schema`` lacks (another workload's directory).
    """
    if not path.exists():
        raise WalCorrupt(f"checkpoint snapshot {path} named by the manifest is missing")
    scan = scan_bytes(path.read_bytes(), str(path))
    if scan.problem is not None:  # (nothing is dropped from a snapshot: used whole or not)
        raise WalCorrupt(f"checkpoint snapshot {scan.damage}")
    if len(scan.blocks) != 1 or scan.blocks[0].epoch != epoch:
        found = [block.epoch for block in scan.blocks]
        raise WalCorrupt(
            f"checkpoint snapshot {path} is damaged: one block of epoch {epoch} expected, "
            f"found blocks of epochs {found}"
        )
    tables = decode_payload(scan.blocks[0])
    db = schema()
    unknown = sorted(set(tables) - set(db.tables))
    if unknown:
        raise ConfigError(
            f"{path.parent} holds table {unknown[0]!r} unknown to the workload recovering it "
            "(another workload's directory?)"
        )
    for table_name, rows in tables.items():
        db.tables[table_name].load(rows)
    return db


def remove_old_snapshots(directory: Path, kept_epoch: int) -> None:
    for path in directory.iterdir():
        match = _SNAPSHOT.match(path.name)
        if (match and int(match.group(1)) < kept_epoch) or path.name.endswith(".snap.tmp"):
            path.unlink()


class Checkpointer:
    """Takes checkpoints in a forked child (or inline when ``fork`` is False).

    At most one checkpoint is in flight; ``poll`` reaps it and returns its epoch once it has
    completed, so the caller can truncate the log. With ``publish=False`` the child writes only
    the snapshot, and the caller ``publish``es it later (a cluster node waits until every node
    has made the epoch durable, so no node restarts from a state others cannot reach).
    """

    def __init__(self, directory: Path, *, fork: bool = True, publish: bool = True) -> None:
        self.directory = directory
        self.fork = fork
        self._write = write_checkpoint if publish else write_snapshot
        self._child: tuple[int, int] | None = None  # (pid, epoch)

    @property
    def busy(self) -> bool:
        return self._child is not None

    def start(self, db: Database, epoch: int) -> int | None:
        """Begin a checkpoint of ``db`` after ``epoch``; returns the epoch if already done."""
        assert not self.busy, "a checkpoint is already in flight"
        if not self.fork:
            self._write(self.directory, db, epoch)
            return epoch
        pid = os.fork()
        if pid == 0:  # the child: the copy-on-write image is the state after ``epoch``
            code = 1
            try:
                self._write(self.directory, db, epoch)
                code = 0
            finally:
                os._exit(code)
        self._child = (pid, epoch)
        return None

    def poll(self, *, wait: bool = False) -> int | None:
        """The epoch of a checkpoint that finished since the last call, else None."""
        if self._child is None:
            return None
        pid, epoch = self._child
        done_pid, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
        if done_pid == 0:
            return None
        self._child = None
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            logger.warning("checkpoint of epoch %d failed (child exit %d)", epoch, code)
            return None
        return epoch
