"""The epochs of a node: collecting calls into epochs, executing them, answering them.

``EpochPipeline`` is the part of ``Node`` (``dgcc.net.node``) that moves epochs along; the
node holds the state it reads (config, router, database, peer links, stats) and runs
``_collector`` and ``_executor`` as tasks.

Three activities, on the node's event loop:

  * collection: client calls join the open epoch; the epoch closes after ``epoch_ms``, at
    ``epoch_calls_max`` calls, or once a peer closed it (when this node holds half as many
    calls, so batches stay even; see ``_may_close``), and each peer gets at once the calls of
    it whose route includes that peer (with their slots; the rest stay home, see
    ``_peer_inputs``). Up to ``pipeline_epochs`` closed epochs may wait for execution, so
    collecting epoch e + 1 overlaps executing epoch e;
  * execution: once all nodes' batches of epoch e are in, ``EpochRun`` plans and runs this
    node's pieces in slices of ``step_pieces``, flushing value messages (one per destination)
    as soon as the pieces peers wait on have run, and whenever it runs out of ready pieces;
    it then sends each origin its report;
  * completion: an origin answers its clients once every node has reported the epoch (and,
    with a data dir, once every node has made it durable).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dgcc.api import Status, TxnRequest
from dgcc.errors import ProcedureError, brief
from dgcc.net.calls import ClientLink
from dgcc.net.wire import FrameError, frame, unencodable
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.protocols.dist_results import ResultAssembler

if TYPE_CHECKING:
    from dgcc.cluster import ClusterConfig
    from dgcc.protocols.dist_placement import Router

__all__ = [
    "CALLS_WAITING_MAX",
    "CLIENT_CALLS_WAITING_MAX",
    "EpochPipeline",
    "check_inputs",
    "peer_body",
]

logger = logging.getLogger(__name__)

CALLS_WAITING_MAX = 200_000  # calls collected but not yet in a closed epoch (so per batch)
CLIENT_CALLS_WAITING_MAX = CALLS_WAITING_MAX // 2  # of them one client's: others keep room
_STATUS_STAT = {status.value: f"txn/{status.value}" for status in Status}


class EpochPipeline:
    """Collection, execution and completion of epochs (a part of ``Node``, which sets the
    state below up in its ``__init__`` and runs ``_collector`` and ``_executor``)."""

    config: ClusterConfig
    id: int
    peers: list[int]
    router: Router
    stats: dict[str, float]

    async def _collector(self) -> None:
        """Close epochs; see ``_may_close`` for when."""
        epoch_s = self.config.epoch_ms / 1000
        while True:
            deadline_s = time.monotonic() + epoch_s
            while not self._may_close(deadline_s):
                self._collector_wake.clear()
                timed = epoch_s and self._collect and self._closed_epochs == self._executed_epochs
                timeout_s = max(0.0, deadline_s - time.monotonic()) if timed else None
                with contextlib.suppress(TimeoutError):  # the epoch's time is up
                    await asyncio.wait_for(self._collector_wake.wait(), timeout_s)
            self._close_epoch()
            await self._drain()

    def _may_close(self, deadline_s: float) -> bool:
        """Whether to close the open epoch now.

        Asked to (it holds ``epoch_calls_max`` calls, or with time-based epochs a peer already
        closed it, so waiting would stall that peer): close while fewer than
        ``pipeline_epochs`` closed epochs wait for execution. A peer's close asks only once
        this node holds half as many calls as the peer's batch (or ``epoch_calls_max``), or
        its executor has nothing else to run: closing at once with the few calls in hand
        would leave this node's batch small and the next one large, and where values cross
        the nodes run each epoch in step, the light node waiting for the heavy one (a closed
        loop keeps such an alternation going). Otherwise close on the timer, but only once
        the executor is idle (an epoch closed while the executor is busy would hold few calls
        in a closed loop and leave the next one lumpy) and only with calls in it.
        """
        pending = self._closed_epochs - self._executed_epochs
        count_max = self.config.epoch_calls_max
        asked = bool(count_max) and len(self._collect) >= count_max
        if self.config.epoch_ms and not asked:
            peer_calls = self._peer_calls(self._closed_epochs)
            if peer_calls is not None:
                half = peer_calls // 2
                asked = pending == 0 or len(self._collect) >= min(half, count_max or half)
        if asked and pending < self.config.pipeline_epochs:
            return True
        if not self._collect:  # an idle cluster exchanges nothing until a call arrives
            return False
        return bool(self.config.epoch_ms) and pending == 0 and time.monotonic() >= deadline_s

    def _peer_calls(self, epoch: int) -> int | None:
        """The most calls a peer's batch of ``epoch`` holds; None before any peer closed it."""
        inputs = self._inputs.get(epoch, {})
        return max((body[0] for peer, body in inputs.items() if peer != self.id), default=None)

    def _close_epoch(self) -> None:
        limit = self.config.epoch_calls_max or len(self._collect)
        batch, self._collect = self._collect[:limit], self._collect[limit:]
        callers, self._callers = self._callers[:limit], self._callers[limit:]
        for client, _ in callers:
            client.waiting -= 1
        epoch = self._closed_epochs
        self._closed_epochs += 1
        self._inputs.setdefault(epoch, {})[self.id] = batch
        self._assemblers[epoch] = (
            ResultAssembler(self.registry, batch, len(self.config.nodes)),
            callers,
        )
        bodies = self._peer_inputs(batch)
        if self.durability is not None:
            self.durability.retained.sent_inputs(epoch, bodies)
        for peer, body in bodies.items():
            self._send(peer, ("inputs", epoch, self.id, body))
        for peer, report in self._early_reports.pop(epoch, ()):
            try:
                self._on_report(epoch, peer, report)
            except FrameError as error:  # the peer's fault: its link ends, as on arrival
                self._bad_peer(peer, error)  # type: ignore[attr-defined]
        self._wake.set()

    def _peer_inputs(self, batch: list[TxnRequest]) -> dict[int, tuple]:
        """Per peer: ``(calls, [(slot, procedure, params)], full)``, only the calls it plans.

        A peer plans a call only when the route includes it (or cannot tell, then every node
        plans it), so the others stay unsent; ``calls`` keeps the global indices. ``full`` is
        the whole batch with ``order_log`` (for the order answer) or a data dir (so a peer can
        give it back to this node if it rejoins), else None.
        """
        if not self.peers:
            return {}
        sparse: dict[int, list[tuple]] = {peer: [] for peer in self.peers}
        routes = self.router.routes(batch, keep=True)  # planning this epoch takes them back
        for slot, (request, nodes) in enumerate(zip(batch, routes, strict=True)):
            for peer in self.peers if nodes is None else nodes:
                if peer != self.id:
                    sparse[peer].append((slot, request.procedure, request.params))
        full = None
        if self.config.order_log or self.durability is not None:
            full = tuple((r.procedure, r.params) for r in batch)
        return {peer: (len(batch), entries, full) for peer, entries in sparse.items()}

    def _batches(self, inputs: dict[int, Any]) -> list[list[TxnRequest | None]]:
        """The epoch's batches per origin; a peer's unsent calls are None (not planned here)."""
        batches: list[list[TxnRequest | None]] = []
        for origin in range(len(self.config.nodes)):
            if origin == self.id:
                batches.append(inputs[origin])
                continue
            calls, entries, _ = inputs[origin]
            batch: list[TxnRequest | None] = [None] * calls
            for slot, procedure, params in entries:
                batch[slot] = TxnRequest(procedure, params)
            batches.append(batch)
        return batches

    def _log_order(self, inputs: dict[int, Any]) -> None:
        logged = []
        for origin in range(len(self.config.nodes)):
            if origin == self.id:
                logged.append(tuple((r.procedure, r.params) for r in inputs[origin]))
            else:
                logged.append(tuple(tuple(call) for call in inputs[origin][2]))
        self._order.append(tuple(logged))

    async def _executor(self) -> None:
        nodes = len(self.config.nodes)
        epoch = self._executed_epochs  # 0, or the epoch a restart recovered to
        while True:
            waited_s = time.perf_counter()
            while len(self._inputs.get(epoch, ())) < nodes:
                self._wake.clear()
                await self._wake.wait()
            self.stats["timing_s/wait_inputs"] += time.perf_counter() - waited_s
            inputs = self._inputs.pop(epoch)
            batches = self._batches(inputs)
            if self.config.order_log:
                self._log_order(inputs)
            started_s = time.perf_counter()
            run = self.epoch_run(self.id, self.db, self.registry, self.router, batches)
            self.stats["txn/multi_node"] += run.multi_node_by_origin[self.id]
            self.stats["txn/executed"] += len(batches[self.id])
            self._run, self._running_epoch = run, epoch
            for peer, body in self._values.pop(epoch, ()):
                try:
                    peer_body(peer, "values", run.deliver, body)
                except FrameError as error:  # the peer's fault: its link ends, as on arrival
                    self._bad_peer(peer, error)  # type: ignore[attr-defined]
            await self._execute(run, epoch)
            if self.durability is not None:
                self.durability.executed(run)  # group commit of the epoch, in the background
            self.stats["timing_s/execute"] += time.perf_counter() - started_s
            self._run, self._running_epoch = None, -1
            reports = run.reports()
            for peer in self.peers:
                if epoch < self._catch_up_until and epoch not in self._reports_to[peer]:
                    continue  # re-run after a rejoin: the peer has this report already
                message, data = sendable_entries(
                    ("report", epoch, self.id, tuple(reports.get(peer, ()))),
                    functools.partial(_unsendable_report, self.id, peer),
                )
                self._send(peer, message, data)
            self._on_report(epoch, self.id, reports.get(self.id, ()))
            epoch += 1
            self._executed_epochs = epoch
            self._collector_wake.set()
            await self._drain()

    async def _execute(self, run: EpochRun, epoch: int) -> None:
        """Run ready pieces in slices; flush values and wait for peers when nothing is ready."""
        budget = self.config.step_pieces
        retained = None if self.durability is None else self.durability.retained
        while not run.finished:
            ran = run.step(budget)
            for peer, entries in run.take_outbox().items():
                message, data = sendable_entries(
                    ("values", epoch, self.id, tuple(entries)),
                    functools.partial(_unsendable_value, run, peer),
                )
                if retained is not None:  # kept until every node made the epoch durable
                    retained.sent_values(epoch, peer, message[3])
                self._send(peer, message, data)
            if ran:
                await asyncio.sleep(0)  # let the network and clients in between slices
            else:
                await self._drain()
                self._wake.clear()
                if not run.finished and not run.has_ready:
                    waited_s = time.perf_counter()
                    await self._wake.wait()
                    self.stats["timing_s/wait_values"] += time.perf_counter() - waited_s

    def _on_report(self, epoch: int, peer: int, report: Any) -> None:
        entry = self._assemblers.get(epoch)
        if entry is None:  # a report that overtook our own closing of the epoch
            if epoch >= self._closed_epochs:  # (else: an epoch re-run after a rejoin)
                self._early_reports.setdefault(epoch, []).append((peer, report))
            return
        assembler, callers = entry
        peer_body(peer, "report", assembler.add, peer, report)
        if assembler.complete:
            del self._assemblers[epoch]
            if self.durability is None:
                self._complete_epoch(assembler, callers)
            else:  # answer once every node has made the epoch (log epoch + 1) durable
                answer = functools.partial(self._complete_epoch, assembler, callers)
                self.durability.when_durable(epoch + 1, answer)

    def _complete_epoch(self, assembler: ResultAssembler, callers: list) -> None:
        """Every node finished the epoch (and, with a data dir, made it durable): answer its
        callers."""
        counts = dict.fromkeys(_STATUS_STAT, 0)
        by_client: dict[ClientLink, list[tuple]] = {}  # most epochs: one client
        for (client, call_id), (status, result, reason) in zip(
            callers, assembler.answers(), strict=True
        ):
            counts[status] += 1
            entries = by_client.get(client)
            if entries is None:
                entries = by_client[client] = []
            entries.append((call_id, status, result, reason))
        for client, entries in by_client.items():
            client.results(entries)
        for status, count in counts.items():
            self.stats[_STATUS_STAT[status]] += count


