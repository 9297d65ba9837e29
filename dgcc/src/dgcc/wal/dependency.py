"""Dependency logging: an epoch's inputs plus the dependency graph DGCC already built for it.

A block holds the requests in global order, each planned transaction's piece count, the graph's
edges as (source, target) piece ids, the logic-abort decisions, and the values received from
other nodes (empty on a single node), so a node can recover alone. Replay re-plans the requests
against the state at the epoch start (the same state as at run time), checks the pieces match
the log, skips logically aborted transactions outright (they wrote nothing), and runs the rest
by in-degree over the logged edges: dataflow, no level barriers, no graph construction.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dgcc.api import PieceContext, PlannedTxn, ProcedureRegistry, TxnRequest, plan_batch, run_piece
from dgcc.errors import DgccError
from dgcc.protocols.dgcc import Graph
from dgcc.storage import Database

__all__ = ["EpochShape", "critical_path", "record_edges", "record_epoch", "replay_epoch"]


def record_edges(graph: Graph) -> bytes:
    """The graph's edges as packed (source, target) u32 pairs."""
    edges = array("I")
    for source, targets in graph.successors.items():
        for target in targets:
            edges.append(source)
            edges.append(target)
    assert len(edges) == 2 * graph.edges, f"{len(edges) // 2} edges packed of {graph.edges}"
    return edges.tobytes()


def record_epoch(
    requests: Sequence[TxnRequest],
    txns: Sequence[PlannedTxn],
    edges: bytes,
    partitioning: tuple[int, bytes, dict[int, Any]] | None = None,
) -> dict[str, Any]:
    """The block payload, taken after the epoch ran (so the abort decisions are known).

    Args:
        partitioning: (partition count, packed per-piece partitions, crossing values by piece
            id) from ``parallel.record_partitions``, or None when not partitioned.
    """
    payload = {
        "requests": list(requests),
        "request_slots": [txn.index for txn in txns],
        "piece_counts": [len(txn.pieces) for txn in txns],
        "edges": edges,
        "aborted": [slot for slot, txn in enumerate(txns) if txn.abort_reason is not None],
        "errors": [slot for slot, txn in enumerate(txns) if txn.error is not None],
        "remote_values": {},
    }
    if partitioning is not None:
        payload["partitions"], payload["parts"], payload["remote_values"] = partitioning
    return payload


@dataclass(frozen=True, slots=True)
class EpochShape:
    """Work and span of an epoch's logged graph, in pieces (skipped aborted pieces count 0)."""

    pieces: int
    span: int


def _edge_array(payload: dict[str, Any]) -> array:
    edges = array("I")
    edges.frombytes(payload["edges"])
    return edges


def _skipped(payload: dict[str, Any]) -> list[bool]:
    counts: list[int] = payload["piece_counts"]
    aborted = set(payload["aborted"])
    skipped: list[bool] = []
    for slot, count in enumerate(counts):
        skipped.extend([slot in aborted] * count)
    return skipped


def critical_path(payload: dict[str, Any]) -> EpochShape:
    """The longest dependency chain of the replayed pieces: recovery's bound with many workers."""
    skipped = _skipped(payload)
    edges = _edge_array(payload)
    pairs = sorted(zip(edges[0::2], edges[1::2], strict=True))
    weight = [0 if skip else 1 for skip in skipped]
    depth = list(weight)  # longest chain ending at each piece, itself included
    for source, target in pairs:  # sources ascend and edges point forward: depth[source] is final
        candidate = depth[source] + weight[target]
        if candidate > depth[target]:
            depth[target] = candidate
    return EpochShape(sum(weight), max(depth, default=0))


def replay_epoch(
    db: Database, registry: ProcedureRegistry, payload: dict[str, Any], *, workers: int = 1
) -> int:
    """Re-execute one logged epoch on ``db`` following its logged graph; returns pieces run.

    Args:
        workers: logical workers taking turns on their own FIFO ready queues.

    Raises:
        DgccError: the re-planned transactions do not match the logged graph.
    """
    planned = plan_batch(registry, db, payload["requests"])
    txns = [item for item in planned if isinstance(item, PlannedTxn)]
    counts = [len(txn.pieces) for txn in txns]
    if counts != payload["piece_counts"]:
        raise DgccError(
            f"replayed epoch plans {len(counts)} txns / {sum(counts)} pieces, log has "
            f"{len(payload['piece_counts'])} / {sum(payload['piece_counts'])}"
        )
    pieces = [piece for txn in txns for piece in txn.pieces]
    owners = [slot for slot, txn in enumerate(txns) for _ in txn.pieces]
    skipped = _skipped(payload)
    edges = _edge_array(payload)
    in_degrees = [0] * len(pieces)
    successors: dict[int, list[int]] = {}
    for source, target in zip(edges[0::2], edges[1::2], strict=True):
        successors.setdefault(source, []).append(target)
        in_degrees[target] += 1
    contexts = [PieceContext(db, txn) for txn in txns]
    queues: list[deque[int]] = [deque() for _ in range(workers)]
    for piece_id, degree in enumerate(in_degrees):
        if not degree:
            queues[piece_id % workers].append(piece_id)
    ran = released = turn = 0
    waiting = sum(map(len, queues))
    while waiting:
        while not queues[turn]:
            turn = (turn + 1) % workers
        piece_id = queues[turn].popleft()
        turn = (turn + 1) % workers
        waiting -= 1
        released += 1
        if not skipped[piece_id]:
            slot = owners[piece_id]
            run_piece(contexts[slot], txns[slot], pieces[piece_id])
            ran += 1
        for target in successors.get(piece_id, ()):
            in_degrees[target] -= 1
            if not in_degrees[target]:
                queues[target % workers].append(target)
                waiting += 1
    assert released == len(pieces), f"{released} of {len(pieces)} pieces released"
    return ran
