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
    PieceContext,
    PlannedTxn,
    ProcedureRegistry,
    Protocol,
    TxnRequest,
    plan_batch,
    run_piece,
)
from dgcc.storage import Database

__all__ = ["CalvinProtocol"]

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
        queues, wants = self._request_locks(txns)
        locked_s = time.perf_counter()
        pending = [len(keys) for keys in wants]  # locks not yet granted, per transaction
        ready = [position for position, count in enumerate(pending) if count == 0]  # no keys
        for queue in queues.values():
            ready.extend(queue.grant_next(pending))
        heapq.heapify(ready)
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
                for now_ready in queues[key].release(pending):
                    heapq.heappush(ready, now_ready)
        assert done == len(txns), (
            f"{done} of {len(txns)} transactions ran: a lock was never granted"
        )
        self.stats["timing_s/plan"] += planned_s - started_s
        self.stats["timing_s/lock"] += locked_s - planned_s
        self.stats["timing_s/execute"] += time.perf_counter() - locked_s
        return [item.outcome() if isinstance(item, PlannedTxn) else item for item in planned]

    def _request_locks(
        self, txns: list[PlannedTxn]
    ) -> tuple[dict[Key, _KeyQueue], list[list[Key]]]:
        """Per key, its FIFO of requests in batch order; per transaction, its keys."""
        queues: dict[Key, _KeyQueue] = {}
        wants: list[list[Key]] = []
        for position, txn in enumerate(txns):
            modes: dict[Key, bool] = {}
            for piece in txn.pieces:
                for key in piece.reads:
                    modes.setdefault(key, False)
                for key in piece.writes:
                    modes[key] = True
            for key, exclusive in modes.items():
                queue = queues.get(key)
                if queue is None:
                    queue = queues[key] = _KeyQueue()
                queue.requests.append((position, exclusive))
            wants.append(list(modes))
            self.stats["calvin/lock_requests"] += len(modes)
        return queues, wants


class _KeyQueue:
    """One key's lock requests in batch order; holders are granted a group at a time.

    A group is one exclusive request, or a maximal run of shared ones. All requests are queued
    before any is granted, so each is granted exactly once, in order.
    """

    __slots__ = ("holding", "next", "requests")

    def __init__(self) -> None:
        self.requests: list[tuple[int, bool]] = []
        self.next = 0  # first request not yet granted
        self.holding = 0  # granted requests not yet released

    def grant_next(self, pending: list[int]) -> list[int]:
        """Grant the next group; return the transactions that now hold all their locks."""
        assert self.holding == 0
        requests, ready = self.requests, []
        while self.next < len(requests):
            position, exclusive = requests[self.next]
            if exclusive and self.holding:
                break
            self.next += 1
            self.holding += 1
            pending[position] -= 1
            if pending[position] == 0:
                ready.append(position)
            if exclusive:
                break
        return ready

    def release(self, pending: list[int]) -> list[int]:
        """One holder is done; once all are, grant the next group."""
        self.holding -= 1
        return self.grant_next(pending) if self.holding == 0 else []
