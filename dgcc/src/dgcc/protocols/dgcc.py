"""DGCC: dependency-graph concurrency control on one node (Yao et al., arXiv 1503.03642).

Each batch (an epoch) is planned, turned into a dependency graph over its pieces, and executed by
in-degree with no locks and no concurrency-control aborts. Edges (all point forward in the serial
order, so the graph is acyclic by construction):

  * temporal, per conflict key in batch order: a write depends on the previous write and on every
    read since it; a read depends on the previous write; two reads never conflict;
  * logical: a piece depends on the pieces of its transaction named in ``after``;
  * abort: every ``may_abort`` piece precedes every later writing piece and every later
    ``may_abort`` piece of its transaction, so an abort never exposes a write and the first
    abort reason in piece order is the one reported, as in the serial order.

Any topological order then equals the serial order in final state and outcomes. Pieces of an
aborted transaction are skipped but still release their successors. A procedure that *raises*
(a bug, an ERROR outcome) is outside this guarantee: which of its pieces ran before the failure
may differ from the serial run.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from dgcc import debug
from dgcc.api import (
    Outcome,
    Piece,
    PieceContext,
    PlannedTxn,
    ProcedureRegistry,
    Protocol,
    TxnRequest,
    plan_batch,
    run_piece,
)
from dgcc.errors import ConfigError
from dgcc.storage import Database

__all__ = ["DgccProtocol", "Graph", "build_graph"]

logger = logging.getLogger(__name__)

EXECUTORS_MAX = 1024


@dataclass(slots=True)
class Graph:
    """A batch's dependency graph in flat lists indexed by piece id (serial order).

    ``successors`` holds only pieces that have successors (most have none), and may repeat a
    successor once per edge; ``in_degrees`` counts the same edges.
    """

    pieces: list[Piece]
    owners: list[int]  # piece id -> index of its transaction in ``txns``
    successors: dict[int, list[int]]
    in_degrees: list[int]
    edges: int


def build_graph(txns: Sequence[PlannedTxn], *, read_write_edges: bool = True) -> Graph:
    """Build the dependency graph of planned transactions, in their serial (list) order.

    Args:
        txns: the planned transactions of a batch, in batch order.
        read_write_edges: keep the read -> later-write edges. Only the canary test turns this
            off, to show the serial-equivalence property catches a broken graph.
    """
    # One pass, flat lists, no per-piece objects: this is DGCC's whole overhead over serial.
    pieces: list[Piece] = []
    owners: list[int] = []
    successors: dict[int, list[int]] = {}
    in_degrees = [0] * sum(len(txn.pieces) for txn in txns)
    last_writer: dict[Hashable, int] = {}
    readers: dict[Hashable, list[int]] = {}
    writer_of, readers_of, drop_readers = last_writer.get, readers.get, readers.pop
    successors_of = successors.get
    for slot, txn in enumerate(txns):
        txn_pieces = txn.pieces
        base = len(pieces)
        pieces.extend(txn_pieces)
        owners.extend([slot] * len(txn_pieces))
        names: dict[str, int] | None = None
        deciders: list[int] = []  # this transaction's may_abort pieces so far
        for piece_id, piece in enumerate(txn_pieces, base):
            for key in piece.reads:
                writer = writer_of(key)
                if writer is not None:  # read after write
                    targets = successors_of(writer)
                    if targets is None:
                        successors[writer] = [piece_id]
                    else:
                        targets.append(piece_id)
                    in_degrees[piece_id] += 1
                since = readers_of(key)
                if since is None:
                    readers[key] = [piece_id]
                else:
                    since.append(piece_id)
            for key in piece.writes:
                writer = writer_of(key)
                if writer is not None and writer != piece_id:  # write after write
                    targets = successors_of(writer)
                    if targets is None:
                        successors[writer] = [piece_id]
                    else:
                        targets.append(piece_id)
                    in_degrees[piece_id] += 1
                since = drop_readers(key, None)
                if since and read_write_edges:  # write after the reads since the last write
                    for reader in since:
                        if reader != piece_id:
                            targets = successors_of(reader)
                            if targets is None:
                                successors[reader] = [piece_id]
                            else:
                                targets.append(piece_id)
                            in_degrees[piece_id] += 1
                last_writer[key] = piece_id
            if piece.after or deciders or piece.may_abort:
                if piece.after and names is None:
                    names = {p.name: base + k for k, p in enumerate(txn_pieces)}
                in_degrees[piece_id] += _logical_edges(piece, piece_id, names, deciders, successors)
    graph = Graph(pieces, owners, successors, in_degrees, sum(in_degrees))
    if debug.check_invariants:
        _check_graph(graph)
    return graph


def _logical_edges(
    piece: Piece,
    piece_id: int,
    names: dict[str, int] | None,
    deciders: list[int],
    successors: dict[int, list[int]],
) -> int:
    """Add a piece's edges from its ``after`` pieces and its transaction's abort deciders."""
    preds = [names[name] for name in piece.after] if names is not None and piece.after else []
    if deciders and (piece.writes or piece.may_abort):
        preds.extend(deciders)
    if piece.may_abort:
        deciders.append(piece_id)
    for pred in preds:
        successors.setdefault(pred, []).append(piece_id)
    return len(preds)


def _check_graph(graph: Graph) -> None:
    """The graph's bookkeeping agrees with its edges, and every edge points forward (the
    graph is built in serial order, so it has no cycle)."""
    counted = [0] * len(graph.pieces)
    for source, targets in graph.successors.items():
        for target in targets:
            assert source < target, f"edge {source}->{target} points backwards"
            counted[target] += 1
    assert counted == graph.in_degrees, "in-degrees disagree with the successor lists"
    assert sum(counted) == graph.edges, f"{sum(counted)} edges counted, {graph.edges} recorded"


class DgccProtocol(Protocol):
    """Dependency-graph concurrency control; each ``run_batch`` call is one epoch.

    Args:
        db: the database; state persists across batches.
        registry: the procedures requests may call.
        executors: logical executors taking turns on their own FIFO ready queues (pieces go
            to queues round-robin as they become ready). Python runs them on one thread, so
            this changes the execution order, not the speed. One executor runs the oldest
            ready piece first.
        shuffle_seed: when set, every step picks a random ready piece (seeded), to exercise
            arbitrary topological orders in tests.
    """

    name = "dgcc"
    deterministic = True

    def __init__(
        self,
        db: Database,
        registry: ProcedureRegistry,
        *,
        executors: int = 1,
        shuffle_seed: int | None = None,
    ) -> None:
        super().__init__(db, registry)
        if isinstance(executors, bool) or not isinstance(executors, int):
            raise ConfigError(f"executors must be an int, got {executors!r}")
        if not 1 <= executors <= EXECUTORS_MAX:
            raise ConfigError(f"executors must be in 1..{EXECUTORS_MAX}, got {executors}")
        if shuffle_seed is not None and not isinstance(shuffle_seed, int):
            raise ConfigError(f"shuffle_seed must be an int or None, got {shuffle_seed!r}")
        self.executors = executors
        self._rng = None if shuffle_seed is None else random.Random(shuffle_seed)
        self.read_write_edges = True  # the canary test turns this off
        # Durability hook: sees each batch's planned transactions and graph before execution
        # (dependency logging records the edges, then the abort decisions after the batch).
        self.graph_sink: Callable[[list[PlannedTxn], Graph], None] | None = None
        self.stats: dict[str, float] = {
            "timing_s/plan": 0.0,
            "timing_s/build_graph": 0.0,
            "timing_s/execute": 0.0,
            "dgcc/batches": 0,
            "dgcc/pieces": 0,
            "dgcc/edges": 0,
        }

    def run_batch(self, batch: Sequence[TxnRequest]) -> list[Outcome]:
        stats = self.stats
        started_s = time.perf_counter()
        planned = plan_batch(self.registry, self.db, batch)
        txns = [item for item in planned if isinstance(item, PlannedTxn)]
        planned_s = time.perf_counter()
        graph = build_graph(txns, read_write_edges=self.read_write_edges)
        built_s = time.perf_counter()
        if self.graph_sink is not None:
            self.graph_sink(txns, graph)
        contexts = [PieceContext(self.db, txn) for txn in txns]
        if self._rng is None and self.executors == 1:
            ran = self._execute_single(graph, txns, contexts)
        else:
            ran = self._execute_interleaved(graph, txns, contexts)
        done_s = time.perf_counter()
        assert ran == len(graph.pieces), f"{ran} of {len(graph.pieces)} pieces ran or released"
        if debug.check_invariants:
            assert not any(graph.in_degrees), "pieces left with unmet dependencies"
        stats["timing_s/plan"] += planned_s - started_s
        stats["timing_s/build_graph"] += built_s - planned_s
        stats["timing_s/execute"] += done_s - built_s
        stats["dgcc/batches"] += 1
        stats["dgcc/pieces"] += len(graph.pieces)
        stats["dgcc/edges"] += graph.edges
        return [item.outcome() if isinstance(item, PlannedTxn) else item for item in planned]

    def _execute_single(
        self, graph: Graph, txns: list[PlannedTxn], contexts: list[PieceContext]
    ) -> int:
        """One executor, oldest ready piece first: the fast path for benchmarks.

        Every edge points forward, so once pieces 0..k-1 have run, piece k has no unmet
        dependency: the oldest ready piece is always the next id, and a scan replaces a ready
        heap. In-degrees are still counted down along every edge and checked before each piece
        runs, so this path measures exactly DGCC's bookkeeping (graph, in-degrees) on top of the
        serial executor's work. The interleaved path exercises every other order.
        """
        pieces, owners, in_degrees = graph.pieces, graph.owners, graph.in_degrees
        successors_of = graph.successors.get
        run = _checked_runner() if debug.check_invariants else run_piece
        for piece_id, piece in enumerate(pieces):
            if in_degrees[piece_id]:
                raise AssertionError(f"piece {piece_id} reached with unmet dependencies")
            slot = owners[piece_id]
            run(contexts[slot], txns[slot], piece)
            targets = successors_of(piece_id)
            if targets is not None:
                for target in targets:
                    in_degrees[target] -= 1
        return len(pieces)

    def _execute_interleaved(
        self, graph: Graph, txns: list[PlannedTxn], contexts: list[PieceContext]
    ) -> int:
        """Several logical executors taking turns; random picks when a shuffle seed is set."""
        rng = self._rng
        # FIFO queues without a shuffle seed; lists with O(1) swap-removal of random picks.
        queue_type = deque if rng is None else list
        queues = [queue_type() for _ in range(self.executors)]
        next_queue = 0
        for piece_id, degree in enumerate(graph.in_degrees):
            if degree == 0:
                queues[next_queue].append(piece_id)
                next_queue = (next_queue + 1) % self.executors
        in_degrees = graph.in_degrees
        waiting = sum(len(queue) for queue in queues)
        turn = ran = 0
        run = _checked_runner() if debug.check_invariants else run_piece
        while waiting:
            if rng is None:
                while not queues[turn]:
                    turn = (turn + 1) % self.executors
                queue = queues[turn]
                piece_id = queue.popleft()
                turn = (turn + 1) % self.executors
            else:
                queue = rng.choice([queue for queue in queues if queue])
                position = rng.randrange(len(queue))
                queue[position], queue[-1] = queue[-1], queue[position]
                piece_id = queue.pop()
            waiting -= 1
            slot = graph.owners[piece_id]
            run(contexts[slot], txns[slot], graph.pieces[piece_id])
            ran += 1
            for successor in graph.successors.get(piece_id, ()):
                in_degrees[successor] -= 1
                if in_degrees[successor] == 0:
                    queues[next_queue].append(successor)
                    next_queue = (next_queue + 1) % self.executors
                    waiting += 1
        return ran


def _checked_runner() -> Callable[[PieceContext, PlannedTxn, Piece], None]:
    """``run_piece`` plus a check that each piece runs once (``run_piece`` itself fails a
    transaction whose piece aborts without ``may_abort``)."""
    seen: set[tuple[int, str]] = set()

    def run_checked(ctx: PieceContext, txn: PlannedTxn, piece: Piece) -> None:
        key = (txn.index, piece.name)
        assert key not in seen, f"piece {piece.name!r} of transaction {txn.index} ran twice"
        seen.add(key)
        run_piece(ctx, txn, piece)

    return run_checked
