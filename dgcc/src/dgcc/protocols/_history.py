"""Committed-history recording and the conflict-serializability check for non-deterministic
protocols (2PL, OCC).

Every conflict key carries a version, bumped once per committed transaction that declared a
write to it. A committed transaction records the version of each key it declared when it first
reached it (``reads``) and the version it installed on each key it wrote (``writes``). From these
the conflict graph follows: the writer of version ``v`` precedes the writer of ``v + 1`` (ww), the
readers of ``v`` (wr), and each reader of ``v`` precedes the writer of ``v + 1`` (rw). Declared
keys over-approximate the records touched, which only adds edges.

A logic abort (the procedure itself rolled back) is recorded too (``aborted``): it read keys and
wrote none, so it sits in the graph as a reader, and the serial replay must abort it at its
place, for the same reason; a committed transaction must commit there. Concurrency-control
give-ups (ABORTED with a ``retry`` reason, see ``gave_up``) were undone and are not recorded.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from dgcc.api import Outcome, ProcedureRegistry, Status, TxnRequest, result_raised
from dgcc.protocols.serial import SerialProtocol
from dgcc.storage import Database

__all__ = ["CommittedTxn", "NotSerializable", "replay", "serial_order"]

Key = Hashable
TxnId = tuple[int, int]  # (batch number, position in the batch)


@dataclass(frozen=True, slots=True)
class CommittedTxn:
    """A finished transaction of the history: committed, or logic-aborted (``aborted``: then
    ``writes`` is empty and ``reads`` holds the versions its decision rested on)."""

    batch: int
    index: int
    request: TxnRequest
    reads: dict[Key, int]
    writes: dict[Key, int]
    aborted: bool = False

    @property
    def txn_id(self) -> TxnId:
        return (self.batch, self.index)


class NotSerializable(AssertionError):
    """The committed history's conflict graph has a cycle."""


def conflict_edges(history: Sequence[CommittedTxn]) -> set[tuple[TxnId, TxnId]]:
    """The conflict graph's edges (earlier, later) between committed transactions."""
    writer: dict[tuple[Key, int], TxnId] = {}
    readers: dict[tuple[Key, int], list[TxnId]] = defaultdict(list)
    for txn in history:
        for key, version in txn.writes.items():
            assert (key, version) not in writer, f"two writers of version {version} of {key!r}"
            writer[(key, version)] = txn.txn_id
        for key, version in txn.reads.items():
            readers[(key, version)].append(txn.txn_id)
    edges: set[tuple[TxnId, TxnId]] = set()
    for (key, version), txn_id in writer.items():
        before = writer.get((key, version - 1))
        if before is not None:
            edges.add((before, txn_id))
        for reader in readers.get((key, version - 1), ()):
            edges.add((reader, txn_id))
    for (key, version), ids in readers.items():
        source = writer.get((key, version))
        if source is not None:
            edges.update((source, reader) for reader in ids)
    return {(a, b) for a, b in edges if a != b}


def serial_order(history: Sequence[CommittedTxn]) -> list[CommittedTxn]:
    """A topological order of the conflict graph (ties by batch, then batch position).

    Raises:
        NotSerializable: the graph has a cycle; the message names the transactions left in it.
    """
    by_id = {txn.txn_id: txn for txn in history}
    successors: dict[TxnId, list[TxnId]] = defaultdict(list)
    in_degree = dict.fromkeys(by_id, 0)
    for a, b in conflict_edges(history):
        successors[a].append(b)
        in_degree[b] += 1
    ready = [txn_id for txn_id, degree in in_degree.items() if degree == 0]
    heapq.heapify(ready)
    order: list[CommittedTxn] = []
    while ready:
        txn_id = heapq.heappop(ready)
        order.append(by_id[txn_id])
        for nxt in successors[txn_id]:
            in_degree[nxt] -= 1
            if in_degree[nxt] == 0:
                heapq.heappush(ready, nxt)
    if len(order) != len(history):
        stuck = sorted(txn_id for txn_id, degree in in_degree.items() if degree > 0)
        raise NotSerializable(f"conflict graph has a cycle among transactions {stuck[:10]}")
    return order


def replay(
    history: Sequence[CommittedTxn],
    db: Database,
    registry: ProcedureRegistry,
    outcomes: Sequence[Sequence[Outcome]],
) -> None:
    """Run the history serially, in conflict order, batch by batch, on ``db``.

    ``db`` must hold the state the recorded run started from and ``outcomes`` that run's
    outcomes per batch. The history must hold exactly the transactions whose outcome is
    COMMITTED or a logic abort (ABORTED, not a give-up), each marked as such; each replayed
    outcome must equal the recorded one, so a logic abort aborts at its place in the serial
    order with the same reason, and a committed transaction commits with the same result.
    Afterwards ``db`` should equal the recorded run's final state (the caller compares).

    Raises:
        NotSerializable: the conflict graph has a cycle, the history misses or misfiles a
            transaction, or a replayed outcome differs.
    """
    _check_complete(history, outcomes)
    serial = SerialProtocol(db, registry)
    by_batch: dict[int, list[CommittedTxn]] = defaultdict(list)
    for txn in serial_order(history):
        by_batch[txn.batch].append(txn)
    for batch_no in range(len(outcomes)):
        txns = by_batch.get(batch_no, [])
        replayed = serial.run_batch([txn.request for txn in txns])
        for txn, outcome in zip(txns, replayed, strict=True):
            recorded = outcomes[batch_no][txn.index]
            if outcome != recorded:
                raise NotSerializable(
                    f"replay of transaction {txn.txn_id} gave {outcome!r}, recorded {recorded!r}"
                )


def _check_complete(history: Sequence[CommittedTxn], outcomes: Sequence[Sequence[Outcome]]) -> None:
    """The history holds exactly the committed and logic-aborted transactions, each marked as
    its outcome says (a give-up or an error is not in it).

    Raises:
        NotSerializable: naming the first transaction missing, misfiled or recorded twice.
    """
    recorded: dict[TxnId, bool] = {}
    for txn in history:
        if txn.txn_id in recorded:
            raise NotSerializable(f"transaction {txn.txn_id} is in the history twice")
        recorded[txn.txn_id] = txn.aborted
    kept = {None: "not in it", True: "as logic-aborted", False: "as committed"}
    for batch_no, batch in enumerate(outcomes):
        for index, outcome in enumerate(batch):
            if outcome.status is Status.COMMITTED:
                expected: bool | None = False
            elif outcome.status is Status.ABORTED and not outcome.gave_up:
                expected = True
            else:
                expected = None  # undone (a give-up) or an error: nothing to replay
            found = recorded.pop((batch_no, index), None)
            if found is False and result_raised(outcome):
                continue  # committed, then its result builder raised: replayed as committed
            if found is not expected:
                raise NotSerializable(
                    f"transaction {(batch_no, index)} ended {outcome.status.value} "
                    f"({outcome.reason or 'no reason'}) but the history has it {kept[found]}"
                )
    if recorded:
        raise NotSerializable(
            f"the history holds transactions never answered: {sorted(recorded)[:10]}"
        )
