"""Where DistDGCC's data lives: the partition map, routing of keys and calls to nodes, and
each node's share of the rows.

``Placement`` maps partitions to nodes; ``Router`` maps conflict keys (through the workload's
``partition_of``) and calls (its ``route_keys`` or ``route_partitions``) to the nodes that own
them; ``keep_owned`` cuts a node's database down to what it holds, ``owned_rows`` copies it
out; ``global_batch`` is an epoch's global order. Used by the DistDGCC and Calvin epoch runs
(``dist_dgcc``), the cluster config and the 2PC nodes.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from dgcc.api import TxnRequest
from dgcc.errors import ConfigError
from dgcc.storage import Database, Table
from dgcc.workloads import REPLICATED, Workload

__all__ = [
    "NODES_MAX",
    "REPLICATED",
    "Placement",
    "Router",
    "global_batch",
    "keep_owned",
    "owned_rows",
    "solo_route_checked",
]

logger = logging.getLogger(__name__)

NODES_MAX = 64
SOLO_CHECK_EVERY = 32  # ``solo_route_checked``: one call in this many of each origin's batch


@dataclass(frozen=True)
class Placement:
    """Which node owns which partition.

    Args:
        nodes: number of nodes (ids ``0 .. nodes - 1``).
        partition_nodes: partition -> owning node; its length is the partition count.

    Raises:
        ConfigError: a partition on a node that does not exist, or a node owning nothing.
    """

    nodes: int
    partition_nodes: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int):
            raise ConfigError(f"nodes must be an int, got {self.nodes!r}")
        if not 1 <= self.nodes <= NODES_MAX:
            raise ConfigError(f"nodes must be in 1..{NODES_MAX}, got {self.nodes}")
        bad = [n for n in self.partition_nodes if not isinstance(n, int) or not 0 <= n < self.nodes]
        if bad or not self.partition_nodes:
            raise ConfigError(
                f"partition map {list(self.partition_nodes)} must name nodes in 0..{self.nodes - 1}"
            )
        idle = sorted(set(range(self.nodes)) - set(self.partition_nodes))
        if idle:
            raise ConfigError(f"nodes {idle} own no partition in {list(self.partition_nodes)}")

    @classmethod
    def round_robin(cls, nodes: int, partitions: int | None = None) -> Placement:
        """Partition p on node p % nodes; one partition per node by default."""
        count = nodes if partitions is None else partitions
        return cls(nodes, tuple(p % nodes for p in range(count)))

    @property
    def partitions(self) -> int:
        return len(self.partition_nodes)


class Router:
    """Maps conflict keys and requests to nodes, for one workload and placement.

    Args:
        workload: its ``partition_of(key, partitions)`` places keys and its
            ``route_keys(procedure, params)`` names the partitions a call touches (or its
            ``route_partitions(procedure, params, partitions)`` does, where it answers).
        placement: the partition -> node map.
    """

    def __init__(self, workload: Workload, placement: Placement) -> None:
        self.placement = placement
        self._partition_of = workload.partition_of
        self._workload_name = type(workload).__name__
        self._route_keys = workload.route_keys
        # Only where a workload defines it (a duck-typed one may define only the two above).
        defined = getattr(type(workload), "route_partitions", Workload.route_partitions)
        self._route_partitions = (
            None if defined is Workload.route_partitions else workload.route_partitions
        )
        self._nodes_of_key: dict[Hashable, int] = {}
        # Routes of origin batches routed before planning (a node routes its own batch to
        # pick what each peer gets, then plans it): id(batch) -> (batch, routes), kept until
        # planned, so each call is routed once.
        self._batch_routes: dict[int, tuple[Sequence[Any], list[frozenset[int] | None]]] = {}
        self._route_failures: set[str] = set()  # procedures whose routing raised (logged once)

    def node_of_key(self, key: Hashable) -> int:
        """The node owning ``key``, or ``REPLICATED``."""
        node = self._nodes_of_key.get(key)
        if node is None:
            node = self._nodes_of_key[key] = self.owner(key)
        return node

    def owner(self, key: Hashable) -> int:
        """``node_of_key`` without the cache (for a pass over every key of a table).

        Raises:
            ConfigError: the workload's ``partition_of`` gave something other than a partition
                (an int in ``0..partitions - 1``) or ``REPLICATED``.
        """
        owners = self.placement.partition_nodes
        partition = self._partition_of(key, len(owners))
        if partition == REPLICATED:
            return REPLICATED
        if not isinstance(partition, numbers.Integral) or not 0 <= partition < len(owners):
            raise ConfigError(
                f"{self._workload_name}.partition_of({key!r}, {len(owners)}) returned "
                f"{partition!r}: a partition is an int in 0..{len(owners) - 1}, or "
                f"{REPLICATED} for a row every node holds (never written)"
            )
        return owners[partition]

    def nodes_of(self, keys: Sequence[Hashable]) -> set[int]:
        """The nodes owning ``keys`` (``REPLICATED`` among them for replicated keys)."""
        known = self._nodes_of_key.get
        nodes = {known(key) for key in keys}  # every call routes and places here: cache hits
        if None in nodes:  # a key seen for the first time
            nodes = {self.node_of_key(key) for key in keys}
        return nodes

    def route(self, request: object) -> frozenset[int] | None:
        """The nodes that own a request's data, or None when every node must plan it."""
        if not isinstance(request, TxnRequest):
            return None
        try:
            if self._route_partitions is not None:
                owners = self.placement.partition_nodes
                partitions = self._route_partitions(request.procedure, request.params, len(owners))
                if partitions is not None:
                    if partitions and min(partitions) < 0:  # owners[-1] is the last node
                        raise ValueError(f"route_partitions gave {sorted(partitions)}")
                    return frozenset([owners[partition] for partition in partitions]) or None
            keys = self._route_keys(request.procedure, request.params)
            if keys is None:
                return None
            nodes = self.nodes_of(keys)
        except (KeyError, TypeError, IndexError, ValueError, ConfigError):
            return None  # a bad request: every node plans it and reports the same error
        except Exception as error:  # a routing bug, not bad params: the calls still run
            if request.procedure not in self._route_failures:
                self._route_failures.add(request.procedure)
                logger.warning(
                    "%s: the workload's routing raised %s: %s; every node plans these calls",
                    request.procedure, type(error).__name__, error,
                )  # fmt: skip
            return None
        nodes.discard(REPLICATED)
        return frozenset(nodes) or None

    def routes(self, batch: Sequence[Any], keep: bool) -> list[frozenset[int] | None]:
        """``route`` of each call of ``batch``, computed once per batch object.

        ``keep``: remember the routes for a later call with the same batch (which takes them
        back with ``keep=False``); the batch must not change in between.
        """
        kept = self._batch_routes.pop(id(batch), None)
        if kept is not None and kept[0] is batch:
            routes = kept[1]
            assert len(routes) == len(batch), f"batch changed: {len(batch)} != {len(routes)}"
        else:
            route = self.route
            routes = [None if request is None else route(request) for request in batch]
        if keep:
            self._batch_routes[id(batch)] = (batch, routes)
        return routes


