"""Dependency logging: an epoch's inputs plus the dependency graph DGCC already built for it.

A block holds the requests in global order (packed as command logging packs them), each
planned transaction's piece count, the graph's successor lists, the logic-abort decisions,
which transactions wrote nothing, and the values received from other partitions or nodes, so
a node can recover alone.

Replay does only the work the log leaves open. It runs only the transactions that changed
state: logically aborted ones wrote nothing and read-only ones change nothing. With one worker
(or one process per partition group, ``parallel``) a replayed transaction's pieces run back to
back, so a procedure with a ``replay`` entry point redoes its writes in one call: the log holds
its commit decision, so there is no plan, no piece and no result to build. Other procedures,
and every transaction of an in-degree walk, are re-planned against the epoch-start state (a
piece is code closing over its plan); then a piece that writes nothing and feeds no writing
piece is skipped (its output only went into the client's answer, already given), and the rest
run by in-degree over the logged edges (no graph construction, no level barriers), or, with one
worker, in ascending piece id: every logged edge points forward.
"""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dgcc.api import (
    Piece,
    PieceContext,
    PlannedTxn,
    ProcedureRegistry,
    TxnRequest,
    raised,
    run_piece,
)
from dgcc.errors import BadRequest, DgccError
from dgcc.protocols.dgcc import Graph
from dgcc.storage import Database
from dgcc.wal import command

__all__ = [
    "EpochShape",
    "Redo",
    "critical_path",
    "needed_pieces",
    "plan_replayed",
    "record_epoch",
    "redo_failed",
    "replay_epoch",
    "replay_jobs",
    "replayed_slots",
    "successor_lists",
]


def _pack_successors(graph: Graph) -> bytes:
    """The graph as packed u32 runs ``source, count, target * count`` (one run per source)."""
    packed = array("I")
    append, extend = packed.append, packed.extend
    for source, targets in graph.successors.items():
        append(source)
        append(len(targets))
        extend(targets)
    assert len(packed) == 2 * len(graph.successors) + graph.edges, "edge count mismatch"
    return packed.tobytes()


def successor_lists(payload: dict[str, Any]) -> dict[int, list[int]]:
    """The logged graph: piece id -> successor piece ids (only pieces that have some)."""
    packed = array("I")
    packed.frombytes(payload["successors"])
    successors: dict[int, list[int]] = {}
    at, end = 0, len(packed)
    while at < end:
        count = packed[at + 1]
        successors[packed[at]] = packed[at + 2 : at + 2 + count].tolist()
        at += 2 + count
    return successors


def record_epoch(
    requests: Sequence[TxnRequest],
    txns: Sequence[PlannedTxn],
    graph: Graph,
    partitioning: tuple[int, bytes, dict[int, bytes], dict[int, Any]] | None = None,
) -> dict[str, Any]:
    """The block payload, taken after the epoch ran (so the abort decisions are known).

    Args:
        partitioning: the partition count and ``parallel.record_partitions``'s three results
            (per-transaction partitions, per-piece ones of multi-partition transactions,
            crossing values by piece id), or None when not partitioned.
    """
    aborted, readonly, errors = [], [], []
    for slot, txn in enumerate(txns):
        if txn.error is not None:
            errors.append(slot)
        elif txn.abort_reason is not None:
            aborted.append(slot)
        else:
            for piece in txn.pieces:
                if piece.writes:
                    break
            else:
                readonly.append(slot)
    payload = {
        "requests": command.pack_requests(requests),
        "request_slots": [txn.index for txn in txns],
        "piece_counts": [len(txn.pieces) for txn in txns],
        "successors": _pack_successors(graph),
        "aborted": aborted,
        "readonly": readonly,
        "errors": errors,
        "remote_values": {},
    }
    if partitioning is not None:
        partitions, payload["txn_parts"], payload["piece_parts"], crossing = partitioning
        payload["partitions"], payload["remote_values"] = partitions, crossing
    return payload


def replayed_slots(payload: dict[str, Any]) -> list[bool]:
    """Per planned transaction: does replay run it (not aborted, not read-only)?"""
    replayed = [True] * len(payload["piece_counts"])
    for slot in (*payload["aborted"], *payload["readonly"]):
        replayed[slot] = False
    return replayed


