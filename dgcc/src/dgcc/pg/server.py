"""A throwaway PostgreSQL server: find (or apt-get install) the binaries, initdb, start, remove.

``PgServer`` initialises a cluster in a fresh temp directory, runs ``postgres`` as a child
process on 127.0.0.1 at a free port with the default durability settings (fsync on,
synchronous_commit on, default wal_level), and on ``stop`` shuts it down and deletes the
directory. PostgreSQL refuses to run as root, so under root the cluster belongs to an
unprivileged user (``nobody``). Used as a context manager, it is removed on any exception too.
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from dgcc.errors import ConfigError

__all__ = ["PgServer", "PgUnavailable", "check_settings", "find_binaries", "install_binaries"]

logger = logging.getLogger(__name__)

SUPERUSER = "dgcc"
DATABASE = "postgres"
RUN_AS_USER = "nobody"  # the unprivileged owner of the cluster when we run as root
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
INSTALL_TIMEOUT_S = 900.0
_POLL_S = 0.05


class PgUnavailable(RuntimeError):
    """No PostgreSQL binaries here, and installing them was not allowed or failed."""


def find_binaries() -> Path | None:
    """The directory holding ``postgres`` and ``initdb``, or None."""
    candidates = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    # Debian keeps the server binaries off PATH, one directory per major version.
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(p) for p in sorted(versions, key=_major_version, reverse=True)]
    for directory in candidates:
        if (directory / "postgres").is_file() and (directory / "initdb").is_file():
            return directory
    return None


def _major_version(binaries: str) -> tuple[int, ...]:
    """``/usr/lib/postgresql/16/bin`` -> (16,): newest first is a numeric order (16 > 9.6)."""
    name = Path(binaries).parent.name
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def install_binaries() -> Path:
    """``apt-get install postgresql`` (needs root and a reachable package mirror).

    Raises:
        PgUnavailable: not root, no apt-get, or the install did not yield the binaries.
    """
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PgUnavailable("no PostgreSQL binaries, and apt-get as root is not available")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
        logger.info("running %s", " ".join(command))
        completed = subprocess.run(
            command, env=environment, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
        )
        if completed.returncode != 0:
            tail = completed.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise PgUnavailable(f"{' '.join(command)} failed: {tail[0]}")
    found = find_binaries()
    if found is None:
        raise PgUnavailable("apt-get installed postgresql but no initdb/postgres was found")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_settings(settings: dict[str, str]) -> dict[str, str]:
    """Reject settings that would weaken durability below the default.

    Raises:
        ConfigError: fsync, synchronous_commit or full_page_writes set to off.
    """
    for name in ("fsync", "synchronous_commit", "full_page_writes"):
        value = str(settings.get(name, "on")).strip().strip("'\"").lower()
        if _pg_false(value) or value == "local":
            raise ConfigError(f"setting {name}={settings[name]!r} weakens durability; leave it on")
    return settings


def _pg_false(value: str) -> bool:
    """Whether PostgreSQL reads ``value`` (lower case) as boolean false: off, false, no, 0, or
    a unique prefix of one ("of", "f", "n"; "o" is ambiguous, so PostgreSQL refuses it)."""
    if value in ("0", "of", "off"):
        return True
    return bool(value) and ("false".startswith(value) or "no".startswith(value))


class PgServer:
    """A PostgreSQL cluster of our own; ``start()`` then ``conninfo``, ``stop()`` removes it.

    Args:
        binaries: the directory of ``initdb``/``postgres`` (default: found, else installed).
        install: apt-get install PostgreSQL when no binaries are found.
        settings: extra ``-c name=value`` server settings (none by default: durability stays
            at PostgreSQL's defaults).
    """

    def __init__(
        self,
        binaries: Path | None = None,
        *,
        install: bool = True,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.binaries = binaries or find_binaries()
        if self.binaries is None:
            if not install:
                raise PgUnavailable("no PostgreSQL binaries (initdb, postgres) on this machine")
            self.binaries = install_binaries()
        self.settings = check_settings(dict(settings or {}))
        self.port = 0
        self.directory: Path | None = None
        self.process: subprocess.Popen | None = None
        self._user = pwd.getpwnam(RUN_AS_USER) if os.geteuid() == 0 else None

    @property
    def conninfo(self) -> str:
        assert self.port, "the server is not started"
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={DATABASE}"

    @property
    def version(self) -> str:
        completed = subprocess.run(
            [str(self.binaries / "postgres"), "--version"], capture_output=True, text=True
        )
        return completed.stdout.strip()

    def start(self) -> PgServer:
        """initdb a fresh cluster and start the server; waits until it accepts connections.

        Raises:
            PgUnavailable: initdb failed, or the server did not come up in time (the half-made
                cluster is removed).
        """
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        logger.info("%s on port %d in %s", self.version, self.port, self.directory)
        return self

    def _start(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="dgcc_pg_"))
        data = self.directory / "data"
        if self._user is not None:
            os.chown(self.directory, self._user.pw_uid, self._user.pw_gid)
        self._run_as_owner(
            [
                str(self.binaries / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--no-locale",  # byte-order text comparison, as Python sorts C_FIRST
                "--encoding=UTF8",
            ]
        )
        self.port = _free_port()
        command = [
            str(self.binaries / "postgres"),
            "-D",
            str(data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.directory}",
        ]
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        log = open(self.directory / "server.log", "wb")  # noqa: SIM115 - lives with the server
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, **self._owner_kwargs()
        )
        log.close()
        self._wait_ready()

    def _owner_kwargs(self) -> dict:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _run_as_owner(self, command: list[str]) -> None:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=120, **self._owner_kwargs()
        )
        if completed.returncode != 0:
            tail = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise PgUnavailable(f"{Path(command[0]).name} failed: {tail}")

    def _wait_ready(self) -> None:
        import psycopg

        deadline_s = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline_s:
            assert self.process is not None
            if self.process.poll() is not None:
                raise PgUnavailable(f"postgres exited with {self.process.returncode}: {self.log()}")
            try:
                psycopg.connect(self.conninfo, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(_POLL_S)  # polling the server's readiness, bounded by the deadline
        raise PgUnavailable(f"postgres not ready after {START_TIMEOUT_S} s: {self.log()}")

    def cpu_s(self) -> float:
        """CPU seconds used so far by the postmaster and its backends (live and reaped)."""
        if self.process is None:
            return 0.0
        root, total_ticks = self.process.pid, 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # Fields after the ")" that closes the command name: state is field 3.
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # the process exited while we looked
            pid, parent = int(stat.parent.name), int(fields[1])
            if pid == root:
                total_ticks += sum(int(value) for value in fields[11:15])  # + reaped children
            elif parent == root:
                total_ticks += int(fields[11]) + int(fields[12])
        return total_ticks / os.sysconf("SC_CLK_TCK")

    def log(self, lines: int = 5) -> str:
        """The last ``lines`` lines of the server log (for error messages)."""
        if self.directory is None or not (self.directory / "server.log").exists():
            return "(no log)"
        text = (self.directory / "server.log").read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL if it hangs, then delete the cluster directory."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("postgres pid %d ignored SIGINT; killing it", process.pid)
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        self.port = 0

    def __enter__(self) -> PgServer:
        if self.process is None:
            self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
