"""Calvin: a deterministic lock manager that grants locks in batch order, then executes.

Before anything runs, each planned transaction requests, in batch order, every conflict key its
pieces declare (exclusive if any piece writes it, else shared) in that key's FIFO queue; keys
come from the plan's reconnaissance (Calvin's OLLP). A transaction runs, all pieces at once, when
it holds all of its locks: it is at the head of every queue, or shares the head run of shared
requests. Conflicting transactions thus run in batch order, so the result equals the serial
executor's whatever order the ready ones are picked in (seeded, to show it).

This engine is one process over one partition, so it has no multi-partition transactions and
no read exchange between participants: every transaction is local, takes all its locks before
it runs and holds them until it is done, which is the whole rule here. The cluster's Calvin
(``dgcc.net.servers.calvin``) adds the rest: participants of a multi-node transaction send their
reads, and one that writes waits for all of them while holding its locks.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Hashable, Sequence

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
from dgcc.storage import Database

__all__ = ["CalvinProtocol", "LockQueue", "lock_modes"]

Key = Hashable


class CalvinProtocol(Protocol):
    name = "calvin"
    deterministic = True

    def __init__(
        self, db: Database, registry: ProcedureRegistry, *, seed: int | None = None
    ) -> None:
        super().__init__(db, registry)
        self._rng = None if seed is None else random.Random(seed)
        self.stats: dict[str, float] = {
            "timing_s/plan": 0.0,
            "timing_s/lock": 0.0,
            "timing_s/execute": 0.0,
            "calvin/commits": 0,
            "calvin/lock_requests": 0,
        }

    def run_batch(self, batch: Sequence[TxnRequest]) -> list[Outcome]:
        started_s = time.perf_counter()
        planned = plan_batch(self.registry, self.db, batch)
        txns = [item for item in planned if isinstance(item, PlannedTxn)]
        planned_s = time.perf_counter()
        queues: dict[Key, LockQueue] = {}
        wants = [lock_modes(txn.pieces) for txn in txns]  # per transaction, its locks
        waits = [0] * len(txns)  # locks not yet granted, per transaction
        for position, modes in enumerate(wants):  # every request, in batch order
            for key, exclusive in modes.items():
                queue = queues.get(key)
                if queue is None:
                    queue = queues[key] = LockQueue()
                if not queue.request(position, exclusive):
                    waits[position] += 1
            self.stats["calvin/lock_requests"] += len(modes)
        ready = [position for position, count in enumerate(waits) if count == 0]
        locked_s = time.perf_counter()
        done = 0
        while ready:
            if self._rng is None:
                position = heapq.heappop(ready)
            else:  # any ready order gives the same result; a seeded one shows it
                position = ready.pop(self._rng.randrange(len(ready)))
            txn = txns[position]
            ctx = PieceContext(self.db, txn)
            for piece in txn.pieces:
                run_piece(ctx, txn, piece)
            if txn.abort_reason is None and txn.error is None:
                self.stats["calvin/commits"] += 1
            done += 1
            for key in wants[position]:
                for granted in queues[key].release():
                    waits[granted] -= 1
                    if not waits[granted]:
                        heapq.heappush(ready, granted)
        assert done == len(txns), (
            f"{done} of {len(txns)} transactions ran: a lock was never granted"
        )
        self.stats["timing_s/plan"] += planned_s - started_s
        self.stats["timing_s/lock"] += locked_s - planned_s
        self.stats["timing_s/execute"] += time.perf_counter() - locked_s
        return [item.outcome() if isinstance(item, PlannedTxn) else item for item in planned]


def lock_modes(pieces: Sequence[Piece]) -> dict[Key, bool]:
    """A transaction's locks: each key its pieces read or write, exclusive if one writes it."""
    modes: dict[Key, bool] = {}
    for piece in pieces:
        for key in piece.reads:
            modes.setdefault(key, False)
        for key in piece.writes:
            modes[key] = True
    return modes


class LockQueue:
    """One key's lock requests in arrival order, granted a group at a time: one exclusive
    request, or a run of shared ones; a request waits while any request before it does."""

    __slots__ = ("exclusive", "holding", "next", "requests")

    def __init__(self) -> None:
        self.requests: list[tuple[int, bool]] = []  # (owner, exclusive)
        self.next = 0  # first request not yet granted
        self.holding = 0  # granted requests not yet released
        self.exclusive = False  # the holders' mode

    def grantable(self, exclusive: bool) -> bool:
        """Whether a request in this mode would be granted at once."""
        return self.next == len(self.requests) and not (
            self.holding and (exclusive or self.exclusive)
        )

    def request(self, owner: int, exclusive: bool) -> bool:
        """Queue ``owner``'s request; returns whether it holds the lock now."""
        granted = self.grantable(exclusive)
        self.requests.append((owner, exclusive))
        if granted:
            self.next += 1
            self.holding += 1
            self.exclusive = exclusive
        return granted

    def release(self) -> list[int]:
        """One holder is done; once all are, grant the next group and return its owners."""
        self.holding -= 1
        if self.holding:
            return []
        requests, granted = self.requests, []
        while self.next < len(requests):
            owner, exclusive = requests[self.next]
            if exclusive and granted:
                break
            self.next += 1
            self.holding += 1
            self.exclusive = exclusive
            granted.append(owner)
            if exclusive:
                break
        return granted

    @property
    def idle(self) -> bool:
        """No request holds or waits."""
        return not self.holding and self.next == len(self.requests)
