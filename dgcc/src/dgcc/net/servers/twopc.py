"""A node of a 2PL (NO_WAIT, WAIT_DIE) or OCC cluster: coordinators, participants and 2PC.

It reuses ``Node``'s listening, handshake, peer connections, admin answers and stats, and
replaces the epochs with one coroutine per client call:

  * The node a client called coordinates the transaction when it owns some of the call's data;
    a call routed wholly to other nodes is forwarded to the first of them, which coordinates it
    and answers through the called node (a node holds only its partitions, the replicated rows
    and the workload's plan-time tables, so that is where the call's plan can read what it
    needs: TPC-C StockLevel reads its district's ORDER rows). The coordinator plans the call,
    then walks the pieces in order; each run of consecutive pieces owned by one node (a piece
    touching only replicated keys runs at the coordinator) executes there: locally, or by one
    ``pieces`` request carrying the inputs those pieces read. Many transactions are in flight
    per node and interleave whenever one waits on a peer or a lock, so conflicts really happen.
  * Each participant plans the call itself (a participant's plan reads only load-time
    columns, so every node gets the same pieces) and runs the pieces under its ``NodeCC`` as a
    ``Branch``.
  * A logic abort or procedure error ends the transaction; a concurrency-control abort (a lock
    conflict, a WAIT_DIE death, a failed OCC validation or a "no" vote) undoes every branch and
    restarts the transaction after a randomised exponential backoff, keeping its first-attempt
    timestamp (WAIT_DIE's age), up to ``ATTEMPTS_MAX`` attempts in all (the first included), after
    which it ends ABORTED with a ``retry:`` reason (a give-up, counted under ``txn/gave_up``, not
    ``txn/aborted``).
  * Commit: a transaction that ran only here commits locally; otherwise two-phase commit with
    the coordinator's own branch as one more participant: ``prepare`` to every branch, then
    ``commit`` if all voted yes, else ``abort``.

Durability (with a data dir, ``dgcc.wal.twopc_log``): each participant forces a prepare record
(its branch's after-images) before voting yes, the coordinator forces its commit decision
before sending commit, and participants append their commit records lazily; records are group
committed (one write and one fsync per flush for all records ready). A one-node transaction
appends one commit record with its images, releases its locks at once and is answered when
the record is on disk (early lock release: a later conflicting record follows it in the log,
so nothing depending on it can be durable before it). At a restart every node asks each
coordinator about its branches in doubt, redoes the committed branches' images, and opens a
new incarnation (part of every transaction id) before it takes calls.

Peer messages are ``(kind, request id, sender, body)`` with kinds ``req`` and ``rep``; they are
gathered per peer and written once per loop iteration. A lost peer stays lost until the
cluster restarts (a 2PC node does not rejoin running peers): calls that need it fail with an
ERROR naming it, the others go on.

With ``order_log`` on, every node keeps its committed branches and answers ``order`` with them:
``((called node, seq), procedure, params, reads, writes)`` per branch, enough to rebuild the
conflict graph (``protocols._history``); the pair names the call as its client sent it (the
transaction's timestamp carries it, also through a forward). The branches of logic-aborted
transactions are kept apart, in the same shape (no writes), in ``logic_aborted`` (on the node
object only: the ``order`` answer stays the committed history), so their aborts can be checked
against a serial replay too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Sequence
from typing import Any

from dgcc.api import (
    Outcome,
    PlannedTxn,
    Status,
    TxnRequest,
    committed_outcome,
    plan_batch,
    run_piece,
)
from dgcc.cluster import ClusterConfig
from dgcc.errors import ConfigError, brief
from dgcc.net.node import CALLS_WAITING_MAX, Node
from dgcc.net.servers.cc import PROTOCOLS, Branch, NodeCC, Timestamp
from dgcc.net.wire import FRAME_BODY_MAX, FrameError, frame, read_frame, unencodable
from dgcc.protocols.dist_placement import REPLICATED
from dgcc.wal.crashpoints import crashpoint
from dgcc.wal.node_log import node_directory
from dgcc.wal.twopc_log import TwoPhaseLog, TxnId

__all__ = ["TwoPhaseCommitNode"]

logger = logging.getLogger(__name__)

ATTEMPTS_MAX = 1000  # attempts per transaction, the first included: at most 999 retries
BACKOFF_S_MIN = 0.0002  # first retry waits up to this long; doubling per retry
BACKOFF_S_MAX = 0.002
RPC_TIMEOUT_S = 120.0
ABORTED_EARLY_MAX = 4096  # aborts of branches not (yet) here, remembered


class PeerLost(ConnectionError):
    """The link to the peer a request waits on is down (see ``TwoPhaseCommitNode._peer_lost``)."""


BranchId = tuple[int, int, int, int]  # (origin node, sequence, attempt, origin incarnation)


class TwoPhaseCommitNode(Node):
    """A node running ``config.protocol`` (``no_wait``, ``wait_die`` or ``occ``)."""

    def __init__(self, config: ClusterConfig, node_id: int) -> None:
        super().__init__(config, node_id)
        try:
            cc_class = self._open_log(config, node_id)
        except BaseException:  # a refused directory stays free for a corrected retry
            self.release_dir()
            raise
        self._incarnation = 0 if self.wal is None else self.wal.incarnation
        self._recovered = asyncio.Event()
        self.cc: NodeCC = cc_class(self.db)
        self._branches: dict[BranchId, Branch] = {}
        self._replies: dict[int, asyncio.Future] = {}
        self._awaiting: dict[int, set[int]] = {}  # peer -> ids of requests awaiting its reply
        self._running: set[BranchId] = set()  # branches whose pieces run now
        # ... whose coordinator was lost or aborted them meanwhile (why): ended once they stop
        self._orphaned: dict[BranchId, str] = {}
        # branches aborted before their pieces came (a request overtaken, or held while this
        # node recovers): refused when they come. Bounded: an abort of a finished branch
        # adds one that nothing takes.
        self._aborted_early: dict[BranchId, None] = {}
        self._request_ids = itertools.count()
        self._seq = itertools.count()  # the calls clients made here
        self._forwarded_seq = itertools.count(-1, -1)  # calls other nodes forwarded here
        self._outgoing: dict[int, list[bytes]] = {}
        self._backoff = random.Random(config.seed * 1000 + node_id)
        self._committed: list[tuple] = []
        self.logic_aborted: list[tuple] = []  # with order_log: logic-aborted branches
        self._txn_tasks: set[asyncio.Task] = set()
        self.stats.update({"txn/attempts": 0, "txn/cc_aborts": 0, "txn/retries": 0,
                           "txn/gave_up": 0, "txn/forwarded": 0})  # fmt: skip

    async def start(self) -> None:
        """Listen and connect to every peer; calls then start transactions directly."""
        await self._listen()
        await asyncio.gather(*(self._connect(peer) for peer in self.peers))
        self._check_ready()
        if self.wal is not None:
            await self.ready.wait()  # peers must be able to answer and be answered
            await self._recover(self.wal)
        self._recovered.set()

    async def _recover(self, wal: TwoPhaseLog) -> None:
        """Ask each coordinator which of our branches in doubt it decided; redo the log."""
        by_origin: dict[int, list[TxnId]] = {}
        for txn in wal.in_doubt():
            by_origin.setdefault(txn[0], []).append(txn)
        decided = {txn for txn in by_origin.pop(self.id, ()) if txn in wal.decided}
        answers = await asyncio.gather(
            *(self._request(origin, ("decided", txns)) for origin, txns in by_origin.items())
        )
        decided.update(tuple(txn) for answer in answers for txn in answer)
        wal.recover(self.db, decided)

    def _open_log(self, config: ClusterConfig, node_id: int) -> type:
        """The protocol's CC class; with a data dir, the 2PC log replaces the epoch log."""
        cc_class = PROTOCOLS.get(config.protocol)
        if cc_class is None:
            raise ConfigError(
                f"protocol {config.protocol!r} is not a 2PC one; use one of {list(PROTOCOLS)}"
            )
        self.wal: TwoPhaseLog | None = None
        if self.durability is not None:  # the epoch log is DistDGCC's and Calvin's: use ours
            # (no checkpoints: ClusterConfig refuses checkpoint_every_epochs for 2PC protocols)
            self.durability = None
            self.wal = TwoPhaseLog(node_directory(config, node_id))
            self.db = self.build_db()  # the log is redone onto it in ``start``
        return cc_class

    def stop(self) -> None:
        for task in self._txn_tasks:
            task.cancel()
        if self.wal is not None:  # closed before ``Node.stop`` gives up the directory
            self.wal.close()
        super().stop()

    def status(self) -> dict[str, Any]:
        status = super().status()
        # a 2PC node's calls in flight: its transactions, and branches it runs for others
        status["waiting_calls"] = len(self._txn_tasks) + len(self._branches)
        if self.wal is not None:
            status.update(self.wal.stats)
        return status

    # -- messages ---------------------------------------------------------------------------

    def _post(self, peer: int, message: Any) -> None:
        """Queue a message to ``peer``; the queue is written once per loop iteration."""
        queue = self._outgoing.get(peer)
        if queue is None:
            queue = self._outgoing[peer] = []
            asyncio.get_running_loop().call_soon(self._flush, peer)
        queue.append(frame(message))

    def _flush(self, peer: int) -> None:
        data = b"".join(self._outgoing.pop(peer, ()))
        self.stats["net/peer_bytes"] += len(data)
        writer = self._out.get(peer)  # None: the peer was lost; its requests time out
        if writer is not None and not writer.is_closing():
            writer.write(data)

    async def _request(self, peer: int, body: tuple) -> Any:
        """``peer``'s answer to ``body``. Raises PeerLost at once if the link to ``peer`` is
        down or goes down before it answers, TimeoutError after ``RPC_TIMEOUT_S``."""
        if peer in self._down:
            raise PeerLost(f"node {peer} is lost")
        request_id = next(self._request_ids)
        reply = asyncio.get_running_loop().create_future()
        self._replies[request_id] = reply
        self._awaiting.setdefault(peer, set()).add(request_id)
        self.stats["net/peer_messages"] += 1
        try:
            self._post(peer, ("req", request_id, self.id, body))
            answer = await asyncio.wait_for(reply, RPC_TIMEOUT_S)
        finally:
            self._replies.pop(request_id, None)
            self._awaiting.get(peer, set()).discard(request_id)
        problem = reply_problem(body[0], answer)
        if problem is not None:  # the peer broke the protocol: as a bad frame, its link ends
            self._bad_peer(peer, FrameError(f"bad 'rep' message from peer {peer}: {problem}"))
            raise PeerLost(f"node {peer} sent an ill-shaped answer ({problem})")
        return answer

    def _peer_lost(self, peer: int) -> None:
        """Fail the requests awaiting ``peer`` at once (their attempts abort) and abort the
        branches ``peer`` coordinates here that have not voted (presumed abort: it cannot
        decide commit without their yes), releasing what they hold. Prepared branches stay in
        doubt until the coordinator comes back (with a data dir, its log holds the decision)."""
        super()._peer_lost(peer)
        for request_id in self._awaiting.pop(peer, set()):
            reply = self._replies.pop(request_id, None)
            if reply is not None and not reply.done():
                reply.set_exception(PeerLost(f"node {peer} was lost before it answered"))
        orphans = [b for b, branch in self._branches.items()
                   if b[0] == peer and not branch.prepared]  # fmt: skip
        for branch_id in orphans:
            if branch_id in self._running:  # aborted when its pieces stop running
                self._orphaned[branch_id] = f"node {peer} (the coordinator) is lost"
            else:
                self._end(branch_id, commit=False)
        if orphans:
            logger.warning("node %d: aborted %d branches of lost coordinator %d", self.id,
                           len(orphans), peer)  # fmt: skip

    async def _serve_peer(self, reader: asyncio.StreamReader, peer: int) -> None:
        limit = FRAME_BODY_MAX  # as DistDGCC's nodes: frame_bytes_max bounds client frames
        while True:
            message = await read_frame(reader, limit)
            if len(message) != 4 or not isinstance(message[1], int) or message[2] != peer:
                raise FrameError(f"ill-shaped peer message {brief(message)}")
            kind, request_id, _, body = message
            if kind == "rep":
                reply = self._replies.pop(request_id, None)
                if reply is not None and not reply.done():
                    reply.set_result(body)
            elif kind == "req":
                problem = request_problem(body)
                if problem is not None:
                    raise FrameError(f"bad 'req' message from peer {peer}: {problem}")
                self._spawn(self._answer(peer, request_id, body))
            else:
                raise FrameError(f"unknown peer message kind {kind!r}")

    async def _answer(self, peer: int, request_id: int, body: Sequence[Any]) -> None:
        op, branch_id = body[0], tuple(body[1])
        if op in ("pieces", "call") and not self._recovered.is_set():
            await self._recovered.wait()  # a peer that restarted first must not see old rows
        if op == "call":  # a call forwarded by the node its client called: coordinate it here
            _, ts, procedure, params = body
            seq = next(self._forwarded_seq)  # its branches' ids; our calls' seqs stay 0, 1, ..
            outcome = await self._retry(seq, tuple(ts), TxnRequest(procedure, params))
            result = (outcome.status.value, outcome.result, outcome.reason)
        elif op == "pieces":
            _, _, ts, procedure, params, indices, inputs = body
            result = await self._run_pieces(
                branch_id, tuple(ts), TxnRequest(procedure, params), indices, inputs
            )
        elif op == "prepare":
            result = await self._prepare_logged(branch_id)
        elif op == "abort" and branch_id in self._running:
            # Its pieces run (one may wait for a lock): ended once they stop, or the waiting
            # piece would take its locks again for a branch nothing ends.
            self._orphaned[branch_id] = "aborted by its coordinator"
            result = True
        elif op in ("commit", "abort"):
            logic = op == "abort" and len(body) > 2 and body[2] is True
            ended = self._end(branch_id, commit=op == "commit", logic=logic)
            if ended is None and op == "abort":
                self._aborted_early[branch_id] = None
                if len(self._aborted_early) > ABORTED_EARLY_MAX:
                    del self._aborted_early[next(iter(self._aborted_early))]
            result = ended is not None
        elif op == "decided":  # a restarting peer asks which of its branches in doubt committed
            await self.ready.wait()
            decided = self.wal.decided if self.wal is not None else set()
            result = [txn for txn in map(tuple, body[1]) if txn in decided]
        else:
            raise FrameError(f"unknown peer request {op!r}")
        self.stats["net/peer_messages"] += 1
        try:
            self._post(peer, ("rep", request_id, self.id, result))
        except FrameError as error:  # an output msgpack cannot carry: this call fails alone
            answer = self._unsendable(op, body, result, unencodable(result) or str(error))
            self._post(peer, ("rep", request_id, self.id, answer))

    def _unsendable(self, op: str, body: Sequence[Any], result: Any, why: str) -> tuple:
        """The answer to a ``pieces`` or forwarded ``call`` request whose outputs cannot be
        sent: the branch's outputs fail the call (its coordinator aborts it everywhere); a
        forwarded call that committed keeps its status and loses only its result."""
        if op == "call":
            return (result[0], None, f"the call's result cannot be sent ({why})")
        where = f"{body[3]}: the outputs of its pieces on node {self.id}"
        return ("error", f"{where} cannot be sent ({why})")

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._txn_tasks.add(task)
        task.add_done_callback(self._txn_done)

    def _txn_done(self, task: asyncio.Task) -> None:
        self._txn_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("node %d: transaction task failed", self.id, exc_info=task.exception())
            self._fail(f"a transaction task failed: {task.exception()!r}")

    # -- participant side (also the coordinator's own branch) --------------------------------

    async def _run_pieces(
        self,
        branch_id: BranchId,
        ts: Timestamp,
        call: TxnRequest | PlannedTxn,
        indices: Sequence[int],
        inputs: dict[str, Any],
    ) -> tuple:
        """Run pieces of one branch in order: ``("ok", outputs)``, ``("cc", cause)``,
        ``("aborted", reason)`` or ``("error", reason)``.

        ``call`` is the coordinator's own plan, or a peer's request that this node plans.
        """
        if branch_id[0] in self._down:  # its coordinator is lost: it will never decide
            return ("error", f"node {branch_id[0]} (the coordinator) is lost")
        if branch_id in self._aborted_early:  # its abort overtook it
            del self._aborted_early[branch_id]
            return ("error", "aborted by its coordinator")
        self._running.add(branch_id)
        try:
            result = await self._run_branch(branch_id, ts, call, indices, inputs)
        finally:
            self._running.discard(branch_id)
        why = self._orphaned.pop(branch_id, None)
        if why is not None:  # its coordinator was lost, or aborted it, while it ran
            self._end(branch_id, commit=False)
            return ("error", why)
        return result

    async def _run_branch(
        self,
        branch_id: BranchId,
        ts: Timestamp,
        call: TxnRequest | PlannedTxn,
        indices: Sequence[int],
        inputs: dict[str, Any],
    ) -> tuple:
        branch = self._branches.get(branch_id)
        if branch is None:
            planned = call
            if isinstance(call, TxnRequest):
                planned = plan_batch(self.registry, self.db, [call])[0]
            if isinstance(planned, Outcome):
                return ("error", planned.reason)
            assert isinstance(planned, PlannedTxn)
            branch = self._branches[branch_id] = self.cc.branch(ts, planned)
        txn = branch.txn
        txn.outputs.update(inputs)
        outputs = {}
        for index in indices:
            piece = txn.pieces[index]
            keys = dict.fromkeys(piece.reads, "S") | dict.fromkeys(piece.writes, "X")
            cause = await self.cc.before_piece(branch, keys)
            if cause is not None:  # release at once; the coordinator's abort finds nothing
                self._end(branch_id, commit=False)
                return ("cc", cause)
            run_piece(branch.ctx, txn, piece)
            if txn.error is not None:
                return ("error", txn.error)
            if txn.abort_reason is not None:
                return ("aborted", txn.abort_reason)
            outputs[piece.name] = txn.outputs.get(piece.name)
        return ("ok", outputs)

    def _prepare(self, branch_id: BranchId) -> bool:
        branch = self._branches.get(branch_id)
        return branch is not None and self.cc.prepare(branch)

    async def _prepare_logged(self, branch_id: BranchId) -> bool:
        """The 2PC vote; a yes only once the branch's prepare record (its redo) is on disk."""
        if not self._prepare(branch_id):
            return False
        if self.wal is not None:
            images = self.cc.after_images(self._branches[branch_id])
            await self.wal.wait(self.wal.append(("prepare", branch_id, images)))
        return True

    def _end(
        self, branch_id: BranchId, *, commit: bool, one_phase: bool = False, logic: bool = False
    ) -> int | None:
        """Commit or abort the branch; None when it is unknown here, else the lsn of its commit
        record (0: none). ``one_phase``: a one-node transaction, its record carries the images.
        ``logic``: the abort is the transaction's logic abort (kept in ``logic_aborted``).
        """
        branch = self._branches.pop(branch_id, None)
        if branch is None:
            return None
        if not commit:
            if logic and self.config.order_log:  # what it read, as the locks or votes left it
                txn, call = branch.txn, branch.ts[1:]
                self.logic_aborted.append(
                    (call, txn.procedure.name, dict(txn.params), dict(branch.seen), {})
                )
            self.cc.abort(branch)
            return 0
        lsn = 0
        if self.wal is not None:
            images = self.cc.after_images(branch) if one_phase else None
            lsn = self.wal.append(("commit", branch_id, images))
        installed = self.cc.commit(branch)
        if self.config.order_log:
            txn, call = branch.txn, branch.ts[1:]  # (called node, its seq): see _coordinate
            self._committed.append(
                (call, txn.procedure.name, dict(txn.params), branch.seen, installed)
            )
        return lsn

    def _answer_order(self, client: Any, call_id: int) -> None:
        history = tuple(self._committed) if self.config.order_log else None
        client.send(("order", call_id, history))

    # -- coordinator side -------------------------------------------------------------------

    def _add_calls(self, client: Any, calls: tuple) -> None:
        for call_id, procedure, params in calls:
            if len(self._txn_tasks) >= CALLS_WAITING_MAX:  # bounded: refuse rather than grow
                reason = f"node {self.id} overloaded: {len(self._txn_tasks)} transactions running"
                client.result(call_id, Outcome(Status.ERROR, reason=reason))
                continue
            self.stats["txn/calls"] += 1
            self._spawn(self._coordinate(client, call_id, TxnRequest(procedure, params)))

    async def _coordinate(self, client: Any, call_id: int, request: TxnRequest) -> None:
        seq = next(self._seq)
        ts = (time.time_ns(), self.id, seq)  # (.., self.id, seq) also names the call
        started_s = time.perf_counter()
        route = self.router.route(request)
        if route is None or self.id in route:
            outcome = await self._retry(seq, ts, request)
        else:
            outcome = await self._forward(min(route), ts, request)
        self.stats["timing_s/execute"] += time.perf_counter() - started_s
        self.stats["txn/gave_up" if outcome.gave_up else f"txn/{outcome.status.value}"] += 1
        client.result(call_id, outcome)

    async def _forward(self, node: int, ts: Timestamp, request: TxnRequest) -> Outcome:
        """Have ``node`` coordinate a call none of whose data is here; its outcome."""
        self.stats["txn/forwarded"] += 1
        body = ("call", ts, request.procedure, request.params)
        try:
            status, result, reason = await self._request(node, body)
        except TimeoutError:
            reason = f"node {node} gave no outcome of the forwarded call in {RPC_TIMEOUT_S:.0f} s"
            return Outcome(Status.ERROR, reason=reason)
        except PeerLost:
            return Outcome(
                Status.ERROR, reason=f"node {node} was lost; the call's outcome there is unknown"
            )
        return Outcome(Status(status), result, reason)

    def _runs(self, planned: PlannedTxn) -> list[tuple[int, list[int]]]:
        """Consecutive pieces grouped by the node that runs them: [(node, piece indices)]."""
        runs: list[tuple[int, list[int]]] = []
        node_of_key = self.router.node_of_key
        for index, piece in enumerate(planned.pieces):
            nodes = {node_of_key(key) for key in (*piece.reads, *piece.writes)} - {REPLICATED}
            if len(nodes) > 1:
                raise ConfigError(f"piece {piece.name!r} spans nodes {sorted(nodes)}")
            node = nodes.pop() if nodes else self.id
            if runs and runs[-1][0] == node:
                runs[-1][1].append(index)
            else:
                runs.append((node, [index]))
        return runs

    async def _retry(self, seq: int, ts: Timestamp, request: TxnRequest) -> Outcome:
        """Attempts until one commits or logic-aborts, at most ``ATTEMPTS_MAX`` in all: the first,
        then a retry after each concurrency-control abort but the last (``txn/retries`` counts
        exactly those; a backoff comes before each retry, none after the last attempt). Each
        attempt plans afresh (reconnaissance). Past the budget: ABORTED with a ``retry:`` reason.
        """
        for attempt in range(ATTEMPTS_MAX):
            if attempt:
                self.stats["txn/retries"] += 1
                backoff_s = min(BACKOFF_S_MAX, BACKOFF_S_MIN * 2 ** min(attempt - 1, 16))
                await asyncio.sleep(self._backoff.uniform(0, backoff_s))  # retry policy
            planned = plan_batch(self.registry, self.db, [request])[0]
            if isinstance(planned, Outcome):
                return planned
            runs = self._runs(planned)
            if attempt == 0:
                self.stats["txn/executed"] += 1
                self.stats["txn/multi_node"] += len({node for node, _ in runs}) > 1
            branch_id = (self.id, seq, attempt, self._incarnation)
            result = await self._attempt(branch_id, ts, planned, runs)
            # Counted as it ends, as its abort is: a window's cc_aborts / attempts stays <= 1.
            self.stats["txn/attempts"] += 1
            if isinstance(result, Outcome):
                return result
            self.stats["txn/cc_aborts"] += 1
            self.stats[f"cc_aborts/{result}"] = self.stats.get(f"cc_aborts/{result}", 0) + 1
        reason = f"retry: {self.config.protocol} gave up after {ATTEMPTS_MAX} attempts"
        return Outcome(Status.ABORTED, reason=reason)

    async def _attempt(
        self, branch_id: BranchId, ts: Timestamp, planned: PlannedTxn, runs: list
    ) -> Outcome | str:
        """One attempt: an outcome, or the cause of a concurrency-control abort."""
        outputs: dict[str, Any] = {}
        touched: list[int] = []
        pieces = planned.pieces
        for node, indices in runs:
            if node not in touched:
                touched.append(node)
            needs = {name for k in indices for name in pieces[k].after}
            inputs = {name: outputs[name] for name in needs if name in outputs}
            if node == self.id:
                result = await self._run_pieces(branch_id, ts, planned, indices, inputs)
            else:
                procedure, params = planned.procedure.name, planned.params
                body = ("pieces", branch_id, ts, procedure, params, indices, inputs)
                try:
                    result = await self._request(node, body)
                except (PeerLost, TimeoutError) as error:
                    return await self._abandon(branch_id, touched, node, error)
                except FrameError as error:  # an output msgpack cannot carry: this call fails
                    why = unencodable(inputs) or str(error)
                    where = f"the inputs of its pieces on node {node}"
                    result = ("error", f"{planned.procedure.name}: {where} cannot be sent ({why})")
            kind, value = result
            if kind in ("aborted", "error") and self.config.protocol == "occ":  # valid views
                # only: a logic abort or a raising piece may rest on stale reads
                try:  # OCC's reads may be stale: the participants validate them (a vote)
                    votes = await asyncio.gather(*(self._vote(branch_id, n) for n in touched))
                except (PeerLost, TimeoutError) as error:
                    return await self._abandon(branch_id, touched, None, error)
                if not all(votes):
                    await self._finish(branch_id, touched, commit=False)
                    return "validation"
            if kind != "ok":
                await self._finish(branch_id, touched, commit=False, logic=kind == "aborted")
                if kind == "cc":
                    return value
                return Outcome(Status(kind), reason=value)
            outputs.update(value)
        if touched != [self.id]:
            try:
                votes = await asyncio.gather(*(self._vote(branch_id, node) for node in touched))
            except (PeerLost, TimeoutError) as error:  # no decision yet: abort everywhere
                return await self._abandon(branch_id, touched, None, error)
            if not all(votes):
                await self._finish(branch_id, touched, commit=False)
                return "vote_no"
            if self.wal is not None:  # the decision is on disk before any commit is sent
                await self.wal.wait(self.wal.append(("decide", branch_id)))
                crashpoint("twopc.after_decide")
            await self._finish(branch_id, touched, commit=True)
        elif not self._prepare(branch_id):
            self._end(branch_id, commit=False)
            return "validation"
        else:
            lsn = self._end(branch_id, commit=True, one_phase=True)
            if self.wal is not None and lsn:
                await self.wal.wait(lsn)  # answered only once its commit record is durable
        ordered = {p.name: outputs[p.name] for p in pieces if p.name in outputs}
        return committed_outcome(planned.procedure, ordered)

    async def _abandon(self, branch_id: BranchId, touched: list[int], node: int | None,
                       error: Exception) -> Outcome:  # fmt: skip
        """Abort an attempt a lost (or silent) participant cut short, before any decision: the
        call fails with an ERROR naming the cause; the other participants abort their
        branches (the lost one aborts its own unvoted branch when it sees this node lost)."""
        await self._finish(branch_id, touched, commit=False)
        where = f"node {node}" if node is not None else "a participant"
        cause = (
            "was lost"
            if isinstance(error, PeerLost)
            else f"gave no answer in {RPC_TIMEOUT_S:.0f} s"
        )
        return Outcome(Status.ERROR, reason=f"{where} {cause} during the call; it was aborted")

    async def _vote(self, branch_id: BranchId, node: int) -> bool:
        if node == self.id:
            return await self._prepare_logged(branch_id)
        return bool(await self._request(node, ("prepare", branch_id)))

    async def _finish(
        self, branch_id: BranchId, nodes: list[int], *, commit: bool, logic: bool = False
    ) -> None:
        """Send the decision (``logic``: an abort that is the transaction's logic abort). A
        participant lost meanwhile misses it: an abort it presumes itself; a commit it learns
        from this node's log when it restarts (with a data dir)."""
        op = "commit" if commit else "abort"
        body = (op, branch_id, True) if logic else (op, branch_id)
        remote = [self._request(node, body) for node in nodes if node != self.id]
        if self.id in nodes:
            self._end(branch_id, commit=commit, logic=logic)
        if remote:
            answers = await asyncio.gather(*remote, return_exceptions=True)
            for node, answer in zip([n for n in nodes if n != self.id], answers, strict=True):
                if isinstance(answer, PeerLost | TimeoutError):
                    logger.warning("node %d: node %d missed the %s of %s (%s)", self.id, node,
                                   op, branch_id, answer)  # fmt: skip
                elif isinstance(answer, BaseException):
                    raise answer


