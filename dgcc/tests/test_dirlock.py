"""A log directory is one process's at a time: refused while held, free once its holder
releases it or dies (SIGKILL included), never kept by a forked child."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dgcc.errors import ConfigError
from dgcc.wal.dirlock import LOCK_FILE, DirLock


def test_a_held_directory_is_refused_naming_its_holder(tmp_path: Path) -> None:
    lock = DirLock(tmp_path / "node0", "node 0")
    with pytest.raises(ConfigError, match=rf"in use by pid {os.getpid()} \(node 0\)"):
        DirLock(tmp_path / "node0", "dgcc recover")
    lock.release()
    lock.release()  # idempotent
    with DirLock(tmp_path / "node0", "dgcc recover"):
        assert "(dgcc recover)" in (tmp_path / "node0" / LOCK_FILE).read_text()


def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    lock = DirLock(tmp_path, "node 0")
    hold_read, hold_write = os.pipe()
    forked_read, forked_write = os.pipe()
    child = os.fork()
    if child == 0:  # a checkpoint writer, say: it outlives the lock's release below
        os.close(hold_write)
        os.write(forked_write, b"f")  # the fork hooks ran before fork() returned here
        os.read(hold_read, 1)
        os._exit(0)
    os.close(hold_read)
    try:
        assert os.read(forked_read, 1) == b"f"
        lock.release()
        DirLock(tmp_path, "node 0 restarted").release()  # the child's copy was closed at fork
    finally:
        os.close(hold_write)
        os.waitpid(child, 0)
        os.close(forked_read)
        os.close(forked_write)


def test_a_killed_holder_frees_the_directory(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from dgcc.wal.dirlock import DirLock; "
        f"lock = DirLock(Path({str(tmp_path)!r}), 'node 1'); print('held', flush=True); "
        "sys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(ConfigError, match=rf"pid {holder.pid} \(node 1\)"):
                DirLock(tmp_path, "node 1 restarted")
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
    DirLock(tmp_path, "node 1 restarted").release()


def test_a_holders_forked_child_dies_with_it(tmp_path: Path) -> None:
    """A checkpoint writer must not go on writing a directory whose node was killed."""
    code = (
        "import os, sys; from pathlib import Path; from dgcc.wal.dirlock import DirLock; "
        f"lock = DirLock(Path({str(tmp_path)!r}), 'node 0'); child = os.fork()\n"
        "if child == 0:\n    sys.stdin.read(); os._exit(0)\n"
        "print(child, flush=True); sys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None
        child = int(holder.stdout.readline())
        pidfd = os.pidfd_open(child)
        try:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            assert select.select([pidfd], [], [], 30.0)[0], f"child {child} outlived its parent"
        finally:
            os.close(pidfd)
