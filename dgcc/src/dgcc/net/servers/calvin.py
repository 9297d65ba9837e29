"""A Calvin node: deterministic order per epoch, a deterministic lock manager, no 2PC.

Calvin (Thomson et al., SIGMOD 2012) sequences calls into epochs and agrees on one global
order; each node's lock manager then grants a transaction all of its locks on the node's
records in that order, and the transaction holds them until its work at the node is done. A
multi-partition transaction, at each participant, reads its local records, sends the reads to
the other participants and, where it writes (an active participant), waits until it has the
reads of every other participant before it finishes; only then are its locks released. So a
distributed transaction holds its locks across a network message, and every later conflicting
transaction on that node waits behind it. Execution is deterministic, so no two-phase commit
is needed.

This node shares the sequencing (each node's epoch batch, global order (epoch, origin,
sequence)), the value messages and the reports with the DistDGCC node; the local schedule is
Calvin's:

  * Locks are per transaction: its lock set on this node is every key any of its pieces here
    reads or writes. Per-key FIFO queues (``LockQueue``) grant them in global order, and a
    transaction runs once it holds them all: its pieces here run together, as a Calvin worker
    runs a transaction's logic, up to the first that waits for a message, and it keeps its
    locks until its last piece here ran. A first pass meets the transactions in global order
    (those whose grants peers wait for, with every earlier one they conflict with, first);
    one that meets no held lock runs at once without queuing (nothing could wait behind
    it), as DistDGCC's node scans its pieces, and one that waits, or parks on a message,
    holds its requests in the queues.
  * A multi-node transaction gets a grant step per participant (``GRANT``), first among its
    pieces there: it runs once the transaction holds its locks there and stands for the
    participant's local reads being served; its value message goes to every other
    participant that writes. Each writing participant gets a release step (``RELEASE``),
    last among its pieces, that waits for the grants of all the other participants: the
    locks are held until every remote read has arrived, by real messages between the node
    processes.
  * A piece that needs another node's output (TPC-C NewOrder's order lines need the remote
    stock pieces' results) waits for that value message; the stock piece runs as soon as its
    node grants the locks, so its output leaves with that node's grant, as Calvin forwards
    the reads. A piece that writes runs before the remote reads arrive where it needs none
    of them: the locks it holds keep every other transaction from seeing the write until the
    release, so the schedule is Calvin's. Writes still wait for any other node's abort
    decision, as in DistDGCC.

Durability is Calvin's input logging with group commit: with a data dir, each node logs per
epoch the block a DistDGCC node logs (the inputs in global order, plus the values it received,
so it can also replay alone), and an epoch's clients are answered once every node has made
it durable. A restart replays the blocks with this epoch run (``LoggedCalvinEpochRun``).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from typing import Any

from dgcc import debug
from dgcc.api import Piece, PieceContext, PlannedTxn, run_piece
from dgcc.net.node import Node
from dgcc.protocols.calvin import LockQueue, lock_modes
from dgcc.protocols.dgcc import Graph, _check_graph
from dgcc.protocols.dist_dgcc import SOLO, EpochRun, _check_turn
from dgcc.wal.node_log import LoggedEpochRun

__all__ = [
    "GRANT",
    "RELEASE",
    "STEP",
    "CalvinEpochRun",
    "CalvinNode",
    "LoggedCalvinEpochRun",
    "lock_graph",
]

STEP = "calvin."  # the prefix of the steps Calvin adds to a plan (no procedure names one so)
GRANT = STEP + "grant@"  # + node id: a participant holds its locks; its reads leave
RELEASE = STEP + "release@"  # + node id: a writing participant has every remote read


def _step(ctx: PieceContext) -> None:
    """A grant or release step: scheduling only (the reads travel in the value message)."""
    return None


def lock_graph(txns: Sequence[PlannedTxn]) -> Graph:
    """Calvin's lock order of ``txns`` (in global order, each with its pieces on this node)
    as a piece graph: a transaction's pieces form a chain, and its first piece waits for the
    last piece of every earlier transaction holding a lock that conflicts with its lock set
    (shared for keys it only reads, exclusive for keys it writes). The debug checks hold
    ``CalvinEpochRun``'s schedule to it.
    """
    pieces: list[Piece] = []
    owners: list[int] = []
    successors: dict[int, list[int]] = {}
    in_degrees: list[int] = []
    exclusive: dict[Hashable, int] = {}  # key -> last piece of its latest exclusive holder
    shared: dict[Hashable, list[int]] = {}  # key -> last pieces of shared holders since then
    for slot, txn in enumerate(txns):
        local = txn.pieces
        if not local:
            continue
        first = len(pieces)
        last = first + len(local) - 1
        preds: set[int] = set()
        for key, writes in lock_modes(local).items():
            holder = exclusive.get(key)
            if holder is not None:
                preds.add(holder)
            if writes:  # exclusive: after the last writer and every reader since
                preds.update(shared.pop(key, ()))
                exclusive[key] = last
            else:  # shared: after the last writer
                shared.setdefault(key, []).append(last)
        pieces.extend(local)
        owners.extend([slot] * len(local))
        in_degrees.append(len(preds))
        in_degrees.extend([1] * (len(local) - 1))  # each later piece after the one before
        for pred in preds:
            successors.setdefault(pred, []).append(first)
        for pid in range(first, last):
            successors.setdefault(pid, []).append(pid + 1)
    graph = Graph(pieces, owners, successors, in_degrees, sum(in_degrees))
    if debug.check_invariants:
        _check_graph(graph)
    return graph


class CalvinEpochRun(EpochRun):
    """A DistDGCC epoch run with Calvin's lock manager and read exchange (module docstring).

    The scans visit transactions (slots), not pieces; ``step`` may pass its budget by the rest
    of one transaction, whose pieces here run together.
    """

    def _placement_of(
        self, planned: PlannedTxn, routed: frozenset[int] | None
    ) -> list[tuple[int, ...]]:
        """DistDGCC's placement, plus a grant step per participant of a multi-node txn and a
        release step per participant that writes.

        The steps go after the procedure's pieces, so piece indices (in value messages and
        abort decisions) stay those of the plan; ``_build`` runs the grant first.
        """
        runs_on = super()._placement_of(planned, routed)
        participants = sorted({node for nodes in runs_on for node in nodes})
        if len(participants) < 2:
            return runs_on
        writers = {
            node
            for piece, nodes in zip(planned.pieces, runs_on, strict=True)
            if piece.writes
            for node in nodes
        }
        grants = [f"{GRANT}{node}" for node in participants]
        steps = [Piece(name, _step) for name in grants]
        releases = [node for node in participants if node in writers]
        for node in releases:  # each waits for every other participant's grant
            others = tuple(grant for grant in grants if grant != f"{GRANT}{node}")
            steps.append(Piece(f"{RELEASE}{node}", _step, after=others))
        planned.pieces = [*planned.pieces, *steps]
        return [*runs_on, *(SOLO[node] for node in participants + releases)]

    def _build(self) -> None:
        """Each multi-node transaction's grant step first among its pieces here."""
        for sub in self._subs:
            local, pieces = sub.local, sub.txn.pieces
            if sub.runs_on is None or not pieces[local[-1]].name.startswith(STEP):
                continue  # all here (checked runs place single-node transactions too)
            grant = local[-2] if pieces[local[-1]].name.startswith(RELEASE) else local[-1]
            assert pieces[grant].name == f"{GRANT}{self.node}", pieces[grant].name
            sub.local = [grant, *(k for k in local if k != grant)]
        super()._build()

    def local_graph(self, txns: list[PlannedTxn]) -> Graph:
        return lock_graph(txns)

    def _schedule(self) -> None:
        """Calvin's lock manager, and the first pass over the transactions: those whose grants
        peers wait for, with every earlier one holding a conflicting lock (``_ancestry``),
        then the rest. Conflicting transactions meet in every queue in global order: a later
        one in the first part conflicts with no earlier one in the rest."""
        count = len(self._subs)
        starts = [0]  # slot -> its first pid; one more: the end
        for sub in self._subs:
            starts.append(starts[-1] + len(sub.local))
        self._starts = starts
        self._resume = starts[:-1]  # slot -> its next piece to run
        self._modes: list[dict[Hashable, bool] | None] = [None] * count  # its locks, lazily
        self._parked = bytearray(count)  # slot -> holds its locks and waits for a value
        self._waits = [0] * count  # slot -> its locks not yet granted
        self._queued = bytearray(count)  # slot -> whether its requests are in the table
        self._table: dict[Hashable, LockQueue] = {}  # key -> its requests (while any)
        self._ready: list[int] = []  # heap of runnable slots, urgent ones (+0) first (+count)
        self._first_pass(count)

    def _lock_modes(self, slot: int) -> dict[Hashable, bool]:
        modes = self._modes[slot]
        if modes is None:
            starts = self._starts
            modes = self._modes[slot] = lock_modes(self._pieces[starts[slot] : starts[slot + 1]])
        return modes

    def _ancestry(self) -> list[int]:
        """Transactions that send values, and every earlier one whose locks conflict with one
        found (a backward scan from the last sender); in serial order."""
        owners, lock_modes_of = self._owners, self._lock_modes
        seeds = {owners[pid] for pid in self._sends}
        found: list[int] = []
        written: set[Hashable] = set()  # keys the transactions found write
        accessed: set[Hashable] = set()  # keys they read or write
        for slot in range(max(seeds), -1, -1):
            modes = lock_modes_of(slot)
            if slot not in seeds:
                for key, exclusive in modes.items():
                    if key in written or (exclusive and key in accessed):
                        break
                else:
                    continue
            found.append(slot)
            for key, exclusive in modes.items():
                accessed.add(key)
                if exclusive:
                    written.add(key)
        found.reverse()
        return found

    @property
    def has_ready(self) -> bool:
        return bool(self._ready) or not self._initial.done

    def _run_pieces(self, budget: int) -> int:
        """Ready transactions (their locks granted or values come), oldest first among those
        peers wait on and then among the others; then the first pass's next transaction,
        which runs at once when no queued request conflicts with its locks, and queues them
        otherwise. Returns early once values are due to peers, past the pass's first part."""
        initial, ready = self._initial, self._ready
        count = len(self._subs)
        ran = 0
        while ran < budget:
            if ready:
                slot = heapq.heappop(ready)
                slot = slot - count if slot >= count else slot
            elif not initial.done:
                slot = initial.pids[initial.position]
                initial.position += 1
                if self._table and self._queue(slot):
                    if self.outbox and initial.position == initial.urgent_end:
                        break  # the first part's values leave now
                    continue
            else:
                break
            ran += self._run_slot(slot)
            if self.outbox and initial.position >= initial.urgent_end:
                break  # peers wait on these values: they leave before the local-only pieces
        return ran

    def _queue(self, slot: int) -> bool:
        """Queue ``slot``'s lock requests if one would wait; returns whether it waits."""
        table = self._table
        for key, exclusive in self._lock_modes(slot).items():
            queue = table.get(key)
            if queue is not None and not queue.grantable(exclusive):
                break
        else:
            return False
        self._waits[slot] = self._request(slot)
        return True

    def _request(self, slot: int) -> int:
        """Queue every lock request of ``slot``; returns how many wait."""
        table, waits = self._table, 0
        for key, exclusive in self._lock_modes(slot).items():
            queue = table.get(key)
            if queue is None:
                queue = table[key] = LockQueue()
            waits += not queue.request(slot, exclusive)
        self._queued[slot] = 1
        return waits

    def _run_slot(self, slot: int) -> int:
        """Run ``slot``'s pieces here up to the first that waits for a value; returns how many
        ran. Once all ran it releases its locks; otherwise it holds them, parked."""
        pieces, cross_in, subs = self._pieces, self._cross_in, self._subs
        failed, check = self._failed, self._check
        sends_of = self._sends.get if slot in self._ancestors else None  # (every sender is)
        pid = begin = self._resume[slot]
        end = self._starts[slot + 1]
        txn, ctx = self._txns[slot], self._contexts[slot]
        while pid < end and not cross_in[pid]:
            if check is not None:
                _check_turn(check, pid)
            if failed and pid in failed and txn.error is None:
                txn.error = failed[pid]
            if txn.abort_reason is None:
                run_piece(ctx, txn, pieces[pid])
                if txn.abort_reason is not None:
                    subs[slot].local_abort = (self._piece_index[pid], txn.abort_reason)
            if txn.error is not None:
                self._note_error(slot, pid)
            if sends_of is not None and (targets := sends_of(pid)) is not None:
                self._post(subs[slot], self._piece_index[pid], targets)
            pid += 1
        self._resume[slot] = pid
        if pid < end:  # waits for a value, holding its locks
            self._parked[slot] = 1
            if not self._queued[slot]:  # it ran as no request conflicted: all are granted now
                waiting = self._request(slot)
                assert not waiting, f"slot {slot} ran without {waiting} of its locks"
        elif self._queued[slot]:
            self._release(slot)
        return pid - begin

    def _release(self, slot: int) -> None:
        table, waits, resume, cross_in = self._table, self._waits, self._resume, self._cross_in
        for key in self._lock_modes(slot):
            queue = table[key]
            for granted in queue.release():
                waits[granted] -= 1
                if not waits[granted]:
                    if cross_in[resume[granted]]:
                        self._parked[granted] = 1
                    else:
                        self._make_ready(granted)
            if queue.idle:
                del table[key]

    def _make_ready(self, slot: int) -> None:
        self._parked[slot] = 0
        heapq.heappush(self._ready, slot if slot in self._ancestors else slot + len(self._subs))

    def deliver(self, entries: Sequence[Sequence[Any]]) -> None:
        """DistDGCC's delivery; a parked transaction whose next piece it frees is ready."""
        waiters = self._waiters
        pids = [pid for entry in entries for pid in waiters.get(tuple(entry[:2]), ())]
        super().deliver(entries)
        owners, parked, resume, cross_in = self._owners, self._parked, self._resume, self._cross_in
        for pid in pids:
            slot = owners[pid]
            if parked[slot] and resume[slot] == pid and not cross_in[pid]:
                self._make_ready(slot)

    def reports(self) -> dict[int, list[Any]]:
        """DistDGCC's reports without the grant and release steps' (empty) outputs."""
        if self._check is not None:
            assert not self._table, f"locks still held or queued: {list(self._table)[:5]}"
            assert not self._ready and not any(self._parked), "transactions left to run"
        for sub in self._subs:
            if sub.runs_on is not None:
                outputs = sub.txn.outputs
                for name in [name for name in outputs if name.startswith(STEP)]:
                    del outputs[name]
        return super().reports()


class LoggedCalvinEpochRun(LoggedEpochRun, CalvinEpochRun):
    """Calvin's epoch run keeping its inputs and received values for the epoch's log block."""


class CalvinNode(Node):
    """A DistDGCC node with Calvin's epoch run (and, with a data dir, its input log)."""

    epoch_run = CalvinEpochRun
    logged_epoch_run = LoggedCalvinEpochRun
