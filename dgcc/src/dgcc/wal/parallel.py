"""Parallel dependency replay in worker processes, one group of data partitions per worker.

At run time the dependency log also records each piece's partition and the outputs of pieces
that feed a piece of another partition (the values that would cross nodes in DistDGCC). At
recovery, after the checkpoint is loaded, ``workers`` forked children each replay only their
partitions' pieces of every logged epoch: temporal edges never cross partitions (one key, one
partition), logical edges that do are served from the logged values, and aborted transactions
are skipped. Within a worker, ascending piece id is a topological order (every edge points
forward). Each child returns the after-images of the records it wrote; the parent installs them.

Requirement on procedures (TPC-C meets it): planning reads only data no transaction writes or
data of the partitions the transaction's pieces live in.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from array import array
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from dgcc.api import PieceContext, PlannedTxn, ProcedureRegistry, plan_batch, run_piece
from dgcc.errors import DgccError
from dgcc.protocols.dgcc import Graph
from dgcc.storage import Database
from dgcc.wal import value

__all__ = ["REPLICATED", "UNSPLITTABLE", "record_partitions", "replay_partitioned"]

REPLICATED = -1  # a piece touching only replicated (read-only) data and no partition
UNSPLITTABLE = -2  # a piece touching several partitions: this epoch cannot be split


def record_partitions(
    txns: Sequence[PlannedTxn], graph: Graph, partition_of: Callable[[Hashable], int]
) -> tuple[bytes, dict[int, Any]]:
    """Per-piece partition (packed i16) and the outputs that cross partitions, by piece id."""
    parts = array("h")
    for txn in txns:
        home = REPLICATED
        start = len(parts)
        for piece in txn.pieces:
            found = {partition_of(key) for key in (*piece.reads, *piece.writes)}
            found.discard(REPLICATED)
            part = found.pop() if len(found) == 1 else (REPLICATED if not found else UNSPLITTABLE)
            if part == REPLICATED and piece.writes:
                part = UNSPLITTABLE
            if home == REPLICATED and part >= 0:
                home = part
            parts.append(part)
        for piece_id in range(start, len(parts)):  # read-only replicated pieces run at home
            if parts[piece_id] == REPLICATED:
                parts[piece_id] = home
    crossing: dict[int, Any] = {}
    owners, pieces = graph.owners, graph.pieces
    for source, targets in graph.successors.items():
        for target in targets:
            if parts[source] != parts[target] and owners[source] == owners[target]:
                name = pieces[source].name
                if name in pieces[target].after:
                    crossing[source] = txns[owners[source]].outputs.get(name)
    return parts.tobytes(), crossing


def splittable(payload: dict[str, Any]) -> bool:
    parts = array("h")
    parts.frombytes(payload.get("parts", b""))
    return "parts" in payload and not payload.get("errors") and UNSPLITTABLE not in parts


def _replay_mine(
    db: Database, registry: ProcedureRegistry, payload: dict[str, Any], mine: set[int]
) -> None:
    """Run this worker's pieces of one epoch, in ascending piece id."""
    parts = array("h")
    parts.frombytes(payload["parts"])
    counts: list[int] = payload["piece_counts"]
    aborted = set(payload["aborted"])
    crossing: dict[int, Any] = payload["remote_values"]
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + count)
    chosen = [
        slot
        for slot in range(len(counts))
        if slot not in aborted
        and any(parts[g] in mine for g in range(offsets[slot], offsets[slot + 1]))
    ]
    requests = [payload["requests"][payload["request_slots"][slot]] for slot in chosen]
    for slot, planned in zip(chosen, plan_batch(registry, db, requests), strict=True):
        if not isinstance(planned, PlannedTxn) or len(planned.pieces) != counts[slot]:
            raise DgccError(f"replayed transaction {slot} does not match its logged plan")
        ctx = PieceContext(db, planned)
        base = offsets[slot]
        for k, piece in enumerate(planned.pieces):
            if base + k in crossing:
                planned.outputs[piece.name] = crossing[base + k]
        for k, piece in enumerate(planned.pieces):
            if parts[base + k] in mine:
                run_piece(ctx, planned, piece)
        if planned.error is not None or planned.abort_reason is not None:
            raise DgccError(
                f"replayed transaction {slot} diverged from the log: {planned.outcome()}"
            )


def replay_partitioned(
    db: Database,
    registry: ProcedureRegistry,
    payloads: Sequence[dict[str, Any]],
    *,
    workers: int,
    partitions: int,
) -> list[float]:
    """Replay splittable dependency epochs with ``workers`` forked processes, into ``db``.

    Returns each worker's CPU seconds (its share of the work, whatever else shares the host).
    """
    assert all(splittable(payload) for payload in payloads), "an epoch cannot be split"
    scratch = Path(tempfile.mkdtemp(prefix="dgcc_replay_"))
    children = []
    for worker in range(workers):
        out = scratch / f"worker{worker}.pkl"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                tracker = value.WriteTracker(db)
                mine = {p for p in range(partitions) if p % workers == worker}
                for payload in payloads:
                    _replay_mine(db, registry, payload, mine)
                out.write_bytes(pickle.dumps(value.record_epoch(db, tracker.take()), 5))
                code = 0
            finally:
                os._exit(code)
        children.append((pid, out))
    failed, cpu_s = [], []
    for pid, _ in children:
        _, status, usage = os.wait4(pid, 0)
        cpu_s.append(usage.ru_utime + usage.ru_stime)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(pid)
    if failed:
        raise DgccError(f"replay workers {failed} failed")
    for _, out in children:
        value.replay_epoch(db, pickle.loads(out.read_bytes()))
        out.unlink()
    scratch.rmdir()
    return cpu_s
