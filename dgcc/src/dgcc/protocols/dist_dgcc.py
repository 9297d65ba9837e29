"""DistDGCC: one epoch of dependency-graph execution split across nodes (Yao et al. 2018).

This module is the protocol logic only; ``dgcc.net.node`` moves its messages. Per epoch:

  * Global order. Every node contributes its collected calls as one input batch; the global
    order is (epoch, origin node, sequence), so no sequencer or lock manager is needed.
  * Routing. A node plans only the transactions it takes part in. ``Router.route``
    (``dist_placement``) maps a request's parameters to the nodes owning its data, through
    the workload's ``route_keys`` (TPC-C by warehouse, YCSB by key, Smallbank by customer);
    a request it cannot route is planned by every node, which then agree on the plan or on
    the planning error (a ``BadParams``, or pieces that break the placement rules below, fail
    the call alone; a plan of a call several nodes plan that raises anything else stops the
    node, since its peers may not agree). An origin routes each of its calls once
    (``Router.routes``): the routes that pick what each peer gets are kept for its own
    planning of the epoch. Planning against rows another node owns is only sound for columns
    no transaction writes (TPC-C's W_NAME, C_LAST ...): a node holds its own partitions, the
    replicated rows and the whole of the workload's ``plan_tables`` (the tables plans read on
    any participant); the rows of those it does not own are a frozen load-time snapshot used
    for exactly those plan-time reads, never written and never dumped (``keep_owned``).
    TPC-C's by-last-name customer needs no remote resolution: the plan only checks that the
    name exists (C_LAST never changes), and the piece that picks the customer runs on the
    customer's node under the district key that guards the name index.
  * Splitting. Each piece runs on the node owning its conflict keys (all of a piece's keys
    must lie in one partition); a piece touching only replicated keys (TPC-C's ITEM) must not
    write and runs on every participant, so its output and abort decision cost no message.
  * Local graph. DGCC's piece-level dependency graph orders the node's own pieces (temporal
    edges are complete, since a key's pieces all live on its owner); cross-node edges
    (``after`` values and abort decisions) are waits that a value message ends, and an
    executor never waits on one: it runs whatever else is ready. The graph itself is not
    built: serial order is a topological order of it, so a node runs its pieces in one pass
    in that order (senders of values and their local ancestors first), leaving pending only
    the pieces with a path from a cross-node edge (a few percent of a TPC-C epoch, none of
    YCSB's independent accesses), found by the keys of the pieces already pending (and,
    conservatively, every later piece of a transaction with a pending one); passes over
    those run them as values come. (A graph over the pending pieces, as the first
    version built, cost more than the rest of the schedule together.)
  * Results. Each node reports, per origin, the outputs it produced and the abort decisions
    it took; the origin assembles outcomes (``dist_results``) once every node reported the
    epoch, and answers them once every node has also made the epoch durable when the cluster
    logs (``dgcc.wal.node_log``). Execution is deterministic, so there is no two-phase commit.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dgcc import debug
from dgcc.api import (
    Outcome,
    Piece,
    PieceContext,
    PlannedTxn,
    ProcedureRegistry,
    TxnRequest,
    plan_batch,
    run_piece,
)
from dgcc.errors import ProcedureError
from dgcc.protocols.dgcc import Graph, build_graph
from dgcc.protocols.dist_placement import NODES_MAX, REPLICATED, Router, solo_route_checked
from dgcc.protocols.dist_results import ReportEntry
from dgcc.storage import Database

__all__ = ["EpochRun"]

# A value message entry: (global txn index, piece index, output, abort reason, error).
ValueEntry = tuple[int, int, Any, str | None, str | None]

# Passes over an epoch run's pending pieces that are due (``EpochRun._next_rescan``): none, one
# over all of them, or first one over the pending ancestors of senders (values came).
_NONE, _ALL, _SENDERS_FIRST = 0, 1, 2
SOLO = tuple((node,) for node in range(NODES_MAX))  # the nodes running a single-node piece


@dataclass(slots=True)
class _SubTxn:
    """This node's share of one transaction of the epoch."""

    index: int  # position in the global batch
    origin: int
    slot: int  # position in the origin's batch
    txn: PlannedTxn
    runs_on: list[tuple[int, ...]] | None  # piece index -> nodes running it; None: only here
    local: Sequence[int]  # piece indices run here (a range when all of them)
    local_abort: tuple[int, str] | None = None
    local_error: tuple[int, str] | None = None  # (piece index, error) of its first failure here