def needed_pieces(pieces: Sequence[Piece]) -> list[bool]:
    """Per piece of a committed transaction: does it write, or feed (``after``) one that does?"""
    wanted: set[str] = set()
    needed = [False] * len(pieces)
    for k in range(len(pieces) - 1, -1, -1):
        piece = pieces[k]
        if piece.writes or piece.name in wanted:
            needed[k] = True
            wanted.update(piece.after)
    return needed


@dataclass(frozen=True, slots=True)
class EpochShape:
    """Work and span of an epoch's logged graph, in pieces (skipped transactions count 0)."""

    pieces: int
    span: int


def critical_path(payload: dict[str, Any]) -> EpochShape:
    """The longest dependency chain of the replayed pieces: recovery's bound with many workers."""
    weight: list[int] = []
    for count, replayed in zip(payload["piece_counts"], replayed_slots(payload), strict=True):
        weight.extend([int(replayed)] * count)
    depth = list(weight)  # longest chain ending at each piece, itself included
    successors = successor_lists(payload)
    for source in sorted(successors):  # edges point forward: depth[source] is final here
        reach = depth[source]
        for target in successors[source]:
            if reach + weight[target] > depth[target]:
                depth[target] = reach + weight[target]
    return EpochShape(sum(weight), max(depth, default=0))


def plan_replayed(
    db: Database, registry: ProcedureRegistry, payload: dict[str, Any], chosen: Sequence[int]
) -> list[PlannedTxn]:
    """Re-plan the logged transactions at ``chosen`` slots against the epoch-start state.

    The parameters are not checked again: these requests planned at run time (the log holds
    their piece counts), and the piece-count check below catches a plan that changed.

    Raises:
        DgccError: a re-planned transaction fails to plan or does not match its logged piece
            count.
    """
    requests, request_slots = payload["requests"], payload["request_slots"]
    counts = payload["piece_counts"]
    view, procedure_of = db.read_view(), registry.get
    planned = []
    for slot in chosen:
        name, params = requests[request_slots[slot]]  # planned at run time: never None
        try:
            procedure = procedure_of(name)
            pieces = tuple(procedure.plan(params, view))
        except BadRequest as error:
            raise DgccError(f"replayed transaction {slot} no longer plans: {error}") from None
        except Exception as error:  # it planned when logged: another workload, or not pure
            reason = raised(name, "plan", error)
            raise DgccError(f"replayed transaction {slot} no longer plans: {reason}") from None
        if len(pieces) != counts[slot]:
            raise DgccError(
                f"replayed transaction {slot} has {len(pieces)} pieces; the log has {counts[slot]}"
            )
        planned.append(PlannedTxn(slot, procedure, params, pieces))
    return planned


class Redo(NamedTuple):
    """A committed transaction replayed whole through its procedure's ``replay`` (a named
    tuple: one is built per replayed transaction, and a frozen dataclass costs more)."""

    slot: int
    replay: Callable[[Database, Mapping[str, Any]], None]
    params: Mapping[str, Any]


def replay_jobs(
    db: Database,
    registry: ProcedureRegistry,
    payload: dict[str, Any],
    chosen: Sequence[int],
    split: Container[int] = (),
) -> list[Redo | PlannedTxn]:
    """What replay runs for each ``chosen`` slot, in order: a ``Redo`` where the procedure has
    a replay entry point and the slot is not in ``split`` (transactions whose pieces do not all
    run here), else the transaction re-planned against the epoch-start state (call this before
    any of the epoch runs).

    Raises:
        DgccError: as ``plan_replayed``, or a logged procedure is no longer registered.
    """
    requests, request_slots = payload["requests"], payload["request_slots"]
    jobs: list[Redo | PlannedTxn | None] = []
    planned_slots = []
    entry_points: dict[str, Callable[[Database, Mapping[str, Any]], None] | None] = {}
    for slot in chosen:
        name, params = requests[request_slots[slot]]
        if name not in entry_points:  # a handful of procedures, thousands of calls
            try:
                entry_points[name] = registry.get(name).replay
            except BadRequest as error:
                raise DgccError(f"replayed transaction {slot} no longer plans: {error}") from None
        replay = entry_points[name]
        if replay is None or slot in split:
            jobs.append(None)
            planned_slots.append(slot)
        else:
            jobs.append(Redo(slot, replay, params))
    planned = iter(plan_replayed(db, registry, payload, planned_slots))
    return [next(planned) if job is None else job for job in jobs]


