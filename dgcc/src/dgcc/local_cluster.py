"""A cluster's node processes on this host: starting, stopping and querying them.

``start_local`` writes a loopback config (``dgcc.cluster``) into a folder, spawns one ``dgcc
node`` process per node and returns once every node says it is ready (each prints one
``READY`` line on stdout when all its peers are connected); ``start_node`` starts one node of
such a cluster again, if it logs (it rejoins the running others, or joins a restart);
``stop`` and ``status`` talk to the nodes through the client library, falling back to the
recorded process ids; ``check`` reads every node's rows while no call runs and checks the
workload's invariants over their union. The recorded pids are trusted only for processes whose
command line is the one ``_spawn`` used, so a stale state file never leads to signalling another
program.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgcc.cluster import CONFIG_FILE, ClusterConfig, load_config
from dgcc.errors import ConfigError, brief
from dgcc.net.wire import FRAME_BODY_MAX

__all__ = [
    "LocalCluster",
    "StopResult",
    "check",
    "last_log_line",
    "log_size",
    "logged_warnings",
    "read_pids",
    "running_pids",
    "start_local",
    "start_node",
    "status",
    "stop",
    "wait_ready_lines",
]

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
FAIL_GRACE_S = 2.0  # how long the other nodes may take to fail too, once one failed to start
STATE_FILE = "cluster_state.json"  # the pids of a cluster folder's running nodes
LOG_TAIL_BYTES = 4096  # how much of a node's log is read for its last error line
PID_MAX = 2**22  # Linux pid_max can be no larger; a recorded pid beyond it is damage


@dataclass
class LocalCluster:
    """Node processes started on this host, and where their config and logs live."""

    config: ClusterConfig
    directory: Path
    processes: list[subprocess.Popen]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask every node to stop; terminate the ones that do not exit in time."""
        stop(self.config, timeout_s=timeout_s)
        for process in self.processes:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("node pid %d did not stop; terminating it", process.pid)
                process.kill()
                process.wait(timeout=timeout_s)

    def restart(self, node: int, *, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start node ``node`` again after it died; the other processes are left alone.

        Raises:
            ConfigError: ``node`` is not a node of the cluster, its process still runs, or
                it cannot restart (see ``start_node``).
        """
        if not 0 <= node < len(self.processes):
            raise ConfigError(
                f"node {node} is not a node of the cluster (0..{len(self.processes) - 1})"
            )
        if self.processes[node].poll() is None:
            raise ConfigError(f"node {node} (pid {self.processes[node].pid}) is still running")
        self.processes[node] = start_node(self.directory, node, ready_timeout_s=ready_timeout_s)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_local(
    config: ClusterConfig, directory: Path, *, ready_timeout_s: float = READY_TIMEOUT_S
) -> LocalCluster:
    """Spawn one node process per node of ``config`` and wait until all are ready.

    Writes ``cluster.json`` and ``cluster_state.json`` (pids) into ``directory``, and each
    node's log to ``node<id>.log`` there.

    Raises:
        ConfigError: the nodes' data would not fit in memory together, ``directory`` is
            unusable or a cluster still runs there (starting over it would orphan those
            nodes), or a node exits or is not ready within ``ready_timeout_s``.
    """
    from dgcc.workloads import get_workload

    # Before anything is written or spawned: each node loads the whole initial database.
    workload = get_workload(config.workload, **dict(config.workload_options))
    workload.check_fits_memory(copies=len(config.nodes))
    config_path = directory / CONFIG_FILE
    try:
        if directory.exists() and not directory.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory")
        directory.mkdir(parents=True, exist_ok=True)
        refuse_running(directory)
        earlier = _Earlier.of(config, directory)
        config_path.write_text(json.dumps(config.to_dict(), indent=1))
    except OSError as error:
        raise ConfigError(
            f"cannot use {str(directory)!r} as a cluster directory: {error.strerror or error}"
        ) from None
    log_starts = [log_size(directory, node.id) for node in config.nodes]
    processes: list[subprocess.Popen] = []
    try:
        for node in config.nodes:
            _spawn(directory, node.id, processes)
        _write_pids(directory, [p.pid for p in processes])
        _wait_ready_or_kill(directory, processes, log_starts, ready_timeout_s)
    except BaseException:  # (``_wait_ready_or_kill`` killed them; a failed spawn did not)
        for process in processes:
            process.kill()
            process.wait()
        earlier.restore()
        raise
    return LocalCluster(config, directory, processes)


@dataclass
class _Earlier:
    """What a cluster directory held before ``start_local`` wrote into it: a start that fails
    puts it back (the config and pids of a stopped cluster the user may start again) and
    removes the node data dirs it created, so a refused start changes nothing but the logs."""

    directory: Path
    files: dict[str, bytes | None]  # name -> content, None where there was no such file
    new_node_dirs: list[Path]

    @classmethod
    def of(cls, config: ClusterConfig, directory: Path) -> _Earlier:
        files = {}
        for name in (CONFIG_FILE, STATE_FILE):
            path = directory / name
            files[name] = path.read_bytes() if path.is_file() else None
        new_node_dirs = []
        if config.data_dir is not None:
            node_dirs = (Path(config.data_dir) / f"node{node.id}" for node in config.nodes)
            new_node_dirs = [path for path in node_dirs if not path.exists()]
        return cls(directory, files, new_node_dirs)

    def restore(self) -> None:
        for name, content in self.files.items():
            path = self.directory / name
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(content)
        for path in self.new_node_dirs:
            shutil.rmtree(path, ignore_errors=True)


def refuse_running(directory: Path) -> None:
    """Raise ConfigError if a cluster still runs in ``directory`` (starting another over it
    would orphan its nodes)."""
    running = running_pids(directory)
    if running:
        raise ConfigError(
            f"a cluster is already running in {str(directory)!r} (pids {running}); stop it first"
        )


def start_node(
    directory: Path, node: int, *, ready_timeout_s: float = READY_TIMEOUT_S
) -> subprocess.Popen:
    """Start node ``node`` of the local cluster whose config is in ``directory``, alone.

    The node recovers from its own log and rejoins its running peers, or joins the others'
    restart; so the cluster must log (``data_dir`` set). Its pid replaces the old one in
    ``cluster_state.json``.

    Raises:
        ConfigError: what ``check_node_restart`` refuses, or the node exits or is not ready
            within ``ready_timeout_s``.
    """
    pids = check_node_restart(directory, node)
    log_starts = [log_size(directory, node)]
    started: list[subprocess.Popen] = []
    try:
        _spawn(directory, node, started)
        _wait_ready_or_kill(directory, started, log_starts, ready_timeout_s, first_node=node)
        pids[node] = started[0].pid
        _write_pids(directory, pids)
    except BaseException:  # (a Ctrl-C held back while it spawned too): no unrecorded child
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
        raise
    return started[0]


def check_node_restart(directory: Path, node: int) -> list[int]:
    """The recorded pids of the cluster in ``directory``, if ``start_node`` may restart its
    node ``node`` alone.

    Raises:
        ConfigError: no cluster in ``directory``, ``node`` not one of its nodes or still
            running, or a cluster without ``data_dir`` or of a 2PC protocol.
    """
    config_path = directory / CONFIG_FILE
    if not config_path.exists():
        raise ConfigError(f"no cluster in {str(directory)!r} (missing {CONFIG_FILE})")
    config = load_config(config_path)
    nodes = len(config.nodes)
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < nodes:
        raise ConfigError(
            f"node {node!r} is not a node of the cluster in {directory} (0..{nodes - 1})"
        )
    pids = (read_pids(directory) + [0] * nodes)[:nodes]
    if _is_cluster_node(pids[node], directory, node):
        raise ConfigError(f"node {node} (pid {pids[node]}) is still running in {directory}")
    if config.data_dir is None:  # it would start empty and wait for peers that never answer
        raise ConfigError(
            f"node {node} cannot restart alone: the cluster in {str(directory)!r} runs without "
            "logging (no data_dir), so the node has no log to recover and rejoin from; stop "
            "the cluster and start it with a data dir (dgcc cluster start --data-dir DIR)"
        )
    from dgcc.net.servers.cc import PROTOCOLS as TWO_PHASE_PROTOCOLS  # it imports this module

    if config.protocol in TWO_PHASE_PROTOCOLS:  # its peers would never take it back
        raise ConfigError(
            f"node {node} cannot restart alone: {config.protocol} nodes do not rejoin "
            "running peers; restart the whole cluster (dgcc cluster stop, then dgcc cluster "
            "start: every node recovers from its log)"
        )
    return pids


def _node_args(directory: Path, node: int) -> list[str]:
    """The arguments after the interpreter that run node ``node`` of ``directory``'s cluster.

    The config path is absolute, so ``_is_cluster_node`` recognises the process from any
    working directory.
    """
    config_path = directory.resolve() / CONFIG_FILE
    return ["-m", "dgcc", "node", "--config", str(config_path), "--id", str(node)]


_STOPS = {signal.SIGINT, signal.SIGTERM}


def spawn_into(processes: list[subprocess.Popen], command: list[str], **options: Any) -> None:
    """``subprocess.Popen(command, **options)``, appended to ``processes`` before Ctrl-C or
    SIGTERM may interrupt: a stop arriving while the child starts would otherwise raise inside
    Popen, after the child exists but before the caller holds it, leaving it to run on after
    the caller stopped the rest. The child starts with those signals as usual."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        processes.append(subprocess.Popen(command, preexec_fn=_unblock_stops, **options))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # (a stop held back is raised here)


def _unblock_stops() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def _spawn(directory: Path, node: int, processes: list[subprocess.Popen]) -> None:
    """Start one ``dgcc node`` process of the cluster config in ``directory`` (into
    ``processes``), logging to a file."""
    try:
        log = open(directory / f"node{node}.log", "ab")  # noqa: SIM115 - the child owns it
    except OSError as error:
        raise _unusable(directory, error) from None
    optimize = ["-O"] * sys.flags.optimize  # a bench run with -O runs its nodes so too
    try:
        spawn_into(
            processes,
            [sys.executable, *optimize, *_node_args(directory, node)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log.close()


def _is_cluster_node(pid: object, directory: Path, node: int) -> bool:
    """Whether ``pid`` is a live process running node ``node`` of ``directory``'s cluster.

    A state file may be stale and its pid reused by another program, so only a command line
    ending in ``_spawn``'s arguments counts (a zombie has none). Without /proc nothing counts,
    so nothing is ever signalled on a guess.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return False
    expected = _node_args(directory, node)
    return [os.fsdecode(arg) for arg in argv[-len(expected) :]] == expected


def read_pids(directory: Path) -> list[int]:
    """The node pids recorded in ``directory`` by node id (0: none); empty without a record.

    Raises:
        ConfigError: the state file is unreadable or not a list of pids.
    """
    path = directory / STATE_FILE
    try:
        state = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
        raise ConfigError(
            f"cluster state {str(path)!r} is unreadable ({error}); remove it if no cluster "
            "runs there"
        ) from None
    pids = state.get("pids") if isinstance(state, dict) else None
    if not isinstance(pids, list) or not all(
        type(pid) is int and 0 <= pid <= PID_MAX for pid in pids
    ):
        raise ConfigError(
            f"cluster state {str(path)!r} holds no list of pids (got {brief(state)}); "
            "remove it if no cluster runs there"
        )
    return pids


def running_pids(directory: Path) -> list[int]:
    """The recorded pids that are still this cluster's node processes."""
    pids = read_pids(directory)
    return [pid for node, pid in enumerate(pids) if _is_cluster_node(pid, directory, node)]


def _write_pids(directory: Path, pids: list[int]) -> None:
    state = {"pids": pids, "config": str(directory / CONFIG_FILE)}
    try:
        (directory / STATE_FILE).write_text(json.dumps(state))
    except OSError as error:
        raise _unusable(directory, error) from None


def _unusable(directory: Path, error: OSError) -> ConfigError:
    return ConfigError(f"cannot use {str(directory)!r} as a cluster directory: {error}")


def log_size(directory: Path, node: int) -> int:
    """How long node ``node``'s log in ``directory`` is now (where its next start begins)."""
    try:
        return (directory / f"node{node}.log").stat().st_size
    except OSError:  # none yet (or no such folder: the start says what is wrong with it)
        return 0


def logged_warnings(directory: Path, node: int, start: int) -> list[str]:
    """The WARNING and ERROR lines node ``node`` logged after byte ``start`` of its log, without
    their time stamps: what a start had to say (a torn log tail cut off, epochs that not every
    node had made durable dropped, a peer refused)."""
    try:
        with (directory / f"node{node}.log").open("rb") as log:
            log.seek(start)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        for level in (" WARNING ", " ERROR "):
            if level in line[:40]:  # "2026-12-02 13:50:45,123 WARNING module: message"
                found.append(line.split(level, 1)[1].strip())
    return found


def last_log_line(directory: Path, node: int, start: int) -> str:
    """The last line node ``node`` wrote to its log after byte ``start``: its own error."""
    try:
        with (directory / f"node{node}.log").open("rb") as log:
            end = log.seek(0, os.SEEK_END)
            log.seek(max(start, end - LOG_TAIL_BYTES))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError as error:
        return f"its log is unreadable ({error.strerror})"
    lines = [line.strip() for line in lines if line.strip()]
    return lines[-1].removeprefix("dgcc: error: ")[:300] if lines else "nothing in its log"


def _wait_ready_or_kill(
    directory: Path,
    processes: list[subprocess.Popen],
    log_starts: list[int],
    timeout_s: float,
    *,
    first_node: int = 0,
) -> None:
    """Wait for every node's READY line; on any failure kill them all and say which failed.

    ``processes[i]`` runs node ``first_node + i``; its log grew from ``log_starts[i]`` bytes.
    """
    try:
        wait_ready_lines(processes, timeout_s)
    except BaseException as error:
        if isinstance(error, ConfigError) and any(p.poll() is not None for p in processes):
            _let_failing_peers_exit(processes)
        exited = [i for i, process in enumerate(processes) if process.poll() is not None]
        for process in processes:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if not isinstance(error, ConfigError) or not exited:
            raise
        # Every node that exited, each with its own reason: the first to exit may only have
        # seen the cause (a peer's port taken by another program) from the outside.
        failures = []
        for i in exited:
            node, code = first_node + i, processes[i].returncode
            line = last_log_line(directory, node, log_starts[i])
            log = directory / f"node{node}.log"
            failures.append(f"node {node} failed to start (exit {code}): {line} (see {log})")
        raise ConfigError("; ".join(failures)) from None


def _let_failing_peers_exit(processes: Sequence[subprocess.Popen]) -> None:
    """Give the other nodes ``FAIL_GRACE_S`` to exit on their own once one failed to start:
    nodes start in step, so a cause (a port taken) often fails two at once, and the one that
    exited first may only have seen it from the outside (a stranger answering on the port)."""
    deadline_s = time.monotonic() + FAIL_GRACE_S
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline_s - time.monotonic()))


def wait_ready_lines(processes: Sequence[subprocess.Popen], timeout_s: float) -> None:
    """Read each child's READY line from its stdout (then close it), with one deadline.

    Raises:
        ConfigError: a child exits or says something else, or the deadline passes.
    """
    deadline_s = time.monotonic() + timeout_s
    waiting = {p.stdout.fileno(): p for p in processes if p.stdout is not None}
    while waiting:
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            pids = [p.pid for p in waiting.values()]
            raise ConfigError(f"nodes with pids {pids} not ready within {timeout_s} s")
        readable, _, _ = select.select(list(waiting), [], [], left_s)
        for fd in readable:
            process = waiting.pop(fd)
            line = process.stdout.readline()  # type: ignore[union-attr]
            line = (line.decode() if isinstance(line, bytes) else line).strip()
            if not line.startswith("READY"):
                with contextlib.suppress(subprocess.TimeoutExpired):  # at EOF it is exiting
                    process.wait(timeout=0 if line else 10)
                code = process.poll()
                raise ConfigError(f"node pid {process.pid} failed to start (exit {code}): {line!r}")
            logger.debug("%s", line)
            process.stdout.close()  # type: ignore[union-attr]


def status(config: ClusterConfig, *, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """Each node's status, or ``{"id": n, "error": ...}`` when it cannot be reached."""
    from dgcc.net.client import Client
    from dgcc.net.wire import NetError

    results = []
    for node in config.nodes:
        try:
            with Client(
                node.host, node.port, secret=config.shared_secret(), timeout_s=timeout_s
            ) as c:
                results.append(c.status())
        except (OSError, NetError) as error:  # unreachable nodes are part of the answer
            results.append({"id": node.id, "error": f"{type(error).__name__}: {error}"})
    return results


CHECK_TRIES = 3
# The largest dump answer ``check`` accepts: all a frame header can announce (4 GiB). A node's
# rows outgrow any limit sized for client calls (a default TPC-C node dumps 130 MB,
# over the 64 MiB default), and the node has no way to send them in pieces. A larger limit for
# this one answer is sound: it answers the check's own request, from a node that passed the
# handshake (and proved the secret, if any); the client's memory grows with the bytes that
# arrive, not with the length a header announces; and the check holds every node's rows at
# once anyway, so a smaller cap would only refuse a check that fits in memory.
DUMP_BYTES_MAX = FRAME_BODY_MAX
_QUIET_KEYS = ("waiting_calls", "peers_down", "txn/committed", "txn/aborted", "txn/error",
               "epochs_closed", "epochs_executed")  # fmt: skip


def check(config: ClusterConfig, *, timeout_s: float = 30.0) -> list[str]:
    """The workload's state invariants (``Workload.check_state``) over the union of every
    node's rows, read while no call runs: [] when the cluster's state is consistent.

    The nodes' dumps are consistent only if no transaction ran or was half done meanwhile, so
    the check reads every node's counters before and after the dumps and tries again
    (``CHECK_TRIES`` times in all) unless nothing moved, no call or transaction was in flight
    (``waiting_calls``), every node had executed every epoch it closed, the same epochs
    everywhere, and no peer link was down.

    Each node's rows come in one answer, which may be much larger than the config's
    ``frame_bytes_max`` (sized for client calls): the check accepts a dump of up to
    ``DUMP_BYTES_MAX`` bytes, the most a frame header can announce (why that is sound: at
    ``DUMP_BYTES_MAX``). Fetching the rows in pieces would need a new request the nodes do not
    serve; every other frame keeps the config's limit.

    Raises:
        ConfigError: a node cannot be reached, or the cluster stayed busy.
        FrameError: a node's rows do not fit one answer (more than ``DUMP_BYTES_MAX``).
    """
    from dgcc.net.client import Client
    from dgcc.workloads import get_workload

    def counters() -> list[dict[str, Any]]:
        entries = status(config, timeout_s=timeout_s)
        down = [entry["id"] for entry in entries if "error" in entry]
        if down:
            raise ConfigError(f"cannot check the cluster: nodes {down} do not answer")
        return [{key: entry.get(key) for key in _QUIET_KEYS} for entry in entries]

    def quiet(nodes: list[dict[str, Any]]) -> bool:
        executed = {node["epochs_executed"] for node in nodes}
        return len(executed) == 1 and all(
            not node["waiting_calls"]
            and not node["peers_down"]
            and node["epochs_closed"] == node["epochs_executed"]
            for node in nodes
        )

    workload = get_workload(config.workload, **dict(config.workload_options))
    secret = config.shared_secret()
    for _ in range(CHECK_TRIES):
        before = counters()
        dumps = []
        for node in config.nodes:
            with Client(
                node.host,
                node.port,
                secret=secret,
                timeout_s=timeout_s,
                frame_bytes_max=config.frame_bytes_max,
            ) as client:
                dumps.append(client.dump(frame_bytes_max=DUMP_BYTES_MAX))
        if before == counters() and quiet(before):
            break
    else:
        raise ConfigError(
            f"the cluster stayed busy over {CHECK_TRIES} tries (calls ran while its nodes' rows "
            "were read): check it when no client is calling"
        )
    db = workload.schema()
    for name, table in db.tables.items():
        rows: dict[Any, Any] = {}
        for dump in dumps:
            rows.update(dump.get(name, {}))
        table.load(rows)
    return workload.check_state(db)


@dataclass(frozen=True)
class StopResult:
    """What ``stop`` did, by node id; ``not_ours`` are pids, which it left alone."""

    by_request: tuple[int, ...] = ()
    by_signal: tuple[int, ...] = ()
    still_running: tuple[int, ...] = ()
    not_ours: tuple[int, ...] = ()

    @property
    def stopped(self) -> int:
        return len(self.by_request) + len(self.by_signal)


def stop(
    config: ClusterConfig, *, timeout_s: float = 5.0, directory: Path | None = None
) -> StopResult:
    """Ask every node to stop; SIGTERM the recorded processes of nodes that cannot be reached.

    With ``directory``, a node that answers is asked to stop only if its process is the one
    the state file records for it (another cluster may listen on a port this one used), and an
    unreachable node's recorded pid is signalled only if the process is that node of that
    cluster; ``stop`` waits up to ``timeout_s`` for it to exit.
    """
    from dgcc.net.client import Client
    from dgcc.net.wire import NetError

    recorded = read_pids(directory) if directory is not None else None
    by_request, unreachable, not_ours = [], [], []
    for node in config.nodes:
        try:
            with Client(
                node.host, node.port, secret=config.shared_secret(), timeout_s=timeout_s
            ) as c:
                if recorded is not None:
                    pid = c.status().get("pid")
                    if node.id >= len(recorded) or pid != recorded[node.id]:
                        not_ours.append(pid)  # not this folder's node: left alone
                        continue
                c.stop_node()
                by_request.append(node.id)
        except (OSError, NetError) as error:
            logger.debug("node %d not reachable for stop: %s", node.id, error)
            unreachable.append(node.id)
    if directory is None or not unreachable:
        return StopResult(by_request=tuple(by_request), not_ours=tuple(not_ours))
    result = terminate_recorded(directory, unreachable, timeout_s, tuple(by_request))
    return dataclasses.replace(result, not_ours=(*not_ours, *result.not_ours))


def terminate_recorded(
    directory: Path,
    nodes: list[int] | None = None,
    timeout_s: float = 5.0,
    by_request: tuple[int, ...] = (),
) -> StopResult:
    """SIGTERM the recorded processes of ``nodes`` (None: every recorded node) that still run
    ``directory``'s cluster, and wait for them: how ``stop`` ends the nodes it cannot reach,
    and how ``dgcc cluster stop`` ends a cluster whose config no longer reads."""
    pids = read_pids(directory)
    by_signal, still_running, not_ours = [], [], []
    for node_id in range(len(pids)) if nodes is None else nodes:
        pid = pids[node_id] if node_id < len(pids) else 0
        outcome = _terminate(pid, directory, node_id, timeout_s)
        if outcome == "by_signal":
            by_signal.append(node_id)
        elif outcome == "still_running":
            still_running.append(node_id)
        elif outcome == "not_ours":
            not_ours.append(pid)
    return StopResult(by_request, tuple(by_signal), tuple(still_running), tuple(not_ours))


def _terminate(pid: int, directory: Path, node: int, timeout_s: float) -> str | None:
    """SIGTERM ``pid`` if it runs node ``node`` of ``directory``'s cluster, and wait for it.

    A pidfd pins the process while its command line is checked, so a pid reused meanwhile is
    never signalled, and waiting on it needs no polling. Returns ``"by_signal"`` (it exited),
    ``"still_running"``, ``"not_ours"``, or None when no such process exists.
    """
    if pid <= 0:  # 0 and negative pids would signal process groups
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        if select.select([pidfd], [], [], 0)[0]:
            return None  # it has exited: a zombie left for its parent to reap
        if not _is_cluster_node(pid, directory, node):
            return "not_ours"
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        exited, _, _ = select.select([pidfd], [], [], timeout_s)
        return "by_signal" if exited else "still_running"
    finally:
        os.close(pidfd)
