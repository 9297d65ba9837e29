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
import itertools
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

    A transaction's grant step (if any) heads its chain: it takes the lock edges, and the
    transaction's last piece releases its locks.
    """
    pieces: list[Piece] = []
    owners: list[int] = []
    successors: dict[int, list[int]] = {}
    in_degrees: list[int] = []
    exclusive: dict[Hashable, int] = {}  # key -> last piece of its latest exclusive holder
    shared: dict[Hashable, list[int]] = {}  # key -> last pieces of shared holders since then
    for slot, txn in enumerate(txns):
        if not txn.pieces:
            continue
        base = len(pieces)
        grants = [k for k, piece in enumerate(txn.pieces) if _is_grant(piece)]
        assert len(grants) <= 1, f"{txn.procedure.name}: {len(grants)} grant steps on one node"
        chain = grants + [k for k in range(len(txn.pieces)) if k not in grants]
        first, last = base + chain[0], base + chain[-1]
        modes: dict[Hashable, str] = {}
        for piece in txn.pieces:
            modes.update(dict.fromkeys(piece.reads, "S"))
        for piece in txn.pieces:
            modes.update(dict.fromkeys(piece.writes, "X"))
        preds: set[int] = set()
        for key, mode in modes.items():
            holder = exclusive.get(key)
            if holder is not None:
                preds.add(holder)
            if mode == "X":
                preds.update(shared.pop(key, ()))
                exclusive[key] = last
            else:
                shared.setdefault(key, []).append(last)
        pieces.extend(txn.pieces)
        owners.extend([slot] * len(txn.pieces))
        in_degrees.extend([0] * len(txn.pieces))
        for pred in preds:
            successors.setdefault(pred, []).append(first)
        in_degrees[first] = len(preds)
        for before, after in itertools.pairwise(chain):  # the chain, one at a time
            successors.setdefault(base + before, []).append(base + after)
            in_degrees[base + after] = 1
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
