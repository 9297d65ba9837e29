"""DistDGCC: one epoch of dependency-graph execution split across nodes (Yao et al. 2018).

This module is the protocol logic only; ``dgcc.net.node`` moves its messages. Per epoch:

  * Global order. Every node contributes its collected calls as one input batch; the global
    order is (epoch, origin node, sequence), so no sequencer or lock manager is needed.
  * Routing. A node plans only the transactions it takes part in. ``route`` maps a request's
    parameters to the nodes owning its data, through the workload's ``route_keys`` (TPC-C by
    warehouse, YCSB by key, Smallbank by customer); a request it cannot route is planned by
    every node, which then agree on the plan or on the planning error (a ``BadParams``, or
    pieces that break the placement rules below, fail the call alone; a plan of a call several
    nodes plan that raises anything else stops the node, since its peers may not agree). An
    origin routes each of its calls once (``Router.routes``): the routes that pick what each
    peer gets are kept for its own planning of the epoch. Planning against rows another node
    owns is only sound for columns no transaction writes (TPC-C's W_NAME, C_LAST ...): a node
    holds its own partitions, the replicated rows and the whole of the workload's
    ``plan_tables`` (the tables plans read on any participant); the rows of those it does not
    own are a frozen load-time snapshot used for exactly those plan-time reads, never written
    and never dumped (``keep_owned``).
    TPC-C's by-last-name customer needs no remote resolution: the plan only checks that the
    name exists (C_LAST never changes), and the piece that picks the customer runs on the
    customer's node under the district key that guards the name index.
  * Splitting. Each piece runs on the node owning its conflict keys (all of a piece's keys
    must lie in one partition); a piece touching only replicated keys (TPC-C's ITEM) must not
    write and runs on every participant, so its output and abort decision cost no message.
  * Local graph. ``build_graph`` of the single-node protocol orders the node's own pieces
    (temporal edges are complete, since a key's pieces all live on its owner). Cross-node
    edges (``after`` values and abort decisions) become extra in-degree that a value message
    removes; an executor never waits on one, it runs whatever else is ready. Only the pieces
    with a path from such an edge (``held``: a few percent of a TPC-C epoch, none of YCSB's
    independent accesses) need the graph; a node runs the others first, in serial order (a
    topological order of theirs), those whose values peers wait for and their ancestors ahead.
  * Results. Each node reports, per origin, the outputs it produced and the abort decisions
    it took; the origin assembles outcomes (``dist_results``) once every node reported the
    epoch, and answers them once every node has also made the epoch durable when the cluster
    logs (``dgcc.wal.node_log``). Execution is deterministic, so there is no two-phase commit.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from dgcc import debug
from dgcc.api import (
    Outcome,
    Piece,
    PieceContext,
    PlannedTxn,
    ProcedureRegistry,
    TxnRequest,
    plan_batch,
    run_piece,
)
from dgcc.errors import ConfigError, ProcedureError
from dgcc.protocols.dgcc import Graph, build_graph
from dgcc.protocols.dist_results import ReportEntry
from dgcc.storage import Database, Table
from dgcc.workloads import Workload

__all__ = [
    "REPLICATED",
    "EpochRun",
    "Placement",
    "Router",
    "global_batch",
    "keep_owned",
    "owned_rows",
]

logger = logging.getLogger(__name__)

REPLICATED = -1  # partition of a key every node holds (same value as the TPC-C workload's)
NODES_MAX = 64

# A value message entry: (global txn index, piece index, output, abort reason, error).
ValueEntry = tuple[int, int, Any, str | None, str | None]


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
        """``node_of_key`` without the cache (for a pass over every key of a table)."""
        owners = self.placement.partition_nodes
        partition = self._partition_of(key, len(owners))
        return REPLICATED if partition == REPLICATED else owners[partition]

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


def global_batch(batches: Sequence[Sequence[TxnRequest]]) -> list[TxnRequest]:
    """The epoch's global order: origin node 0's calls, then node 1's, and so on."""
    return [request for batch in batches for request in batch]


