"""Node servers, one per concurrency-control protocol, behind ``Node``'s interface.

``SERVERS`` maps ``ClusterConfig.protocol`` to the node class: DistDGCC (``dgcc``), Calvin
(``calvin``: the same epochs with a deterministic lock manager) and the two-phase-commit
baselines (``no_wait``, ``wait_die``, ``occ``). ``run_server`` runs one node of any of them.
"""

from __future__ import annotations

from collections.abc import Callable

from dgcc.cluster import ClusterConfig
from dgcc.errors import ConfigError
from dgcc.net.node import Node, run_node
from dgcc.net.servers.calvin import CalvinNode
from dgcc.net.servers.cc import PROTOCOLS
from dgcc.net.servers.twopc import TwoPhaseCommitNode

__all__ = ["SERVERS", "run_server", "server_class"]

SERVERS: dict[str, type[Node]] = {
    "dgcc": Node,
    "calvin": CalvinNode,
    **dict.fromkeys(PROTOCOLS, TwoPhaseCommitNode),
}


def server_class(protocol: str) -> type[Node]:
    """The node class of ``protocol``.

    Raises:
        ConfigError: an unknown protocol; the message lists the known ones.
    """
    server = SERVERS.get(protocol)
    if server is None:
        raise ConfigError(f"unknown protocol {protocol!r}; use one of {sorted(SERVERS)}")
    return server


async def run_server(config: ClusterConfig, node_id: int, on_ready: Callable[[Node], None]) -> None:
    """Run node ``node_id`` of ``config.protocol`` until a stop request (see ``run_node``)."""
    await run_node(config, node_id, on_ready, server_class(config.protocol))