def sendable_entries(
    message: tuple, replace: Callable[[Any, str], Any]
) -> tuple[tuple, bytes | None]:
    """A peer message ``(kind, epoch, node, entries)`` as sent, and its frame.

    A procedure's output may be a value msgpack cannot carry (an int beyond 64 bits, an
    object): each such entry is replaced by ``replace(entry, why)``, an error entry that fails
    its call alone, and the framing is left to ``Node._send`` (None), which stops the node
    only if the message still cannot go (larger than a frame). The common case costs one try.
    """
    try:
        return message, frame(message)
    except FrameError:
        pass
    fixed = []
    for entry in message[3]:
        why = unencodable(entry)
        fixed.append(entry if why is None else replace(entry, why))
    return (*message[:3], tuple(fixed)), None


def _unsendable_value(run: EpochRun, peer: int, entry: Sequence[Any], why: str) -> tuple:
    """A value entry whose output cannot be sent: the peer fails the call with the error."""
    index, piece_index = entry[0], entry[1]
    label = run.piece_label(index, piece_index)
    return (
        index,
        piece_index,
        None,
        None,
        f"{label}: its output cannot be sent to node {peer} ({why})",
    )


def _unsendable_report(node: int, peer: int, entry: Sequence[Any], why: str) -> tuple:
    """A report entry whose outputs cannot be sent: the origin answers the call ERROR."""
    why = f"its outputs on node {node} cannot be sent to node {peer} ({why})"
    return (entry[0], {}, None, (-1, why))  # (-1: it fails the call whatever else did)


