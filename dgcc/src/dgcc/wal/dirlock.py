"""One process at a time in a node's log directory: an advisory lock on its ``LOCK`` file.

A node holds the lock of its directory from its construction to ``stop``, and ``dgcc recover``
holds it while it reads and repairs one, so recovery can never cut the tail of a log a running
node is still writing, and two nodes can never share a directory. The lock is ``flock``'s: the
kernel drops it when its holder exits, however it ends (SIGKILL included), so a crashed node
leaves nothing stale behind. A child forked by a holder (a checkpoint writer, a replay worker)
closes its inherited copy at once and dies with its parent (``PR_SET_PDEATHSIG``), so it never
keeps a dead node's directory locked nor writes into it after a successor took it. The file
holds the holder's pid and purpose, for the message that names it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
from collections.abc import Callable
from pathlib import Path

from dgcc.errors import ConfigError

__all__ = ["LOCK_FILE", "DirLock"]

LOCK_FILE = "LOCK"
_HELD: set[int] = set()  # descriptors of the locks this process holds
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_forking_from = 0  # the pid of the process about to fork


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # resolved once, before any fork
    except (OSError, AttributeError):  # not Linux: a holder's child may outlive it
        return None


_PRCTL = _prctl()


def _before_fork() -> None:
    global _forking_from
    _forking_from = os.getpid()


def _after_fork_in_child() -> None:
    """In a holder's child (its ``_HELD`` is the parent's at the fork): drop the lock's copy,
    and die with the parent, more exactly with the thread that forked (``PR_SET_PDEATHSIG``
    follows the forking thread: fork from the thread that lives as long as the holder)."""
    if not _HELD:
        return
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()
    if _PRCTL is None or _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL) == -1:
        return  # no death signal here: the child may outlive its parent (as without a lock)
    if os.getppid() != _forking_from:
        os._exit(1)  # the parent died before the death signal was set


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


class DirLock:
    """The lock of ``directory`` (created if missing), held until ``release``.

    Args:
        purpose: who holds it, as the refusal of another process names it ("node 1").

    Raises:
        ConfigError: another process holds it (naming that process as it recorded itself).
    """

    def __init__(self, directory: Path, purpose: str) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:  # read-only, not ours, a file in the way
            raise ConfigError(f"{directory}: cannot lock it ({error.strerror or error})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"{directory} is in use by {holder}: one process at a time may use a log "
                "directory (stop it first)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({purpose})\n".encode(), 0)
        self.directory = directory
        self._fd: int | None = fd
        _HELD.add(fd)

    def release(self) -> None:
        """Give the directory up (idempotent); the file stays, unlocked."""
        if self._fd is not None:
            _HELD.discard(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
