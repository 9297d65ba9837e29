"""A cluster's config (DistDGCC's, or a baseline protocol's): its nodes, workload, protocol,
epochs, logging and secret.

The config (TOML, or JSON by extension) names the nodes and their addresses, the workload and
its options, the partition map, the epoch length (``epoch_ms`` and/or ``epoch_calls_max``),
the data seed and the shared secret (or the environment variable holding it). A secret is
required as soon as one node listens beyond loopback. ``local_config`` makes a loopback one on
free ports; ``dgcc.local_cluster`` starts, stops and queries the node processes of a config.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import InitVar, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dgcc.errors import ConfigError
from dgcc.protocols.dist_placement import NODES_MAX, Placement

__all__ = [
    "CONFIG_FILE",
    "ClusterConfig",
    "DuplicateKey",
    "NodeAddress",
    "load_config",
    "local_config",
    "unique_keys",
]

CONFIG_FILE = "cluster.json"  # a cluster folder's config (``dgcc.local_cluster``)
# A frame_bytes_max below this is a slip (units, sign): hardly a call fits under it.
FRAME_BYTES_MIN = 1024
# epoch_ms and delay_ms_max above this are slips too: a call would wait past any client's timeout.
MS_MAX = 60_000


@dataclass(frozen=True)
class NodeAddress:
    id: int
    host: str
    port: int

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, int):
            raise ConfigError(f"node id must be an int, got {self.id!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ConfigError(f"node {self.id}: port must be an int, got {self.port!r}")
        # Port 0 would make the node listen on a random port its peers cannot know.
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"node {self.id}: port {self.port} outside 1..65535")
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
    """One cluster; dgcc/README.md shows a config file with these keys.

    Args:
        nodes: the nodes, ids ``0 .. n - 1`` in order.
        workload: workload name (``tpcc``, ``ycsb``, ``smallbank``, or your own Workload
            subclass as ``package.module:Class``, importable by every node process).
        workload_options: its keyword options.
        partition_nodes: partition -> node id; default one partition per node.
        epoch_ms: close an epoch after this long (0: only by count, for tests and drills
            that send exact batches: every node then waits for ``epoch_calls_max`` calls, and
            a node that gets fewer stalls the cluster).
        epoch_calls_max: close an epoch once it holds this many calls (0: only by time).
        pipeline_epochs: closed epochs allowed ahead of execution (collection pipelining).
        seed: the data load seed (every node loads the same data).
        secret: the shared secret; or ``secret_env`` names the variable holding it.
        frame_bytes_max: the largest frame a node accepts from a client (and a client from a
            node). Peer links take any frame a header can announce: an epoch's batch holds
            many calls.
        step_pieces: pieces run between two looks at the network.
        delay_ms_max: test only: delay every peer message by a seeded random 0..max ms.
        delay_seed: seed of those delays.
        order_log: keep the global order of every epoch (for tests checking against serial).
        protocol: the concurrency control the nodes run (``dgcc.net.servers.SERVERS``).
        data_dir: logging on: node n logs to and recovers from ``data_dir/node<n>`` and answers
            a call only once it is durable (DistDGCC and Calvin: its epoch, on every node;
            the 2PC protocols: its commit record, ``dgcc.wal.twopc_log``). Only then can one
            node be restarted alone (``start_node``). A relative path is taken from the
            node process's working directory.
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
    # False where only the nodes' addresses matter (stop, status, call): the workload's
    # module need not import there (a user workload off PYTHONPATH must not block a stop).
    check_workload: InitVar[bool] = True

    def __post_init__(self, check_workload: bool) -> None:
        if not self.nodes or len(self.nodes) > NODES_MAX:
            raise ConfigError(f"a cluster needs 1..{NODES_MAX} nodes, got {len(self.nodes)}")
        ids = [node.id for node in self.nodes]
        if ids != list(range(len(ids))):
            raise ConfigError(f"node ids must be 0..{len(ids) - 1} in order, got {ids}")
        self._check_addresses()
        self.placement()  # validates the partition map
        self._check_values()
        if check_workload:
            self._check_workload_and_protocol()
        if self.epoch_ms == 0 and self.epoch_calls_max == 0:
            raise ConfigError("epoch_ms and epoch_calls_max cannot both be 0 (epochs never close)")
        if not all(node.loopback for node in self.nodes) and not self.shared_secret():
            raise ConfigError(
                "a shared secret (secret or secret_env) is required when a node listens beyond "
                f"loopback: {[n.host for n in self.nodes if not n.loopback]}"
            )

    def _check_values(self) -> None:
        """Numbers, strings and flags: bad ones fail here, not later inside a node process."""
        for name in ("epoch_ms", "delay_ms_max"):
            value = getattr(self, name)
            number = not isinstance(value, bool) and isinstance(value, int | float)
            if not number or not 0 <= value <= MS_MAX:  # NaN fails the comparison too
                raise ConfigError(
                    f"{name} must be a number of milliseconds in [0, {MS_MAX}], got {value!r}"
                )
        ints = ("epoch_calls_max", 0), ("pipeline_epochs", 1), ("step_pieces", 1)
        ints += ("checkpoint_every_epochs", 0), ("frame_bytes_max", FRAME_BYTES_MIN)
        for name, low in (*ints, ("seed", None), ("delay_seed", None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an int, got {value!r}")
            if low is not None and value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        for name in ("secret", "secret_env", "data_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        if not isinstance(self.order_log, bool):
            raise ConfigError(f"order_log must be true or false, got {self.order_log!r}")
        if self.checkpoint_every_epochs and self.data_dir is None:
            raise ConfigError(
                f"checkpoint_every_epochs = {self.checkpoint_every_epochs} needs data_dir "
                "(checkpoints are written there)"
            )

    def _check_addresses(self) -> None:
        """Two nodes on one address would take each other's peers (a node's hello then comes
        from the wrong id), so each needs its own ``host:port``."""
        first: dict[tuple[str, int], int] = {}
        for node in self.nodes:
            address = (node.host.lower(), node.port)
            if address in first:
                raise ConfigError(
                    f"nodes {first[address]} and {node.id} share the address "
                    f"{node.host}:{node.port}: each node needs its own host:port"
                )
            first[address] = node.id

    def _check_workload_and_protocol(self) -> None:
        """The names and options a node would build its workload and server from."""
        # Imported here: both modules import this one.
        from dgcc.net.servers import server_class
        from dgcc.net.servers.cc import PROTOCOLS as TWO_PHASE_PROTOCOLS
        from dgcc.workloads import get_workload

        if not isinstance(self.workload, str):
            raise ConfigError(f"workload must be a name, got {self.workload!r}")
        options = self.workload_options
        if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
            raise ConfigError(f"workload_options must be a table of options, got {options!r}")
        try:
            get_workload(self.workload, **options)
        except TypeError as error:  # an option the workload does not take
            raise ConfigError(
                f"workload_options {dict(options)!r} do not fit {self.workload!r}: {error}"
            ) from None
        if not isinstance(self.protocol, str):
            raise ConfigError(f"protocol must be a name, got {self.protocol!r}")
        server_class(self.protocol)
        if self.protocol in TWO_PHASE_PROTOCOLS and self.checkpoint_every_epochs:
            raise ConfigError(
                f"protocol {self.protocol!r} logs without checkpoints (its prepare and commit "
                f"records are the log); drop checkpoint_every_epochs = "
                f"{self.checkpoint_every_epochs}"
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
    def from_dict(cls, data: Mapping[str, Any], *, check_workload: bool = True) -> ClusterConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(f"cluster config must be a table, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown cluster config keys {unknown}; allowed {sorted(known)}")
        values = dict(data)
        if "nodes" not in data:
            raise ConfigError("cluster config has no nodes (a list of tables: id, host, port)")
        nodes = data["nodes"]
        if not isinstance(nodes, list | tuple) or not all(isinstance(n, Mapping) for n in nodes):
            raise ConfigError(f"nodes must be a list of tables (id, host, port), got {nodes!r}")
        takes_keys = tuple(NodeAddress.__dataclass_fields__)  # id, host, port
        for node in nodes:
            missing = [name for name in takes_keys if name not in node]
            extra = sorted(set(node) - set(takes_keys))
            if missing or extra:
                problem = f"lacks {missing}" if missing else f"has unknown keys {extra}"
                takes = ", ".join(takes_keys)
                raise ConfigError(f"node entry {dict(node)!r} {problem} (it takes {takes})")
        values["nodes"] = tuple(NodeAddress(**node) for node in nodes)
        partition_nodes = values.get("partition_nodes")
        if partition_nodes is not None:
            if not isinstance(partition_nodes, list | tuple):
                raise ConfigError(
                    f"partition_nodes must be a list of node ids, got {partition_nodes!r}"
                )
            values["partition_nodes"] = tuple(partition_nodes)
        return cls(**values, check_workload=check_workload)


def load_config(path: Path, *, check_workload: bool = True, **overrides: Any) -> ClusterConfig:
    """Read a cluster config from TOML (``.toml``) or JSON (``.json``; any other name is read
    as JSON, or else as TOML); ``overrides`` replace keys of the file before the config is
    checked (``dgcc node --data-dir``). ``check_workload=False`` leaves the workload unbuilt
    (its module unimported), for commands that only reach the nodes."""
    try:
        text = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read cluster config {str(path)!r}: {error}") from None
    kinds = {".toml": ("TOML",), ".json": ("JSON",)}.get(path.suffix, ("JSON", "TOML"))
    for kind in kinds:
        try:
            if kind == "TOML":
                data = tomllib.loads(text.decode())  # (TOML refuses a key named twice)
            else:
                data = json.loads(text, object_pairs_hook=unique_keys)
            break
        except DuplicateKey as error:
            raise ConfigError(f"cluster config {str(path)!r} names {error} twice") from None
        except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as error:
            problem = error
    else:
        read_as = " nor ".join(kinds)
        raise ConfigError(
            f"cluster config {str(path)!r} is not valid {read_as}: {problem}"
        ) from None
    if overrides and isinstance(data, dict):
        data = {**data, **overrides}
    return ClusterConfig.from_dict(data, check_workload=check_workload)


class DuplicateKey(Exception):
    """A JSON object naming a key twice (``json`` alone keeps the last, silently)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s object_pairs_hook that raises DuplicateKey (the key's repr) on a repeat."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(repr(key))
        found[key] = value
    return found


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
    """A loopback cluster of ``nodes`` nodes on free ports; ``options`` as in ClusterConfig.

    A relative ``data_dir`` is made absolute here, so the config, once written to a file, names
    the same directory from any working directory (a restart from elsewhere would otherwise
    log into a new directory and start afresh).
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= NODES_MAX:
        raise ConfigError(f"nodes must be an int in 1..{NODES_MAX}, got {nodes!r}")
    if isinstance(options.get("data_dir"), str | Path):
        options["data_dir"] = str(Path(options["data_dir"]).resolve())
    ports = _free_ports(nodes)
    addresses = tuple(NodeAddress(n, "127.0.0.1", port) for n, port in enumerate(ports))
    return ClusterConfig(nodes=addresses, **options)