def peer_body(peer: int, kind: str, handle: Callable[..., None], *args: Any) -> None:
    """``handle(*args)`` for the body of a well-framed peer message; a body that breaks the
    protocol (values nobody waits for, a second report, entries of the wrong shape) is the
    peer's fault and ends its link as a bad frame does.

    Raises:
        FrameError: naming the peer, the message kind and the problem.
    """
    try:
        handle(*args)
    except (ProcedureError, ValueError, TypeError, IndexError, KeyError) as error:
        raise FrameError(f"bad {kind!r} message from peer {peer}: {error}") from error


def check_inputs(peer: int, body: Any) -> None:
    """Raise FrameError unless ``body`` has the shape of ``_peer_inputs``'s bodies: ``calls``
    (at most ``CALLS_WAITING_MAX``), entries ``(slot, procedure, params)`` with slots in
    ``0..calls-1``, and ``full`` None or ``calls`` pairs ``(procedure, params)``. A bad body
    is its peer's fault; caught here, it ends that link instead of stopping the executor."""
    problem = None
    if not (isinstance(body, tuple | list) and len(body) == 3):
        problem = "expected (calls, entries, full)"
    else:
        calls, entries, full = body
        if type(calls) is not int or not 0 <= calls <= CALLS_WAITING_MAX:
            problem = f"calls must be an int in 0..{CALLS_WAITING_MAX}"
        elif not isinstance(entries, tuple | list) or not all(
            isinstance(entry, tuple | list)
            and len(entry) == 3
            and type(entry[0]) is int
            and 0 <= entry[0] < calls
            for entry in entries
        ):
            problem = f"entries must be (slot, procedure, params) with slots in 0..{calls - 1}"
        elif full is not None and not (
            isinstance(full, tuple | list)
            and len(full) == calls
            and all(isinstance(call, tuple | list) and len(call) == 2 for call in full)
        ):
            problem = f"full must be None or {calls} (procedure, params) pairs"
    if problem is not None:
        raise FrameError(f"bad 'inputs' message from peer {peer}: {problem}, got {brief(body)}")
