"""A Calvin node: deterministic order per epoch, a deterministic lock manager, no 2PC.

Calvin (Thomson et al., SIGMOD 2012) sequences calls into epochs and agrees on one global
order; each node's lock manager then grants a transaction all of its locks on the node's
records in that order, and the transaction holds them until its work at the node is done. A
multi-partition transaction, at each participant, reads its local records, sends the reads to
the other participants and, where it writes (an active participant), waits until it has the
reads of every other participant before it executes and writes; only then are its locks
released. So a distributed transaction holds its locks across a network message, and every
later conflicting transaction on that node waits behind it. Execution is deterministic, so no
two-phase commit is needed.

This node shares the sequencing (each node's epoch batch, global order (epoch, origin,
sequence)), the value messages and the reports with the DistDGCC node; the local schedule is
Calvin's:

  * ``lock_graph`` orders whole transactions: a transaction's first step on this node waits
    for the last piece of every earlier transaction holding a conflicting lock on any record
    it touches here (shared for reads, exclusive for writes), and its pieces on this node run
    one after the other, as a Calvin worker executes a transaction's logic.
  * A multi-node transaction gets one grant step per participant (``GRANT``), first in its
    chain there: it runs once the transaction holds all its locks on that node, and stands for
    the participant's local reads being served; its value message goes to every other
    participant that writes. Every writing piece waits for the grants of all other
    participants, so an active participant writes only once every remote read has arrived, by
    real messages between the node processes. Reads run before the wait, as in Calvin.

What the piece model adds: a piece that needs another piece's output (TPC-C NewOrder's order
lines need the remote stock pieces' results) still waits for that value message too, where
Calvin would compute it from the forwarded records.

Durability is Calvin's input logging with group commit: with a data dir, each node logs per
epoch the block a DistDGCC node logs (the inputs in global order, plus the values it received,
so it can also replay alone), and an epoch's clients are answered once every node has made
it durable. A restart replays the blocks with this epoch run (``LoggedCalvinEpochRun``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

from dgcc import debug
from dgcc.api import Piece, PieceContext, PlannedTxn
from dgcc.net.node import Node
from dgcc.protocols.dgcc import Graph, _check_graph
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.wal.node_log import LoggedEpochRun

__all__ = ["GRANT", "CalvinEpochRun", "CalvinNode", "LoggedCalvinEpochRun", "lock_graph"]

GRANT = "calvin.grant@"  # + node id: a participant's grant step (no procedure names one so)


def _granted(ctx: PieceContext) -> None:
    """A grant step: the participant holds its locks (its reads leave in the value message)."""
    return None


def _is_grant(piece: Piece) -> bool:
    return piece.name.startswith(GRANT)


def lock_graph(txns: Sequence[PlannedTxn]) -> Graph:
    """Transaction-granularity lock order of ``txns`` (in global order) as a piece graph.

    A transaction's grant step (if any: the last of its pieces here, as ``_placement_of``
    appends grants after the plan's pieces) heads its chain: it takes the lock edges, and the
    transaction's last piece releases its locks.
    """
    pieces: list[Piece] = []
    owners: list[int] = []
    successors: dict[int, list[int]] = {}
    in_degrees: list[int] = []
    exclusive: dict[Hashable, int] = {}  # key -> last piece of its latest exclusive holder
    shared: dict[Hashable, list[int]] = {}  # key -> last pieces of shared holders since then
    for slot, txn in enumerate(txns):
        local = txn.pieces
        count = len(local)
        if not count:
            continue
        base = len(pieces)
        granted = _is_grant(local[-1])
        if debug.check_invariants:
            grants = sum(map(_is_grant, local))
            assert grants == granted, f"{txn.procedure.name}: grant steps {grants} not last"
        # the chain: the grant step first, then the plan's pieces in order
        first = base + count - 1 if granted else base
        last = base + count - 2 if granted and count > 1 else base + count - 1
        writes: set[Hashable] = set()
        for piece in local:
            writes.update(piece.writes)
        preds: set[int] = set()
        for key in writes:  # exclusive: after the last writer and every reader since
            holder = exclusive.get(key)
            if holder is not None:
                preds.add(holder)
            readers = shared.pop(key, None)
            if readers:
                preds.update(readers)
            exclusive[key] = last
        seen: set[Hashable] = set()
        for piece in local:
            for key in piece.reads:  # shared: after the last writer
                if key in writes or key in seen:
                    continue
                seen.add(key)
                holder = exclusive.get(key)
                if holder is not None:
                    preds.add(holder)
                readers = shared.get(key)
                if readers is None:
                    shared[key] = [last]
                else:
                    readers.append(last)
        pieces.extend(local)
        owners.extend([slot] * count)
        in_degrees.extend([1] * count)  # each piece waits for its predecessor in the chain
        for pred in preds:
            successors.setdefault(pred, []).append(first)
        in_degrees[first] = len(preds)
        if granted and count > 1:
            successors.setdefault(first, []).append(base)  # grant, then the plan's pieces
        for piece_id in range(base, base + count - 1 - granted):
            successors.setdefault(piece_id, []).append(piece_id + 1)
    graph = Graph(pieces, owners, successors, in_degrees, sum(in_degrees))
    if debug.check_invariants:
        _check_graph(graph, forward=False)  # (grant steps head chains from the plan's end)
    return graph


class CalvinEpochRun(EpochRun):
    """A DistDGCC epoch run with Calvin's lock manager and read exchange (module docstring)."""

    whole_graph = True  # a transaction's locks on this node hold from its first step: the
    # lock graph orders every piece of an epoch with cross-node edges

    def _placement_of(
        self, planned: PlannedTxn, routed: frozenset[int] | None
    ) -> list[tuple[int, ...]]:
        """DistDGCC's placement, plus a grant step per participant of a multi-node txn.

        Grant steps go after the procedure's pieces, so piece indices (in value messages and
        abort decisions) stay those of the plan.
        """
        runs_on = super()._placement_of(planned, routed)
        participants = sorted({node for nodes in runs_on for node in nodes})
        if len(participants) < 2:
            return runs_on
        grants = [Piece(f"{GRANT}{node}", _granted) for node in participants]
        names = tuple(grant.name for grant in grants)
        pieces = [
            dataclasses.replace(piece, after=piece.after + names) if piece.writes else piece
            for piece in planned.pieces
        ]
        planned.pieces = pieces + grants
        return runs_on + [(node,) for node in participants]

    def local_graph(self, txns: list[PlannedTxn]) -> Graph:
        return lock_graph(txns)

    def reports(self) -> dict[int, list[Any]]:
        """DistDGCC's reports without the grant steps' (empty) outputs."""
        reports = super().reports()
        for entries in reports.values():
            for entry in entries:
                outputs = entry[1]
                for name in [name for name in outputs if name.startswith(GRANT)]:
                    del outputs[name]
        return reports


class LoggedCalvinEpochRun(LoggedEpochRun, CalvinEpochRun):
    """Calvin's epoch run keeping its inputs and received values for the epoch's log block."""


class CalvinNode(Node):
    """A DistDGCC node with Calvin's epoch run (and, with a data dir, its input log)."""

    epoch_run = CalvinEpochRun
    logged_epoch_run = LoggedCalvinEpochRun