@dataclass(slots=True)
class _Scan:
    """A pass over pieces (``EpochRun._scan``): those that can run do, the others stay pending
    and hold back every later piece with a path from one of them. (Calvin's node makes one
    first pass over transactions with it: ``pids`` then holds slots.)"""

    pids: Sequence[int]  # the pieces to visit, in serial order (see ``EpochRun._scan``)
    urgent_end: int = 0  # the senders' part ends here: the values leave before the rest runs
    only: set[int] | None = None  # run only these (the others stay pending)
    position: int = 0
    pending: list[int] = field(default_factory=list)  # visited, not run
    wrote: set[Hashable] = field(default_factory=set)  # keys the pending pieces write
    read: set[Hashable] = field(default_factory=set)  # keys the pending pieces read
    slots: set[int] = field(default_factory=set)  # transactions with a pending piece

    @property
    def done(self) -> bool:
        return self.position == len(self.pids)


class EpochRun:
    """One node's execution of one epoch; driven by ``step`` and ``deliver``.

    Args:
        node: this node's id.
        db: this node's database (owned rows are current; see the module docstring).
        registry: the procedures.
        router: key and request routing.
        batches: the epoch's input batches, one per origin node, in node order; None stands
            for another origin's call whose route leaves this node out (it keeps its index).
    """

    abort_edges = True  # only the canary test turns cross-node abort edges off

    def __init__(
        self,
        node: int,
        db: Database,
        registry: ProcedureRegistry,
        router: Router,
        batches: Sequence[Sequence[TxnRequest | None]],
    ) -> None:
        nodes = router.placement.nodes
        assert len(batches) == nodes, f"{len(batches)} input batches for {nodes} nodes"
        self.node = node
        self.router = router
        self._db = db
        self.outbox: dict[int, list[ValueEntry]] = {}
        self.multi_node_by_origin = [0] * nodes
        self._subs: list[_SubTxn] = []
        self._errors: list[tuple[int, int, str]] = []  # (origin, slot, error) of planning
        self._plan(db, registry, batches)
        self._build()

    # -- planning and the local graph ------------------------------------------------------

    def _plan(
        self,
        db: Database,
        registry: ProcedureRegistry,
        batches: Sequence[Sequence[TxnRequest | None]],
    ) -> None:
        mine: list[tuple[int, int, int, frozenset[int] | None]] = []
        solo_route = frozenset({self.node})
        requests: list[TxnRequest] = []
        index = 0
        for origin, batch in enumerate(batches):
            for slot, (request, routed) in enumerate(
                zip(batch, self.router.routes(batch, keep=False), strict=True)
            ):
                if request is None:  # another origin's call this node neither plans nor runs
                    index += 1
                    continue
                if routed is not None and len(routed) > 1:
                    self.multi_node_by_origin[origin] += 1
                if routed is None or self.node in routed:
                    mine.append((index, origin, slot, routed))
                    requests.append(request)
                index += 1
        several = self.router.placement.nodes > 1  # else this node alone plans every call

        def shared(i: int) -> bool:  # call i is planned on other nodes too
            routed = mine[i][3]
            return several and (routed is None or len(routed) > 1)

        for (index, origin, slot, routed), planned in zip(
            mine, plan_batch(registry, db, requests, shared), strict=True
        ):
            if isinstance(planned, Outcome):
                self._errors.append((origin, slot, planned.reason))
                continue
            if routed == solo_route and not debug.check_invariants:
                # The common case: the whole transaction is here; no placement, no messages.
                # A sample of these calls checks that their pieces stay here.
                if solo_route_checked(slot):
                    try:
                        self._placement_of(planned, routed)
                    except ProcedureError as error:
                        self._errors.append((origin, slot, str(error)))
                        continue
                local = range(len(planned.pieces))  # no list per transaction
                self._subs.append(_SubTxn(index, origin, slot, planned, None, local))
                continue
            try:
                runs_on = self._placement_of(planned, routed)
            except ProcedureError as error:  # each node planning the call places it alike
                self._errors.append((origin, slot, str(error)))
                continue
            local = [k for k, nodes in enumerate(runs_on) if self.node in nodes]
            if local:
                self._subs.append(_SubTxn(index, origin, slot, planned, runs_on, local))

    def _placement_of(
        self, planned: PlannedTxn, routed: frozenset[int] | None
    ) -> list[tuple[int, ...]]:
        """Piece index -> the nodes that run it (one owner, or every participant).

        Raises:
            ProcedureError: a piece spans nodes or writes replicated keys, or the pieces lie
                outside the call's route (``_plan`` fails the call alone).
        """
        owners: list[int] = []
        node_of_key, nodes_of = self.router.node_of_key, self.router.nodes_of
        for piece in planned.pieces:
            reads, writes = piece.reads, piece.writes
            keys = reads + writes if reads and writes else reads or writes
            if len(keys) == 1:  # most pieces: one key, no set to build
                owner = node_of_key(keys[0])
            else:
                nodes = nodes_of(keys)
                nodes.discard(REPLICATED)
                if len(nodes) > 1:
                    raise ProcedureError(
                        f"{planned.procedure.name}: piece {piece.name!r} spans nodes "
                        f"{sorted(nodes)}"
                    )
                owner = nodes.pop() if nodes else REPLICATED
            if owner == REPLICATED and piece.writes:
                raise ProcedureError(
                    f"{planned.procedure.name}: piece {piece.name!r} writes replicated keys"
                )
            owners.append(owner)
        participants = tuple(sorted({n for n in owners if n != REPLICATED}))
        if not participants:
            participants = (min(routed) if routed else 0,)
        if routed is not None and not set(participants) <= routed:
            raise ProcedureError(
                f"{planned.procedure.name}: pieces on nodes {list(participants)} but the route "
                f"gave {sorted(routed)} (params {dict(planned.params)}): the workload's "
                "route_keys must name every partition the pieces touch"
            )
        solo = SOLO  # one tuple per node, shared: ``_cross_edges`` compares by identity
        return [participants if n == REPLICATED else solo[n] for n in owners]

    def _build(self) -> None:
        """This node's pieces in serial order, their cross-node edges, and their schedule.

        DistDGCC builds no graph for its pieces: they run in serial order in one pass
        (``_scan``), which leaves pending every piece that waits for another node's value and
        every later piece with a path from a pending one in the local graph (a conflicting
        access, or, conservatively, a later piece of its transaction), decided by the keys of
        the pending pieces alone. Pending pieces run in later passes over them, as values free
        them. The pieces whose values peers wait for, with their local ancestors
        (``_ancestry``), head the pass, so values leave early (``_schedule``; Calvin's node
        scans whole transactions instead). With ``debug.check_invariants`` the whole local
        graph is also built, and every piece checks it before it runs.
        """
        pieces: list[Piece] = []
        piece_index: list[int] = []  # pid -> index of the piece in its transaction's plan
        spread: list[tuple[_SubTxn, int]] = []  # (sub, its first local pid) of multi-node txns
        for sub in self._subs:
            if sub.runs_on is None:
                pieces.extend(sub.txn.pieces)
            else:
                spread.append((sub, len(pieces)))
                txn_pieces = sub.txn.pieces
                pieces.extend([txn_pieces[k] for k in sub.local])
            piece_index.extend(sub.local)
        self._pieces, self._piece_index = pieces, piece_index
        self._txns = [sub.txn for sub in self._subs]  # per owner slot, for ``step``
        self._contexts = [PieceContext(self._db, txn) for txn in self._txns]
        self._waiters: dict[tuple[int, int], list[int]] = {}
        self._failed: dict[int, str] = {}  # pid -> the error of a value it waited on
        self._sends: dict[int, tuple[int, ...]] = {}
        self._urgent_pids: set[int] = set()  # local pieces of txns other nodes wait on
        self._sub_of_index = {sub.index: sub for sub, _ in spread}  # values come for these
        self._cross_in = cross_in = [0] * len(pieces)  # pid -> its predecessors elsewhere
        for sub, base in spread:
            self._cross_edges(sub, base, cross_in)
        self.remaining = len(pieces)
        self._check: Graph | None = None  # the whole local graph, to check the schedule
        if debug.check_invariants:
            self._check = self.local_graph(self._views())
        self._rescan: _Scan | None = None  # a pass over the pending pieces, once one started
        self._dirty = _NONE  # which passes over the pending pieces are due (values came)
        self._owners: list[int] = []  # pid -> slot of its transaction in ``self._subs``
        for slot, sub in enumerate(self._subs):
            self._owners.extend([slot] * len(sub.local))
        self._schedule()

    def _schedule(self) -> None:
        """The first pass over the pieces (``_first_pass``)."""
        self._first_pass(len(self._pieces))

    def _first_pass(self, count: int) -> None:
        """The first pass over ``count`` units (pieces; Calvin's node: transactions): the
        senders and their ancestors (``_ancestry``), then the rest, each part in serial order."""
        self._ancestors: set[int] = set()  # senders and their ancestors
        if not self._sends:
            self._initial = _Scan(range(count))
            return
        first = self._ancestry()
        self._ancestors = ancestors = set(first)
        rest = itertools.filterfalse(ancestors.__contains__, range(count))
        self._initial = _Scan(first + list(rest), urgent_end=len(first))

    def _ancestry(self) -> list[int]:
        """Pieces of transactions that send values, and every piece with a path to one in the
        local graph (a backward scan from the last of them): an earlier access conflicting
        with one, and every earlier piece of its own transaction (not only those it names in
        ``after`` or that may abort before it: a transaction's pieces then run in serial order
        in every pass, so a call that fails midway leaves the same writes live and in a
        replay, which runs the pieces in another order); in serial order."""
        found: list[int] = []
        before_all: set[Hashable] = set()  # keys every earlier access of which is an ancestor
        before_writes: set[Hashable] = set()  # keys whose earlier writes are ancestors
        seeds, owners, pieces = self._urgent_pids, self._owners, self._pieces
        slot = -1  # the transaction of the last piece found (its pieces are consecutive)
        for pid in range(max(seeds, default=-1), -1, -1):
            piece = pieces[pid]
            writes = piece.writes
            if pid not in seeds and owners[pid] != slot:
                if len(writes) == 1 and not piece.reads:
                    if writes[0] not in before_all and writes[0] not in before_writes:
                        continue
                elif before_all.isdisjoint(piece.reads) and (
                    not writes
                    or (before_all.isdisjoint(writes) and before_writes.isdisjoint(writes))
                ):
                    continue
            found.append(pid)
            slot = owners[pid]
            before_all.update(writes)
            before_writes.update(piece.reads)
        found.reverse()
        return found

    def _views(self) -> list[PlannedTxn]:
        """This node's share of each transaction, as a graph sees it: only the pieces that
        run here, with the ``after`` names of the others (run elsewhere) dropped."""
        views: list[PlannedTxn] = []
        for sub in self._subs:
            txn = sub.txn
            if sub.runs_on is None or len(sub.local) == len(txn.pieces):
                views.append(txn)
                continue
            chosen = [txn.pieces[k] for k in sub.local]
            names = {piece.name for piece in chosen}
            view = [
                piece
                if all(name in names for name in piece.after)
                else Piece(
                    piece.name,
                    piece.run,
                    piece.reads,
                    piece.writes,
                    tuple([name for name in piece.after if name in names]),
                    piece.may_abort,
                )
                for piece in chosen
            ]
            # The graph reads only the pieces: fresh views, not dataclasses.replace (slow).
            views.append(PlannedTxn(txn.index, txn.procedure, txn.params, view))
        return views

    def _cross_edges(self, sub: _SubTxn, base: int, cross_in: list[int]) -> None:
        """Edges between this node's pieces of ``sub`` and pieces that run elsewhere."""
        pieces, runs_on, node = sub.txn.pieces, sub.runs_on, self.node
        local_pid = dict(zip(sub.local, range(base, base + len(sub.local))))
        position = {piece.name: k for k, piece in enumerate(pieces)}
        abort_edges = self.abort_edges
        deciders: tuple[int, ...] = ()  # the may_abort pieces so far
        sends: dict[int, set[int]] = {}
        for k, piece in enumerate(pieces):
            preds = deciders if abort_edges and (piece.writes or piece.may_abort) else ()
            if piece.after:
                preds = (*preds, *map(position.__getitem__, piece.after))
            if piece.may_abort:
                deciders = (*deciders, k)
            if not preds:
                continue
            nodes = runs_on[k]
            for pred in preds:
                pred_nodes = runs_on[pred]
                if pred_nodes is nodes:  # the same node(s): nothing crosses
                    continue
                if pred_nodes[0] == node:  # the lowest node running pred sends its value
                    targets = [n for n in nodes if n not in pred_nodes]
                    if targets:
                        sends.setdefault(pred, set()).update(targets)
                elif node in nodes and node not in pred_nodes:
                    pid = local_pid[k]
                    self._waiters.setdefault((sub.index, pred), []).append(pid)
                    cross_in[pid] += 1
        for pred, targets in sends.items():
            self._sends[local_pid[pred]] = tuple(sorted(targets))
            self._urgent_pids.update(local_pid.values())

    def local_graph(self, txns: list[PlannedTxn]) -> Graph:
        """The order of this node's pieces: DGCC's piece-level dependency graph."""
        return build_graph(txns)

    # -- execution -------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.remaining == 0

    @property
    def has_ready(self) -> bool:
        """Whether a piece can run now (otherwise this node waits for value messages)."""
        initial = self._initial
        return not initial.done or self._rescan is not None or bool(self._dirty and initial.pending)

    def step(self, budget: int) -> int:
        """Run up to ``budget`` ready pieces; returns how many ran.

        First the pass over every piece (``_scan``): senders and their ancestors, then the
        rest, in serial order. Then passes over the pieces it left pending, each once values
        came. A pending piece whose value a peer waits for runs as soon as a value frees it
        (a pass over the pending ancestors of senders), even before the first pass is over,
        once that pass is past its senders' part. Returns early once values are due to peers,
        so they leave before local-only pieces run. Zero with pieces remaining means this node
        waits for value messages.
        """
        ran = self._run_pieces(budget)
        self.remaining -= ran
        assert self.remaining >= 0, f"{self.remaining} pieces remaining"
        return ran

    def _run_pieces(self, budget: int) -> int:
        initial = self._initial
        ran = 0
        while ran < budget:
            scan = self._rescan
            if scan is None:
                scan = self._rescan = self._next_rescan()
            if scan is not None:
                ran += self._scan(scan, budget - ran)
                if scan.done:  # what it left pending is what is pending now
                    self._rescan = None
                    initial.pending = scan.pending
            elif not initial.done:
                ran += self._scan(initial, budget - ran)
                if initial.done and initial.pending:
                    initial.pending.sort()  # the senders' part and the rest, merged
                    self._dirty = max(self._dirty, _ALL)  # passes over it may have run some
            else:
                break
            if ran and self.outbox:
                break  # peers wait on these values: they leave before the local-only pieces
        return ran

    def _next_rescan(self) -> _Scan | None:
        """A pass over the pending pieces, if one could run any, once values came: over the
        senders' pending ancestors only first, then (once the first pass is over) over all."""
        initial = self._initial
        pending, dirty = initial.pending, self._dirty
        if not (dirty and pending):
            return None
        if dirty == _SENDERS_FIRST and initial.position >= initial.urgent_end:
            self._dirty = _ALL
            ancestors = self._ancestors
            if not ancestors.isdisjoint(pending):
                # All of it the senders' part: the values leave at its end, not one by one.
                return _Scan(pending, urgent_end=len(pending), only=ancestors)
        if not initial.done:
            return None
        self._dirty = _NONE
        return _Scan(pending)

    def _scan(self, scan: _Scan, budget: int) -> int:
        """Continue ``scan`` for up to ``budget`` runs; returns how many ran.

        A piece stays pending when it waits for a value, or a pending piece before it in the
        scan belongs to its transaction or conflicts with it (reads a key it writes, or writes
        a key it reads or writes): it has a path from a pending piece in the local graph. The
        scan's pieces are in serial order, or (``only``) its pieces to run are, and none of
        the others before one conflicts with it. Stops at the end of the scan's urgent part,
        and past it right after a piece whose value a peer waits for.
        """
        pieces, owners, txns, contexts = self._pieces, self._owners, self._txns, self._contexts
        cross_in, check, only, failed = self._cross_in, self._check, scan.only, self._failed
        pending, wrote, read, slots = scan.pending, scan.wrote, scan.read, scan.slots
        position, urgent_end = scan.position, scan.urgent_end
        stop = urgent_end if position < urgent_end else len(scan.pids)
        # Every sender is in the senders' part of the first pass: past it, no look-up.
        sends_of = None
        if self._sends and (position < urgent_end or scan is not self._initial):
            sends_of = self._sends.get
        ran = visited = 0
        for pid in scan.pids[position:stop]:
            visited += 1
            piece = pieces[pid]
            slot = owners[pid]
            if cross_in[pid] or (only is not None and pid not in only):
                hold = True
            elif not pending:
                hold = False
            elif slot in slots:
                hold = True
            else:
                writes = piece.writes
                if len(writes) == 1 and not piece.reads:  # most pieces: two look-ups
                    hold = writes[0] in wrote or writes[0] in read
                else:
                    hold = not wrote.isdisjoint(piece.reads) or (
                        bool(writes) and not (wrote.isdisjoint(writes) and read.isdisjoint(writes))
                    )
            if hold:
                pending.append(pid)
                slots.add(slot)
                read.update(piece.reads)
                wrote.update(piece.writes)
                continue
            if check is not None:
                _check_turn(check, pid)
            txn = txns[slot]
            if failed and pid in failed and txn.error is None:
                txn.error = failed[pid]
            if txn.abort_reason is None:
                run_piece(contexts[slot], txn, piece)
                if txn.abort_reason is not None:
                    self._subs[slot].local_abort = (self._piece_index[pid], txn.abort_reason)
            if txn.error is not None:
                self._note_error(slot, pid)
            ran += 1
            if sends_of is not None and (targets := sends_of(pid)) is not None:
                self._post(self._subs[slot], self._piece_index[pid], targets)
                if position + visited > urgent_end:
                    break
            if ran == budget:
                break
        scan.position = position + visited
        return ran

    def _note_error(self, slot: int, pid: int) -> None:
        """Keep where the transaction first failed here: the origin answers with the failure
        (abort or error) of the lowest piece index over every node, as a serial run does."""
        sub = self._subs[slot]
        if sub.local_error is None:
            sub.local_error = (self._piece_index[pid], sub.txn.error)

    def _post(self, sub: _SubTxn, piece_index: int, targets: tuple[int, ...]) -> None:
        txn = sub.txn
        output = txn.outputs.get(txn.pieces[piece_index].name)
        entry = (sub.index, piece_index, output, txn.abort_reason, txn.error)
        for target in targets:
            self.outbox.setdefault(target, []).append(entry)

    def piece_label(self, index: int, piece_index: int) -> str:
        """``procedure.piece`` of a piece of the epoch's multi-node call ``index``."""
        txn = self._sub_of_index[index].txn
        return f"{txn.procedure.name}.{txn.pieces[piece_index].name}"

    def take_outbox(self) -> dict[int, list[ValueEntry]]:
        """The value messages produced so far, per destination node (batched)."""
        outbox, self.outbox = self.outbox, {}
        return outbox

    def deliver(self, entries: Sequence[Sequence[Any]]) -> None:
        """Apply value entries from another node: outputs, abort decisions, errors.

        Raises:
            ProcedureError: an entry of the wrong shape, or one no piece here waits for (or
                twice in ``entries``); then none of them is applied.
        """
        keys = self._checked_keys(entries)
        self._dirty = _SENDERS_FIRST
        cross_in = self._cross_in
        sub_of_index, pop_waiters = self._sub_of_index, self._waiters.pop
        for key, (index, piece_index, output, reason, error) in zip(keys, entries, strict=True):
            waiters = pop_waiters(key)
            txn = sub_of_index[index].txn
            if error is not None:
                # The pieces waiting on this value fail the call when they come to run, not at
                # once: the call's pieces that do not wait on it run as they would had it come
                # later, so a replay (which delivers every value first) ends in the same state.
                for pid in waiters:
                    self._failed[pid] = error
            elif reason is not None and txn.abort_reason is None:
                txn.abort_reason = reason
            elif reason is None and error is None:
                txn.outputs[txn.pieces[piece_index].name] = output
            for pid in waiters:
                cross_in[pid] -= 1

    def _checked_keys(self, entries: Sequence[Sequence[Any]]) -> list[tuple[Any, Any]]:
        """Each entry's (txn index, piece index), once every entry has five fields and names
        a distinct value a piece here waits for (C-speed passes: every cross-node value of an
        epoch comes through here)."""
        if set(map(len, entries)) - {5}:
            short = next(entry for entry in entries if len(entry) != 5)
            raise ProcedureError(f"a value entry of {len(short)} fields, expected 5")
        keys = [(entry[0], entry[1]) for entry in entries]
        waiting = self._waiters
        if not all(map(waiting.__contains__, keys)) or len(set(keys)) != len(keys):
            seen: set[tuple[Any, Any]] = set()
            for key in keys:
                if key not in waiting or key in seen:
                    raise ProcedureError(f"unexpected value for txn {key[0]} piece {key[1]}")
                seen.add(key)
        return keys

    def reports(self) -> dict[int, list[ReportEntry]]:
        """Per origin node: this node's outputs, abort decisions and errors of its txns."""
        assert self.finished, f"{self.remaining} pieces still to run"
        if self._check is not None:
            assert not any(self._check.in_degrees), "pieces left with unmet dependencies"
            assert not self._initial.pending, f"pending pieces left: {self._initial.pending[:5]}"
            assert not self._waiters, f"values never received: {sorted(self._waiters)[:5]}"
        reports: dict[int, list[ReportEntry]] = {}
        for origin, slot, error in self._errors:  # planning: before any piece
            reports.setdefault(origin, []).append((slot, {}, None, (-1, error)))
        for sub in self._subs:
            txn = sub.txn
            outputs: dict[str, Any] = {}
            if sub.runs_on is None:
                outputs = txn.outputs
            elif sub.local_abort is None and txn.error is None:
                for k in sub.local:
                    name = txn.pieces[k].name
                    if sub.runs_on[k][0] == self.node and name in txn.outputs:
                        outputs[name] = txn.outputs[name]
            entry = (sub.slot, outputs, sub.local_abort, sub.local_error)
            reports.setdefault(sub.origin, []).append(entry)
        return reports


def _check_turn(graph: Graph, pid: int) -> None:
    """Piece ``pid`` is about to run: every local predecessor ran (``debug`` checks only)."""
    assert not graph.in_degrees[pid], f"piece {pid} would run before a local predecessor"
    for target in graph.successors.get(pid, ()):
        graph.in_degrees[target] -= 1