def _held_by(router: Router, node: int, table: Table) -> Callable[[Any], bool]:
    """Whether ``node`` holds a row of ``table`` by primary key: it owns the row's conflict key,
    or the key is replicated."""
    owner, key_of = router.owner, table.conflict_key
    return lambda pk: owner(key_of(pk)) in (node, REPLICATED)


def owned_rows(db: Database, router: Router, node: int) -> dict[str, dict]:
    """Copies of the rows of ``db`` that ``node`` owns: its conflict keys plus replicated ones."""
    dump: dict[str, dict] = {}
    for name, table in db.tables.items():
        held = _held_by(router, node, table)
        dump[name] = {pk: dict(row) for pk, row in table.rows.items() if held(pk)}
    return dump


def keep_owned(db: Database, router: Router, node: int, whole: Sequence[str] = ()) -> Database:
    """``db`` cut down, in place, to what ``node`` holds in memory and checkpoints: the rows it
    owns, the replicated ones, and every row of the tables in ``whole`` (those plan functions
    read on any node: the workload's ``plan_tables``)."""
    for name, table in db.tables.items():
        if name not in whole:
            table.retain(_held_by(router, node, table))
    return db


def solo_route_checked(slot: int) -> bool:
    """Whether the call at ``slot`` of its origin's epoch batch, routed to one node, is checked
    to keep its pieces there (a ``route_keys`` that leaves out a partition would otherwise
    half-apply it): one in ``SOLO_CHECK_EVERY``, as checking costs about as much as planning
    the call. Chosen by the call's place in the logged input, so a replay checks the same
    calls and reaches the same outcomes."""
    return not slot % SOLO_CHECK_EVERY


def global_batch(batches: Sequence[Sequence[TxnRequest]]) -> list[TxnRequest]:
    """The epoch's global order: origin node 0's calls, then node 1's, and so on."""
    return [request for batch in batches for request in batch]
