"""A DistDGCC cluster: its config file, and starting, stopping and querying local nodes.

The config (TOML, or JSON by extension) names the nodes and their addresses, the workload and
its options, the partition map, the epoch length (``epoch_ms`` and/or ``epoch_calls_max``),
the data seed and the shared secret (or the environment variable holding it). A secret is
required as soon as one node listens beyond loopback. ``start_local`` writes a loopback config,
spawns one ``dgcc node`` process per node and returns once every node says it is ready (each
prints one ``READY`` line on stdout when all its peers are connected); ``start_node`` starts
one node of such a cluster again (it rejoins the running others, or joins a restart); ``stop``
and ``status`` talk to the nodes through the client library, falling back to the recorded
process ids.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dgcc.errors import ConfigError
from dgcc.protocols.dist_dgcc import NODES_MAX, Placement

__all__ = [
    "ClusterConfig",
    "LocalCluster",
    "NodeAddress",
    "load_config",
    "local_config",
    "start_local",
    "start_node",
    "status",
    "stop",
    "wait_ready_lines",
]

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
STATE_FILE = "cluster_state.json"
CONFIG_FILE = "cluster.json"


@dataclass(frozen=True)
class NodeAddress:
    id: int
    host: str
    port: int

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ConfigError(f"node {self.id}: port must be an int, got {self.port!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"node {self.id}: port {self.port} outside 0..65535")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"node {self.id}: host must be a non-empty string, got {self.host!r}")

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster.

    Args:
        nodes: the nodes, ids ``0 .. n - 1`` in order.
        workload: workload name (``tpcc``, ``ycsb``, ``smallbank``).
        workload_options: its keyword options.
        partition_nodes: partition -> node id; default one partition per node.
        epoch_ms: close an epoch after this long (0: only by count).
        epoch_calls_max: close an epoch once it holds this many calls (0: only by time).
        pipeline_epochs: closed epochs allowed ahead of execution (collection pipelining).
        seed: the data load seed (every node loads the same data).
        secret: the shared secret; or ``secret_env`` names the variable holding it.
        frame_bytes_max: the largest frame accepted.
        step_pieces: pieces run between two looks at the network.
        delay_ms_max: test only: delay every peer message by a seeded random 0..max ms.
        delay_seed: seed of those delays.
        order_log: keep the global order of every epoch (for tests checking against serial).
        protocol: the concurrency control the nodes run (``dgcc.net.servers.SERVERS``).
        data_dir: logging on: node n logs to and recovers from ``data_dir/node<n>`` and answers
            a call only once it is durable (DistDGCC and Calvin: its epoch, on every node;
            the 2PC protocols: its commit record, ``dgcc.wal.twopc_log``).
        checkpoint_every_epochs: with ``data_dir``, a forked checkpoint every this many
            epochs (0 = only the initial one).
    """

    nodes: tuple[NodeAddress, ...]
    workload: str = "ycsb"
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    partition_nodes: tuple[int, ...] | None = None
    epoch_ms: float = 5.0
    epoch_calls_max: int = 2000
    pipeline_epochs: int = 4
    seed: int = 1
    secret: str | None = None
    secret_env: str | None = None
    frame_bytes_max: int = 64 * 1024 * 1024
    step_pieces: int = 500
    delay_ms_max: float = 0.0
    delay_seed: int = 0
    order_log: bool = False
    protocol: str = "dgcc"
    data_dir: str | None = None
    checkpoint_every_epochs: int = 0

    def __post_init__(self) -> None:
        if not self.nodes or len(self.nodes) > NODES_MAX:
            raise ConfigError(f"a cluster needs 1..{NODES_MAX} nodes, got {len(self.nodes)}")
        ids = [node.id for node in self.nodes]
        if ids != list(range(len(ids))):
            raise ConfigError(f"node ids must be 0..{len(ids) - 1} in order, got {ids}")
        self.placement()  # validates the partition map
        for name in ("epoch_ms", "delay_ms_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
        ints = ("epoch_calls_max", 0), ("pipeline_epochs", 1), ("step_pieces", 1)
        for name, low in (*ints, ("checkpoint_every_epochs", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if self.data_dir is not None and (not isinstance(self.data_dir, str) or not self.data_dir):
            raise ConfigError(f"data_dir must be a non-empty path string, got {self.data_dir!r}")
        if self.epoch_ms == 0 and self.epoch_calls_max == 0:
            raise ConfigError("epoch_ms and epoch_calls_max cannot both be 0 (epochs never close)")
        if not all(node.loopback for node in self.nodes) and not self.shared_secret():
            raise ConfigError(
                "a shared secret (secret or secret_env) is required when a node listens beyond "
                f"loopback: {[n.host for n in self.nodes if not n.loopback]}"
            )

    def placement(self) -> Placement:
        if self.partition_nodes is None:
            return Placement.round_robin(len(self.nodes))
        return Placement(len(self.nodes), tuple(self.partition_nodes))

    def shared_secret(self) -> str | None:
        if self.secret:
            return self.secret
        if self.secret_env:
            value = os.environ.get(self.secret_env)
            if not value:
                raise ConfigError(f"secret_env {self.secret_env!r} is not set in the environment")
            return value
        return None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["nodes"] = [asdict(node) for node in self.nodes]
        data["workload_options"] = dict(self.workload_options)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(f"cluster config must be a table, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown cluster config keys {unknown}; allowed {sorted(known)}")
        values = dict(data)
        try:
            values["nodes"] = tuple(NodeAddress(**node) for node in data.get("nodes", ()))
        except TypeError as error:
            raise ConfigError(f"bad node entry in {data.get('nodes')!r}: {error}") from None
        if values.get("partition_nodes") is not None:
            values["partition_nodes"] = tuple(values["partition_nodes"])
        return cls(**values)


def load_config(path: Path) -> ClusterConfig:
    """Read a cluster config from TOML (``.toml``) or JSON (anything else)."""
    try:
        text = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read cluster config {str(path)!r}: {error}") from None
    try:
        data = tomllib.loads(text.decode()) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"cluster config {str(path)!r} is not valid: {error}") from None
    return ClusterConfig.from_dict(data)


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_config(nodes: int, **options: Any) -> ClusterConfig:
    """A loopback cluster of ``nodes`` nodes on free ports; ``options`` as in ClusterConfig."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= NODES_MAX:
        raise ConfigError(f"nodes must be an int in 1..{NODES_MAX}, got {nodes!r}")
    ports = _free_ports(nodes)
    addresses = tuple(NodeAddress(n, "127.0.0.1", port) for n, port in enumerate(ports))
    return ClusterConfig(nodes=addresses, **options)


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
            ConfigError: ``node`` is not a node of the cluster, or its process still runs.
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
        ConfigError: a node exits or is not ready within ``ready_timeout_s``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / CONFIG_FILE
    config_path.write_text(json.dumps(config.to_dict(), indent=1))
    processes = [_spawn(directory, node.id) for node in config.nodes]
    _write_pids(directory, [p.pid for p in processes])
    cluster = LocalCluster(config, directory, processes)
    _wait_ready_or_kill(processes, ready_timeout_s)
    return cluster


def start_node(
    directory: Path, node: int, *, ready_timeout_s: float = READY_TIMEOUT_S
) -> subprocess.Popen:
    """Start node ``node`` of the local cluster whose config is in ``directory``, alone.

    The node recovers from its own log and rejoins its running peers (dependency logging on),
    or joins the others' restart. Its pid replaces the old one in ``cluster_state.json``.

    Raises:
        ConfigError: no cluster in ``directory``, ``node`` not one of its nodes, or the node
            exits or is not ready within ``ready_timeout_s``.
    """
    config_path = directory / CONFIG_FILE
    if not config_path.exists():
        raise ConfigError(f"no cluster in {str(directory)!r} (missing {CONFIG_FILE})")
    nodes = len(load_config(config_path).nodes)
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < nodes:
        raise ConfigError(
            f"node {node!r} is not a node of the cluster in {directory} (0..{nodes - 1})"
        )
    process = _spawn(directory, node)
    _wait_ready_or_kill([process], ready_timeout_s)
    state_path = directory / STATE_FILE
    pids = json.loads(state_path.read_text())["pids"] if state_path.exists() else [0] * nodes
    pids[node] = process.pid
    _write_pids(directory, pids)
    return process


def _spawn(directory: Path, node: int) -> subprocess.Popen:
    """One ``dgcc node`` process of the cluster config in ``directory``, logging to a file."""
    log = open(directory / f"node{node}.log", "ab")  # noqa: SIM115 - the child owns it
    optimize = ["-O"] * sys.flags.optimize  # a bench run with -O runs its nodes so too
    command = [sys.executable, *optimize, "-m", "dgcc", "node"]
    command += ["--config", str(directory / CONFIG_FILE), "--id", str(node)]
    try:
        return subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log.close()


def _write_pids(directory: Path, pids: list[int]) -> None:
    state = {"pids": pids, "config": str(directory / CONFIG_FILE)}
    (directory / STATE_FILE).write_text(json.dumps(state))


def _wait_ready_or_kill(processes: list[subprocess.Popen], timeout_s: float) -> None:
    try:
        wait_ready_lines(processes, timeout_s)
    except BaseException:
        for process in processes:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
        raise


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
            logger.info("%s", line)
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


def stop(config: ClusterConfig, *, timeout_s: float = 5.0, pids: Sequence[int] = ()) -> int:
    """Ask every node to stop; SIGTERM the given pids of nodes that could not be reached.

    Returns how many nodes acknowledged the stop request.
    """
    from dgcc.net.client import Client
    from dgcc.net.wire import NetError

    stopped = 0
    unreachable = []
    for node in config.nodes:
        try:
            with Client(
                node.host, node.port, secret=config.shared_secret(), timeout_s=timeout_s
            ) as c:
                c.stop_node()
                stopped += 1
        except (OSError, NetError) as error:
            logger.info("node %d not reachable for stop: %s", node.id, error)
            unreachable.append(node.id)
    for node_id in unreachable:
        if node_id < len(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[node_id], signal.SIGTERM)
    return stopped
