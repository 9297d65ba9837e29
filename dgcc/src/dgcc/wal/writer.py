"""Group commit: each epoch's block goes to the log with one write and one fsync.

``start`` hands the block to a background thread that writes and fsyncs it while the caller
runs the next epoch (both system calls release the GIL); ``wait`` joins it, and only then may
the epoch's clients be answered. At most one block is in flight, so blocks reach the file in
epoch order.

The log is a directory of segments ``wal-<first epoch>.log``. A new segment starts at every
checkpoint, so truncation removes whole files once a checkpoint covers them. Creating, renaming
or removing a file is followed by an fsync of the directory, so the name itself is durable.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from dgcc.wal.crashpoints import crashpoint
from dgcc.wal.format import WalCorrupt

__all__ = ["WalWriter", "fsync_dir", "list_segments", "segment_name", "write_all"]

logger = logging.getLogger(__name__)

_SEGMENT = re.compile(r"^wal-(\d{12})\.log$")


def segment_name(first_epoch: int) -> str:
    return f"wal-{first_epoch:012d}.log"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(first epoch, path) of every log segment in ``directory``, oldest first.

    Raises:
        WalCorrupt: something named as a segment is not a file (a folder, a dangling link).
    """
    found = []
    for path in directory.iterdir():
        match = _SEGMENT.match(path.name)
        if match:
            if not path.is_file():
                raise WalCorrupt(f"log segment {str(path)!r} is not a file")
            found.append((int(match.group(1)), path))
    return sorted(found)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> int:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer, e.g. on a full
    disk, whose next write then raises); returns how many.

    Raises:
        OSError: a write failed, or wrote nothing (``ENOSPC``).
    """
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.write(fd, view[done:])
        if written <= 0:
            raise OSError(errno.ENOSPC, f"wrote {done} of {len(view)} bytes, then nothing")
        done += written
    return done


class WalWriter:
    """Appends epoch blocks to the current segment, one in flight at a time.

    Args:
        directory: the node's durability directory (must exist).
        next_epoch: the epoch the next ``append`` must carry.
        sync: fsync after every write (turn off only to measure the cost of fsync itself).
    """

    def __init__(self, directory: Path, next_epoch: int, *, sync: bool = True) -> None:
        self.directory = directory
        self.next_epoch = next_epoch
        self.sync = sync
        self.bytes_written = 0
        self.fsyncs = 0
        self._fd: int | None = None
        self._flight: threading.Thread | None = None
        self._error: OSError | None = None
        # A failed write may leave part of its block in the file: nothing may follow it there
        # (recovery would find intact blocks after a damaged one), so it fails every later call.
        self._failed: OSError | None = None
        segments = list_segments(directory)
        if segments:
            self._open(segments[-1][1], create=False)
        else:
            self.roll(next_epoch)

    @property
    def durable_epoch(self) -> int:
        """The newest epoch whose block is on disk (or skipped), once ``wait`` has returned."""
        return self.next_epoch - 1 - (self._flight is not None)

    def append(self, epoch: int, block: bytes) -> None:
        """Write and fsync one epoch's block (the group commit of the whole epoch)."""
        self.start(epoch, block)
        self.wait()

    def start(
        self,
        epoch: int,
        block: bytes,
        on_durable: Callable[[int], None] | None = None,
        on_failed: Callable[[OSError], None] | None = None,
    ) -> None:
        """Begin writing ``epoch``'s block in the background; ``wait`` before acknowledging.

        Args:
            on_durable: called with ``epoch`` on the writer's thread once the block is on
                disk (e.g. ``loop.call_soon_threadsafe`` to wake an event loop).
            on_failed: called with the error on the writer's thread if the write or fsync
                fails (the next ``start`` or ``wait`` raises it too), so a caller waiting
                for ``on_durable`` learns it at once.

        Raises:
            OSError: an earlier write failed (the log may end in part of its block).
        """
        assert epoch == self.next_epoch, f"appending epoch {epoch}, expected {self.next_epoch}"
        assert self._fd is not None, "writer is closed"
        self.wait()
        args = (epoch, block, on_durable, on_failed)
        self._flight = threading.Thread(target=self._write, args=args, daemon=True)
        self.next_epoch = epoch + 1
        self._flight.start()

    def wait(self) -> None:
        """Block until the in-flight block (if any) is durable.

        Raises:
            OSError: this block's write or fsync failed, or an earlier one did.
        """
        if self._flight is not None:
            self._flight.join()
            self._flight = None
        if self._error is not None:
            self._failed = self._failed or self._error
            error, self._error = self._error, None
            raise error
        if self._failed is not None:
            raise OSError(
                self._failed.errno, f"the log failed an earlier write: {self._failed}"
            ) from self._failed

    def _write(
        self,
        epoch: int,
        block: bytes,
        on_durable: Callable[[int], None] | None,
        on_failed: Callable[[OSError], None] | None,
    ) -> None:
        fd = self._fd
        assert fd is not None
        try:
            half = len(block) // 2
            written = write_all(fd, block[:half])
            crashpoint("wal.mid_write")
            written += write_all(fd, block[half:])
            crashpoint("wal.before_fsync")
            if self.sync:
                os.fsync(fd)
                self.fsyncs += 1
            crashpoint("wal.after_fsync")
            self.bytes_written += written
        except OSError as error:  # re-raised by ``wait`` in the caller's thread
            self._error = error
            if on_failed is not None:
                on_failed(error)
            return
        if on_durable is not None:
            on_durable(epoch)

    def skip(self, epoch: int) -> None:
        """Advance past an epoch that writes no block (logging mode ``none``)."""
        assert epoch == self.next_epoch, f"skipping epoch {epoch}, expected {self.next_epoch}"
        self.wait()
        self.next_epoch = epoch + 1

    def roll(self, first_epoch: int) -> Path:
        """Start a new segment whose first block will be ``first_epoch``."""
        assert first_epoch == self.next_epoch, f"roll at {first_epoch}, next is {self.next_epoch}"
        self.wait()
        path = self.directory / segment_name(first_epoch)
        self._open(path, create=True)
        fsync_dir(self.directory)
        return path

    def truncate_before(self, first_kept_epoch: int) -> int:
        """Remove the segments holding only epochs below ``first_kept_epoch``; returns how many."""
        segments = list_segments(self.directory)
        removed = 0
        for (_, path), (next_first, _) in itertools.pairwise(segments):
            if next_first <= first_kept_epoch:
                path.unlink()
                removed += 1
        if removed:
            fsync_dir(self.directory)
            logger.debug("removed %d log segments below epoch %d", removed, first_kept_epoch)
        return removed

    def close(self) -> None:
        """Wait for the block in flight, then close the file (closed after a failed write
        too, whose error ``wait`` raises)."""
        try:
            self.wait()
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _open(self, path: Path, *, create: bool) -> None:
        self.close()
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
        self._fd = os.open(path, flags, 0o644)
        if not create:  # what a killed process left unsynced is synced before anything follows
            os.fsync(self._fd)  # it (format.py: a block begun after another means it was synced)
