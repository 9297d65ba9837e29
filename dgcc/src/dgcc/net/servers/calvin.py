"""A Calvin node: deterministic order per epoch, a deterministic lock manager, no 2PC.

Calvin (Thomson et al., SIGMOD 2012) sequences calls into epochs, agrees on one global order
and then has every node's lock manager grant each transaction's locks on the node's records in
that order; a transaction runs once it holds all of them, participants forward the values
(read results, abort decisions) the others need, and each node releases a transaction's locks
when its part is done. Execution is deterministic, so no two-phase commit is needed.

It shares everything but the local schedule with the DistDGCC node: the sequencing (each
node's epoch batch, global order (epoch, origin, sequence)), the value messages and the
reports. The difference is the granularity of ordering. DistDGCC orders single pieces on
single records; here ``lock_graph`` orders whole transactions: a transaction's first piece on
this node waits for the last piece of every earlier transaction holding a conflicting lock on
any record it touches here (shared for reads, exclusive for writes), and its pieces on this
node run one after the other, as a Calvin worker executes a transaction's logic.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from dgcc import debug
from dgcc.api import Piece, PlannedTxn
from dgcc.cluster import ClusterConfig
from dgcc.net.node import Node
from dgcc.protocols.dgcc import Graph, _check_graph
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.wal.node_log import LoggedEpochRun

__all__ = ["CalvinEpochRun", "CalvinNode", "LoggedCalvinEpochRun", "lock_graph"]


def lock_graph(txns: Sequence[PlannedTxn]) -> Graph:
    """Transaction-granularity lock order of ``txns`` (in global order) as a piece graph."""
    pieces: list[Piece] = []
    owners: list[int] = []
    successors: dict[int, list[int]] = {}
    in_degrees: list[int] = []
    exclusive: dict[Hashable, int] = {}  # key -> last piece of its latest exclusive holder
    shared: dict[Hashable, list[int]] = {}  # key -> last pieces of shared holders since then
    for slot, txn in enumerate(txns):
        if not txn.pieces:
            continue
        first = len(pieces)
        last = first + len(txn.pieces) - 1
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
        for piece_id in range(first + 1, last + 1):  # the transaction's pieces in order
            successors.setdefault(piece_id - 1, []).append(piece_id)
            in_degrees[piece_id] = 1
    graph = Graph(pieces, owners, successors, in_degrees, sum(in_degrees))
    if debug.check_invariants:
        _check_graph(graph)
    return graph


class CalvinEpochRun(EpochRun):
    """A DistDGCC epoch run whose local order comes from Calvin's lock manager."""

    def local_graph(self, txns: list[PlannedTxn]) -> Graph:
        return lock_graph(txns)


class LoggedCalvinEpochRun(LoggedEpochRun, CalvinEpochRun):
    """Calvin's schedule with the epoch log of a node that has a data directory."""


class CalvinNode(Node):
    """A DistDGCC node with Calvin's epoch run (logged like DistDGCC's with a data dir)."""

    def __init__(self, config: ClusterConfig, node_id: int) -> None:
        super().__init__(config, node_id)
        self.epoch_run = CalvinEpochRun if self.durability is None else LoggedCalvinEpochRun