def redo_failed(job: Redo, error: Exception) -> DgccError:
    """The error for a ``Redo`` whose ``replay`` raised: a replay that fails is a
    log/procedure mismatch, not bad input. (Callers run ``job.replay(db, job.params)`` inline
    in their loops, inside a ``try``: no extra call per transaction.)"""
    return DgccError(f"replayed transaction {job.slot} failed: {type(error).__name__}: {error}")


def replay_epoch(
    db: Database, registry: ProcedureRegistry, payload: dict[str, Any], *, workers: int = 1
) -> int:
    """Re-execute one logged epoch on ``db`` following its logged graph; returns the
    transactions redone whole plus the pieces run.

    Args:
        workers: logical workers taking turns on their own FIFO ready queues (any count gives
            the same state; real parallelism comes from ``parallel``'s processes). One worker
            runs the transactions in log order (a topological order of the logged graph:
            every edge points forward), redoing those with a replay entry point and running
            the needed pieces of the others, with no in-degree bookkeeping. An epoch with a
            procedure error runs every piece in piece order, whatever ``workers`` says: which
            pieces of a failing transaction ran depends on the order, and the logging engine
            runs its epochs in that order (one executor, oldest ready piece first).

    Raises:
        DgccError: the re-planned transactions do not match the log, or one now aborts.
    """
    chosen = [slot for slot, replayed in enumerate(replayed_slots(payload)) if replayed]
    errors = set(payload["errors"])
    if workers == 1 and not errors:
        ran = 0
        for job in replay_jobs(db, registry, payload, chosen):
            if type(job) is Redo:
                try:
                    job.replay(db, job.params)
                except Exception as error:
                    raise redo_failed(job, error) from error
                ran += 1
                continue
            ctx = PieceContext(db, job)
            for piece, keep in zip(job.pieces, needed_pieces(job.pieces), strict=True):
                if keep:
                    run_piece(ctx, job, piece)
                    ran += 1
            if job.abort_reason is not None or job.error is not None:
                raise DgccError(
                    f"replayed transaction {job.index} diverged from the log: {job.outcome()}"
                )
        return ran
    txns = plan_replayed(db, registry, payload, chosen)
    jobs = _jobs(db, payload, chosen, txns)
    if errors:  # as the epoch ran (every edge points forward: piece order is topological)
        for job in jobs:
            if job is not None:
                run_piece(*job)
        ran = sum(job is not None for job in jobs)
    else:
        ran = _run_by_in_degree(jobs, successor_lists(payload), workers)
    diverged = [
        f"{slot} ({txn.outcome()}; the log has it {'fail' if slot in errors else 'commit'})"
        for slot, txn in zip(chosen, txns, strict=True)
        if (txn.abort_reason and slot not in errors) or (txn.error is not None) != (slot in errors)
    ]
    if diverged:
        raise DgccError(f"replayed transactions diverged from the log: {', '.join(diverged[:3])}")
    return ran


def _jobs(
    db: Database, payload: dict[str, Any], chosen: Sequence[int], txns: Sequence[PlannedTxn]
) -> list[tuple[PieceContext, PlannedTxn, Piece] | None]:
    """What each piece id runs (None: skipped), for the in-degree walk."""
    errors = set(payload["errors"])
    offsets = [0, *itertools.accumulate(payload["piece_counts"])]
    jobs: list[tuple[PieceContext, PlannedTxn, Piece] | None] = [None] * offsets[-1]
    for slot, txn in zip(chosen, txns, strict=True):
        ctx = PieceContext(db, txn)
        keep = [True] * len(txn.pieces) if slot in errors else needed_pieces(txn.pieces)
        for k, piece in enumerate(txn.pieces):
            if keep[k]:
                jobs[offsets[slot] + k] = (ctx, txn, piece)
    return jobs


def _run_by_in_degree(
    jobs: list[tuple[PieceContext, PlannedTxn, Piece] | None],
    successors: dict[int, list[int]],
    workers: int,
) -> int:
    """Dataflow over the logged graph: a piece runs once all its predecessors are released."""
    in_degrees = [0] * len(jobs)
    for targets in successors.values():
        for target in targets:
            in_degrees[target] += 1
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
        job = jobs[piece_id]
        if job is not None:
            run_piece(*job)
            ran += 1
        for target in successors.get(piece_id, ()):
            in_degrees[target] -= 1
            if not in_degrees[target]:
                queues[target % workers].append(target)
                waiting += 1
    assert released == len(jobs), f"{released} of {len(jobs)} pieces released"
    return ran