@dataclass(slots=True)
class _SubTxn:
    """This node's share of one transaction of the epoch."""

    index: int  # position in the global batch
    origin: int
    slot: int  # position in the origin's batch
    txn: PlannedTxn
    runs_on: list[tuple[int, ...]] | None  # piece index -> nodes running it; None: only here
    local: Sequence[int]  # piece indices run here (a range when all of them)
    local_abort: tuple[int, str] | None = None


class EpochRun:
    """One node's execution of one epoch; driven by ``step`` and ``deliver``.

    Args:
        node: this node's id.
        db: this node's database (owned rows are current; see the module docstring).
        registry: the procedures.
        router: key and request routing.
        batches: the epoch's input batches, one per origin node, in node order; None stands
            for another origin's call whose route leaves this node out (it keeps its index).
    """

    abort_edges = True  # only the canary test turns cross-node abort edges off
    partial_graph = True  # a graph over the held pieces only (Calvin's locks order them all)

    def __init__(
        self,
        node: int,
        db: Database,
        registry: ProcedureRegistry,
        router: Router,
        batches: Sequence[Sequence[TxnRequest | None]],
    ) -> None:
        nodes = router.placement.nodes
        assert len(batches) == nodes, f"{len(batches)} input batches for {nodes} nodes"
        self.node = node
        self.router = router
        self._db = db
        self.outbox: dict[int, list[ValueEntry]] = {}
        self.multi_node_by_origin = [0] * nodes
        self._subs: list[_SubTxn] = []
        self._errors: list[tuple[int, int, str]] = []  # (origin, slot, error) of planning
        self._plan(db, registry, batches)
        self._build()

    # -- planning and the local graph ------------------------------------------------------

    def _plan(
        self,
        db: Database,
        registry: ProcedureRegistry,
        batches: Sequence[Sequence[TxnRequest | None]],
    ) -> None:
        mine: list[tuple[int, int, int, frozenset[int] | None]] = []
        solo_route = frozenset({self.node})
        requests: list[TxnRequest] = []
        index = 0
        for origin, batch in enumerate(batches):
            for slot, (request, routed) in enumerate(
                zip(batch, self.router.routes(batch, keep=False), strict=True)
            ):
                if request is None:  # another origin's call this node neither plans nor runs
                    index += 1
                    continue
                if routed is not None and len(routed) > 1:
                    self.multi_node_by_origin[origin] += 1
                if routed is None or self.node in routed:
                    mine.append((index, origin, slot, routed))
                    requests.append(request)
                index += 1
        several = self.router.placement.nodes > 1  # else this node alone plans every call

        def shared(i: int) -> bool:  # call i is planned on other nodes too
            routed = mine[i][3]
            return several and (routed is None or len(routed) > 1)

        for (index, origin, slot, routed), planned in zip(
            mine, plan_batch(registry, db, requests, shared), strict=True
        ):
            if isinstance(planned, Outcome):
                self._errors.append((origin, slot, planned.reason))
                continue
            if routed == solo_route and not debug.check_invariants:
                # The common case: the whole transaction is here; no placement, no messages.
                local = range(len(planned.pieces))  # no list per transaction
                self._subs.append(_SubTxn(index, origin, slot, planned, None, local))
                continue
            try:
                runs_on = self._placement_of(planned, routed)
            except ProcedureError as error:  # each node planning the call places it alike
                self._errors.append((origin, slot, str(error)))
                continue
            local = [k for k, nodes in enumerate(runs_on) if self.node in nodes]
            if local:
                self._subs.append(_SubTxn(index, origin, slot, planned, runs_on, local))

    def _placement_of(
        self, planned: PlannedTxn, routed: frozenset[int] | None
    ) -> list[tuple[int, ...]]:
        """Piece index -> the nodes that run it (one owner, or every participant).

        Raises:
            ProcedureError: a piece spans nodes or writes replicated keys, or the pieces lie
                outside the call's route (``_plan`` fails the call alone).
        """
        owners: list[int] = []
        node_of_key, nodes_of = self.router.node_of_key, self.router.nodes_of
        for piece in planned.pieces:
            keys = piece.reads + piece.writes if piece.writes else piece.reads
            if len(keys) == 1:  # most pieces: one key, no set to build
                owner = node_of_key(keys[0])
            else:
                nodes = nodes_of(keys)
                nodes.discard(REPLICATED)
                if len(nodes) > 1:
                    raise ProcedureError(
                        f"{planned.procedure.name}: piece {piece.name!r} spans nodes "
                        f"{sorted(nodes)}"
                    )
                owner = nodes.pop() if nodes else REPLICATED
            if owner == REPLICATED and piece.writes:
                raise ProcedureError(
                    f"{planned.procedure.name}: piece {piece.name!r} writes replicated keys"
                )
            owners.append(owner)
        participants = tuple(sorted({n for n in owners if n != REPLICATED}))
        if not participants:
            participants = (min(routed) if routed else 0,)
        if routed is not None and not set(participants) <= routed:
            raise ProcedureError(
                f"{planned.procedure.name}: pieces on nodes {list(participants)} but the route "
                f"gave {sorted(routed)} (params {dict(planned.params)})"
            )
        return [participants if n == REPLICATED else (n,) for n in owners]

    def _build(self) -> None:
        """This node's pieces in serial order, their cross-node edges, and their schedule.

        Only the pieces that wait for another node, directly or through a local predecessor
        (``_held``), need a graph: D1's builder over them alone, with the cross-node in-degree
        on top. The rest run in serial order first (every edge points forward, and none leads
        from a held piece to them), those whose values peers wait for, with their local
        ancestors, ahead of the others. With ``debug.check_invariants`` the whole local graph
        is also built, and every piece checks it before it runs.
        """
        pieces: list[Piece] = []
        piece_index: list[int] = []  # pid -> index of the piece in its transaction's plan
        spread: list[tuple[_SubTxn, int]] = []  # (sub, its first local pid) of multi-node txns
        for sub in self._subs:
            if sub.runs_on is None:
                pieces.extend(sub.txn.pieces)
            else:
                spread.append((sub, len(pieces)))
                txn_pieces = sub.txn.pieces
                pieces.extend([txn_pieces[k] for k in sub.local])
            piece_index.extend(sub.local)
        self._pieces, self._piece_index = pieces, piece_index
        self._txns = [sub.txn for sub in self._subs]  # per owner slot, for ``step``
        self._contexts = [PieceContext(self._db, txn) for txn in self._txns]
        self._waiters: dict[tuple[int, int], list[int]] = {}
        self._sends: dict[int, tuple[int, ...]] = {}
        self._urgent_pids: set[int] = set()  # local pieces of txns other nodes wait on
        self._sub_of_index = {sub.index: sub for sub, _ in spread}  # values come for these
        cross_in = [0] * len(pieces)  # pid -> its predecessors on other nodes
        for sub, base in spread:
            self._cross_edges(sub, base, cross_in)
        self.remaining = len(pieces)
        self._check: Graph | None = None  # the whole local graph, to check the schedule
        if debug.check_invariants:
            self._check = self.local_graph(self._views(None))
        self._owners: list[int] = []  # pid -> slot of its transaction in ``self._subs``
        crossing = bool(self._waiters or self._sends)
        if crossing and not self.partial_graph:
            self._schedule(list(range(len(pieces))), cross_in)  # takes the graph's owners
            return
        for slot, sub in enumerate(self._subs):
            self._owners.extend([slot] * len(sub.local))
        self._schedule(self._held(cross_in) if crossing else [], cross_in)

    def _schedule(self, held: list[int], cross_in: list[int]) -> None:
        """The serial run (``_order``) and the graph of the ``held`` pieces."""
        count = len(self._pieces)
        self._order: list[int] = []
        self._order_urgent = self._next = 0  # the urgent part's end; the next in ``_order``
        self._urgent: list[int] = []
        self._ready: list[int] = []
        self._graph: Graph | None = None
        if len(held) < count:
            held_set = set(held)
            first: list[int] = []  # senders and their ancestors, unless held: values leave early
            if self._sends:
                first = [pid for pid in self._ancestry() if pid not in held_set]
            skip = held_set.union(first)
            self._order = first + list(itertools.filterfalse(skip.__contains__, range(count)))
            self._order_urgent = len(first)
        if not held:
            return
        graph = self.local_graph(self._views(None if len(held) == count else held))
        if len(held) == count:
            self._owners = graph.owners  # the views are the transactions in slot order
        else:  # graph ids -> pids
            in_degrees = [0] * count
            for position, pid in enumerate(held):
                in_degrees[pid] = graph.in_degrees[position]
            successors = {held[j]: [held[t] for t in ts] for j, ts in graph.successors.items()}
            graph = Graph(self._pieces, self._owners, successors, in_degrees, graph.edges)
        graph.in_degrees = in_degrees = list(map(operator.add, graph.in_degrees, cross_in))
        self._graph = graph
        # Held transactions whose values other nodes wait for run first (oldest first among
        # them: a heap), and so do the held pieces they wait on, so the peers' executors are
        # not left idle at the end of the epoch. The other held pieces only have to run before
        # the epoch ends: a stack (O(1), where a heap costs a log per piece) that starts oldest
        # first and then runs the pieces each piece frees next, depth first.
        urgent = self._urgent_pids
        _add_ancestors(urgent, graph.successors)
        in_held = range(count).__contains__ if len(held) == count else set(held).__contains__
        self._urgent = [pid for pid in sorted(urgent) if not in_degrees[pid] and in_held(pid)]
        self._ready = [pid for pid in reversed(held) if not in_degrees[pid] and pid not in urgent]

    def _held(self, cross_in: list[int]) -> list[int]:
        """Pieces that wait for another node, and every piece with a path from one: a later
        access conflicting with a held one (a read after its write, a write after its read
        or write), and, conservatively, every later piece of a transaction with a held one.

        A transaction's pieces are consecutive, so "a later piece of a transaction with a held
        one" is one of the last held piece's; the scan starts at the first waiting piece, and a
        piece writing one key and reading none (most of them) is checked by two look-ups.
        """
        pieces, owners = self._pieces, self._owners
        count = len(pieces)
        held: list[int] = []
        wrote: set[Hashable] = set()  # keys held pieces write
        read: set[Hashable] = set()  # keys held pieces read
        held_slot = -1  # the transaction of the last held piece
        for pid in range(next(filter(cross_in.__getitem__, range(count)), count), count):
            piece = pieces[pid]
            writes = piece.writes
            if not cross_in[pid] and owners[pid] != held_slot:
                if len(writes) == 1 and not piece.reads:
                    if writes[0] not in wrote and writes[0] not in read:
                        continue
                elif wrote.isdisjoint(piece.reads) and (
                    not writes or (wrote.isdisjoint(writes) and read.isdisjoint(writes))
                ):
                    continue
            held.append(pid)
            held_slot = owners[pid]
            read.update(piece.reads)
            wrote.update(writes)
        return held

    def _ancestry(self) -> list[int]:
        """Pieces of transactions that send values, and every piece with a path to one: an
        earlier access conflicting with one, and every earlier piece of such a transaction
        (a backward scan from the last of them, mirroring ``_held``); in serial order."""
        found: list[int] = []
        before_all: set[Hashable] = set()  # keys every earlier access of which is an ancestor
        before_writes: set[Hashable] = set()  # keys whose earlier writes are ancestors
        seeds, owners, pieces = self._urgent_pids, self._owners, self._pieces
        found_slot = -1  # the transaction of the last piece found (its pieces are consecutive)
        for pid in range(max(seeds, default=-1), -1, -1):
            piece = pieces[pid]
            writes = piece.writes
            if pid not in seeds and owners[pid] != found_slot:
                if len(writes) == 1 and not piece.reads:
                    if writes[0] not in before_all and writes[0] not in before_writes:
                        continue
                elif before_all.isdisjoint(piece.reads) and (
                    not writes
                    or (before_all.isdisjoint(writes) and before_writes.isdisjoint(writes))
                ):
                    continue
            found.append(pid)
            found_slot = owners[pid]
            before_all.update(writes)
            before_writes.update(piece.reads)
        found.reverse()
        return found

    def _views(self, pids: Sequence[int] | None) -> list[PlannedTxn]:
        """The transactions of ``pids`` (ascending; None: every piece here) as a graph sees
        them: only those pieces, with the ``after`` names of the others (run elsewhere or
        already) dropped."""
        pieces = self._pieces
        groups: list[tuple[int, list[Piece] | None]]  # None: the whole transaction
        if pids is None:
            groups = [
                (slot, None if sub.runs_on is None else [sub.txn.pieces[k] for k in sub.local])
                for slot, sub in enumerate(self._subs)
            ]
        else:
            owner_of = self._owners.__getitem__
            groups = [
                (slot, [pieces[pid] for pid in group])
                for slot, group in itertools.groupby(pids, owner_of)
            ]
        views: list[PlannedTxn] = []
        for slot, chosen in groups:
            txn = self._txns[slot]
            if chosen is None or len(chosen) == len(txn.pieces):
                views.append(txn)
                continue
            names = {piece.name for piece in chosen}
            view = [
                piece
                if all(name in names for name in piece.after)
                else Piece(
                    piece.name,
                    piece.run,
                    piece.reads,
                    piece.writes,
                    tuple([name for name in piece.after if name in names]),
                    piece.may_abort,
                )
                for piece in chosen
            ]
            # The graph reads only the pieces: fresh views, not dataclasses.replace (slow).
            views.append(PlannedTxn(txn.index, txn.procedure, txn.params, view))
        return views

    def _cross_edges(self, sub: _SubTxn, base: int, cross_in: list[int]) -> None:
        """Edges between this node's pieces of ``sub`` and pieces that run elsewhere."""
        pieces, runs_on, node = sub.txn.pieces, sub.runs_on, self.node
        local_pid = {k: base + position for position, k in enumerate(sub.local)}
        position = {piece.name: k for k, piece in enumerate(pieces)}
        deciders: list[int] = []
        sends: dict[int, set[int]] = {}
        for k, piece in enumerate(pieces):
            preds = [position[name] for name in piece.after]
            if (piece.writes or piece.may_abort) and self.abort_edges:
                preds.extend(deciders)
            if piece.may_abort:
                deciders.append(k)
            for pred in preds:
                if runs_on[pred][0] == node:  # the lowest node running pred sends its value
                    targets = [n for n in runs_on[k] if n not in runs_on[pred]]
                    sends.setdefault(pred, set()).update(targets)
                if node in runs_on[k] and node not in runs_on[pred]:
                    pid = local_pid[k]
                    self._waiters.setdefault((sub.index, pred), []).append(pid)
                    cross_in[pid] += 1
        for pred, targets in sends.items():
            if targets:
                self._sends[local_pid[pred]] = tuple(sorted(targets))
                self._urgent_pids.update(local_pid.values())

    def local_graph(self, txns: list[PlannedTxn]) -> Graph:
        """The order of this node's pieces: DGCC's piece-level dependency graph."""
        return build_graph(txns)

    # -- execution -------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.remaining == 0

    @property
    def has_ready(self) -> bool:
        """Whether a piece can run now (otherwise this node waits for value messages)."""
        return self._next < len(self._order) or bool(self._urgent or self._ready)

    def step(self, budget: int) -> int:
        """Run up to ``budget`` ready pieces (urgent ones first); returns how many ran.

        The serial run comes first, then the held pieces by in-degree; but a held piece peers
        wait on runs as soon as a value frees it, once the urgent part of the serial run is
        done (that part holds every unheld ancestor of such a piece, see ``_ancestry``), so a
        peer's value turns into the value it waits for while this node still has local work.
        Returns early once values are due to peers and no urgent piece is left, so they leave
        before the local-only pieces run. Zero with pieces remaining means this node waits
        for value messages.
        """
        ran = 0
        if self._urgent and self._next >= self._order_urgent:
            ran = self._step_graph(budget, urgent_only=True)
        if ran < budget and self._next < len(self._order) and not (ran and self.outbox):
            ran += self._step_order(budget - ran)
        if ran < budget and self._next == len(self._order) and not (ran and self.outbox):
            ran += self._step_graph(budget - ran)
        self.remaining -= ran
        assert self.remaining >= 0, f"{self.remaining} pieces remaining"
        return ran

    def _step_order(self, budget: int) -> int:
        """The next pieces of the serial run; stops where its urgent part ends with values
        to send."""
        pieces, owners, txns, contexts = self._pieces, self._owners, self._txns, self._contexts
        start, check = self._next, self._check
        end = min(len(self._order), start + budget)
        if start < self._order_urgent < end and self._sends:
            end = self._order_urgent  # then the values leave before the local-only pieces
        # Every sender is in the urgent part (``_ancestry`` starts from them), and a slice
        # never spans its end: past it, no piece needs the look-up.
        sends_of = self._sends.get if start < self._order_urgent else None
        for pid in self._order[start:end]:
            if check is not None:
                _check_turn(check, pid)
                assert sends_of is not None or pid not in self._sends, f"sender {pid} not urgent"
            slot = owners[pid]
            txn = txns[slot]
            if txn.abort_reason is None:
                run_piece(contexts[slot], txn, pieces[pid])
                if txn.abort_reason is not None:
                    assert pieces[pid].may_abort, f"{pieces[pid].name} aborted without may_abort"
                    self._subs[slot].local_abort = (self._piece_index[pid], txn.abort_reason)
            if sends_of is not None and (targets := sends_of(pid)) is not None:
                self._post(self._subs[slot], self._piece_index[pid], targets)
        self._next = end
        return end - start

    def _step_graph(self, budget: int, urgent_only: bool = False) -> int:
        """Held pieces by in-degree, urgent ones first (only those with ``urgent_only``)."""
        graph = self._graph
        if graph is None:
            return 0
        pieces, ready, urgent = self._pieces, self._ready, self._urgent
        owners, in_degrees, contexts = self._owners, graph.in_degrees, self._contexts
        txns, successors_of, sends = self._txns, graph.successors.get, self._urgent_pids
        sends_of, outbox, check = self._sends.get, self.outbox, self._check
        pop, push, ready_pop = heapq.heappop, heapq.heappush, ready.pop
        ran = 0
        while ran < budget:
            if urgent:
                pid = pop(urgent)
            elif ready and not urgent_only:
                pid = ready_pop()
            else:
                break
            if check is not None:
                _check_turn(check, pid)
            slot = owners[pid]
            txn = txns[slot]
            if txn.abort_reason is None:
                run_piece(contexts[slot], txn, pieces[pid])
                if txn.abort_reason is not None:
                    assert pieces[pid].may_abort, f"{pieces[pid].name} aborted without may_abort"
                    self._subs[slot].local_abort = (self._piece_index[pid], txn.abort_reason)
            ran += 1
            targets = sends_of(pid)
            if targets is not None:
                self._post(self._subs[slot], self._piece_index[pid], targets)
            successors = successors_of(pid)
            if successors is not None:
                for target in successors:
                    in_degrees[target] -= 1
                    if not in_degrees[target]:
                        if target in sends:
                            push(urgent, target)
                        else:
                            ready.append(target)
            if outbox and not urgent:
                break  # peers wait on these values: send them before the local-only pieces
        return ran

    def _post(self, sub: _SubTxn, piece_index: int, targets: tuple[int, ...]) -> None:
        txn = sub.txn
        output = txn.outputs.get(txn.pieces[piece_index].name)
        entry = (sub.index, piece_index, output, txn.abort_reason, txn.error)
        for target in targets:
            self.outbox.setdefault(target, []).append(entry)

    def take_outbox(self) -> dict[int, list[ValueEntry]]:
        """The value messages produced so far, per destination node (batched)."""
        outbox, self.outbox = self.outbox, {}
        return outbox

    def deliver(self, entries: Sequence[Sequence[Any]]) -> None:
        """Apply value entries from another node: outputs, abort decisions, errors."""
        # An epoch without a graph waits for no value: the first entry finds no waiters.
        in_degrees = [] if self._graph is None else self._graph.in_degrees
        ready, urgent, sends = self._ready, self._urgent, self._urgent_pids
        for index, piece_index, output, reason, error in entries:
            sub = self._sub_of_index.get(index)
            waiters = self._waiters.pop((index, piece_index), None)
            if sub is None or waiters is None:
                raise ProcedureError(f"unexpected value for txn {index} piece {piece_index}")
            txn = sub.txn
            if error is not None and txn.error is None:
                txn.error = error
            elif reason is not None and txn.abort_reason is None:
                txn.abort_reason = reason
            elif reason is None and error is None:
                txn.outputs[txn.pieces[piece_index].name] = output
            for pid in waiters:
                in_degrees[pid] -= 1
                if not in_degrees[pid]:
                    if pid in sends:
                        heapq.heappush(urgent, pid)
                    else:
                        ready.append(pid)

    def reports(self) -> dict[int, list[ReportEntry]]:
        """Per origin node: this node's outputs, abort decisions and errors of its txns."""
        assert self.finished, f"{self.remaining} pieces still to run"
        if self._check is not None:
            assert not any(self._check.in_degrees), "pieces left with unmet dependencies"
            assert self._graph is None or not any(self._graph.in_degrees), "held pieces left"
            assert not self._waiters, f"values never received: {sorted(self._waiters)[:5]}"
        reports: dict[int, list[ReportEntry]] = {}
        for origin, slot, error in self._errors:
            reports.setdefault(origin, []).append((slot, {}, None, error))
        for sub in self._subs:
            txn = sub.txn
            outputs: dict[str, Any] = {}
            if sub.runs_on is None:
                outputs = txn.outputs
            elif sub.local_abort is None and txn.error is None:
                for k in sub.local:
                    name = txn.pieces[k].name
                    if sub.runs_on[k][0] == self.node and name in txn.outputs:
                        outputs[name] = txn.outputs[name]
            entry = (sub.slot, outputs, sub.local_abort, txn.error)
            reports.setdefault(sub.origin, []).append(entry)
        return reports


def _check_turn(graph: Graph, pid: int) -> None:
    """Piece ``pid`` is about to run: every local predecessor ran (``debug`` checks only)."""
    assert not graph.in_degrees[pid], f"piece {pid} would run before a local predecessor"
    for target in graph.successors.get(pid, ()):
        graph.in_degrees[target] -= 1


def _add_ancestors(pids: set[int], successors: dict[int, list[int]]) -> None:
    """Add to ``pids`` every piece with a path to one of them (edges only point forward)."""
    if not pids:
        return
    get = successors.get
    for pid in range(max(pids) - 1, -1, -1):
        if pid not in pids:
            targets = get(pid)
            if targets is not None and not pids.isdisjoint(targets):
                pids.add(pid)