_SEQ = (list, tuple)
# A request's arity by operation (its body after the operation name and branch id).
_REQUEST_ARITY = {"call": (4,), "pieces": (7,), "prepare": (2,), "commit": (2, 3),
                  "abort": (2, 3), "decided": (2,)}  # fmt: skip
_PIECE_RESULTS = ("ok", "cc", "aborted", "error")


def request_problem(body: Any) -> str | None:
    """What is wrong with a peer request's body (the shape ``_answer`` unpacks), or None."""
    if not isinstance(body, _SEQ) or not body or body[0] not in _REQUEST_ARITY:
        return f"not a known request: {brief(body, 60)}"
    op = body[0]
    if len(body) not in _REQUEST_ARITY[op] or not isinstance(body[1], _SEQ):
        return f"an ill-shaped {op!r} request: {brief(body, 60)}"
    if op == "call" and not (isinstance(body[2], str) and isinstance(body[3], dict)):
        return f"a 'call' request needs a procedure name and params: {brief(body, 60)}"
    if op == "pieces":
        _, _, ts, procedure, params, indices, inputs = body
        shapes = (isinstance(ts, _SEQ) and isinstance(procedure, str) and isinstance(params, dict)
                  and isinstance(indices, _SEQ) and all(type(i) is int for i in indices)
                  and isinstance(inputs, dict))  # fmt: skip
        if not shapes:
            return f"an ill-shaped 'pieces' request: {brief(body, 60)}"
    if op == "decided" and not all(isinstance(txn, _SEQ) for txn in body[1]):
        return f"a 'decided' request needs transaction ids: {brief(body, 60)}"
    return None


def reply_problem(op: str, answer: Any) -> str | None:
    """What is wrong with a peer's answer to an ``op`` request (as its caller unpacks it)."""
    if op == "call":
        ok = (isinstance(answer, _SEQ) and len(answer) == 3
              and answer[0] in {status.value for status in Status}
              and (answer[2] is None or isinstance(answer[2], str)))  # fmt: skip
    elif op == "pieces":
        ok = (isinstance(answer, _SEQ) and len(answer) == 2 and answer[0] in _PIECE_RESULTS
              and (answer[0] != "ok" or isinstance(answer[1], dict)))  # fmt: skip
    elif op == "decided":
        ok = isinstance(answer, _SEQ) and all(isinstance(txn, _SEQ) for txn in answer)
    else:  # prepare, commit, abort
        ok = type(answer) is bool
    return None if ok else f"an ill-shaped answer to {op!r}: {brief(answer, 60)}"
