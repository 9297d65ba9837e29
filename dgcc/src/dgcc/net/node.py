"""One DistDGCC node: an asyncio TCP server owning its partitions, talking to peers and clients.

Collecting calls into epochs, executing them and answering them share one event loop
(uvloop when installed) with the connections; that part of the node is ``EpochPipeline``
(``dgcc.net.epochs``).

A peer that dies leaves the others stalled on the epochs that need it: they mark it down, stop
writing to it, keep what it will need (``NodeDurability.retained``) and, when it restarts from
its log, answer its ``restart`` with that; it re-executes the epochs it missed and rejoins
(``_catch_up``, ``dgcc.wal.rejoin``).

A connection that sends a garbled, oversized or ill-shaped frame, or fails the handshake, is
closed with a logged reason; nothing else is disturbed, except that a peer sending one on its
link counts as lost, as when that link drops. A call with a usable id but a bad procedure or
params is answered ERROR alone. A second connection claiming to be a peer whose link is still
open is refused (without a secret anyone can claim to be a peer, and taking over the link would
mark the real one lost); a restarted peer's retries get in once the old link ends.
``delay_ms_max`` (tests only) delays each peer message by a seeded random time, which also
reorders them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import itertools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dgcc.api import Outcome, Status, TxnRequest
from dgcc.cluster import ClusterConfig
from dgcc.errors import ConfigError, DgccError, brief
from dgcc.net.calls import ClientLink, call_problem
from dgcc.net.epochs import (
    CALLS_WAITING_MAX,
    CLIENT_CALLS_WAITING_MAX,
    EpochPipeline,
    check_inputs,
    peer_body,
)
from dgcc.net.wire import (
    FRAME_BODY_MAX,
    VERSION,
    ConnectionLost,
    FrameError,
    HandshakeError,
    check_mac,
    frame,
    mac_of,
    read_frame,
)
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.protocols.dist_placement import Router, keep_owned, owned_rows
from dgcc.protocols.dist_results import ResultAssembler
from dgcc.storage import Database
from dgcc.wal.dirlock import DirLock
from dgcc.wal.node_log import LoggedEpochRun, node_directory, node_durability
from dgcc.wal.rejoin import RejoinError, RejoinPlan
from dgcc.workloads import get_workload

__all__ = ["Node", "NodeFailed", "run_node"]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0
HANDSHAKE_TIMEOUT_S = 10.0
GC_PERIOD_S = 1.0  # between two collections of what the last period left (_collect_garbage)
PEER_CONNECTED = "refused a second connection claiming to be node"  # the newcomer retries
YIELD_EVERY_FRAMES = 64  # client frames read between two yields to the event loop
LINGER_S = 1.0  # a refused connection is read and dropped this long at most before closing
LINGER_BYTES_MAX = 64 << 20  # ... and this much


class NodeFailed(DgccError):
    """A node stopped itself on a fault (a task failed, its log could not be written)."""


class Node(EpochPipeline):
    """One node of ``config``; ``start`` listens and connects, ``stopped`` ends it."""

    epoch_run = EpochRun  # the Calvin node swaps in its lock-ordered epoch run
    logged_epoch_run = LoggedEpochRun  # what ``epoch_run`` becomes when the node logs

    def __init__(self, config: ClusterConfig, node_id: int) -> None:
        self.config = config
        self.id = node_id
        self.address = config.nodes[node_id]
        self.peers = [n.id for n in config.nodes if n.id != node_id]
        self.secret = config.shared_secret()
        self.workload = get_workload(config.workload, **dict(config.workload_options))
        self.registry = self.workload.registry()
        self.router = Router(self.workload, config.placement())
        self._dir_lock = None  # a data dir is this process's alone until ``stop``
        if config.data_dir is not None:
            self._dir_lock = DirLock(node_directory(config, node_id), f"node {node_id}")
        try:
            self.durability = node_durability(config, node_id)  # None: no --data-dir, no log
        except BaseException:  # a refused directory stays free for a corrected retry
            self.release_dir()
            raise
        if self.durability is None:
            self.db = self.build_db()
        else:  # recovered in ``start``, once the peers agree on the epoch
            self.db, self.epoch_run = self.workload.schema(), self.logged_epoch_run
        self.ready = asyncio.Event()
        self.stopped = asyncio.Event()
        self.failure: str | None = None  # why the node stopped itself, if it did
        self._client_writers: set[asyncio.StreamWriter] = set()  # closed by ``stop``
        self._wake = asyncio.Event()  # any peer message or closed epoch
        self._collector_wake = asyncio.Event()  # calls, peer inputs or execution progress
        self._out: dict[int, asyncio.StreamWriter] = {}
        self._in: set[int] = set()
        self._peer_readers: dict[int, asyncio.StreamReader] = {}  # the current connection
        self._peer_inbound: dict[int, asyncio.StreamWriter] = {}  # its writer (to close it)
        self._down: set[int] = set()  # peers whose connection ended (until they rejoin)
        self._reports_to: dict[int, frozenset[int]] = {}  # re-run epochs: who wants a report
        self._catch_up_until = 0  # epochs below this were re-run after a rejoin
        self._collect: list[TxnRequest] = []
        self._callers: list[tuple[ClientLink, int]] = []
        self._inputs: dict[int, dict[int, tuple]] = {}
        self._values: dict[int, list[tuple[int, Any]]] = {}  # epoch -> (peer, body) not run yet
        self._assemblers: dict[int, tuple[ResultAssembler, list]] = {}
        self._early_reports: dict[int, list[tuple[int, Any]]] = {}
        self._closed_epochs = 0
        self._executed_epochs = 0
        self._run: EpochRun | None = None
        self._running_epoch = -1
        self._order: list[Any] = []
        self._delay = random.Random(config.delay_seed * 1000 + node_id)
        self._tasks: list[asyncio.Task] = []
        self._server: asyncio.base_events.Server | None = None
        self.stats: dict[str, float] = {
            "net/peer_messages": 0,
            "net/peer_bytes": 0,
            "net/client_connections": 0,
            "net/rejected_connections": 0,
            "txn/calls": 0,
            "txn/committed": 0,
            "txn/aborted": 0,
            "txn/error": 0,
            "txn/multi_node": 0,
            "txn/executed": 0,  # this node's calls in executed epochs (multi_node's base)
            "timing_s/execute": 0.0,
            "timing_s/wait_inputs": 0.0,
            "timing_s/wait_values": 0.0,
        }

    def build_db(self) -> Database:
        """The workload's initial database cut down to what this node holds and checkpoints:
        its partitions' rows, the replicated ones and the workload's ``plan_tables``."""
        db = self.workload.build(self.config.seed)
        return keep_owned(db, self.router, self.id, self.workload.plan_tables)

    # -- lifecycle --------------------------------------------------------------------------

    async def _listen(self) -> None:
        """Open the node's port; a ConfigError (one line) when its address cannot be had."""
        host, port = self.address.host, self.address.port
        try:
            self._server = await asyncio.start_server(self._accept, host, port, limit=2**20)
        except OSError as error:  # taken, not this machine's address, a name that fails
            if error.errno == errno.EADDRINUSE:  # (``dgcc cluster start`` quotes the line)
                raise ConfigError(f"port {port} on {host} already in use") from None
            why = error.strerror or str(error)
            raise ConfigError(f"node {self.id} cannot listen on {host}:{port}: {why}") from None

    async def start(self) -> None:
        """Listen, connect to every peer, and start the epoch tasks."""
        await self._listen()
        await asyncio.gather(*(self._connect(peer) for peer in self.peers))
        if self.durability is not None:
            self.durability.broadcast = self._send_durable
            self.durability.announce = self._send_restart
            self.durability.failed = self._log_failed
            recovered = await self.durability.recover(
                self.registry,
                self.router,
                self.build_db,
                self.workload.schema,
                type(self).epoch_run,
            )
            self.db, self._closed_epochs = recovered
            self._executed_epochs = self._closed_epochs
            if self.durability.rejoin is not None:
                self._catch_up(self.durability.rejoin)
        self._check_ready()
        self._tasks = [
            asyncio.create_task(self._collector(), name="collector"),
            asyncio.create_task(self._executor(), name="executor"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "node %d: task %s failed", self.id, task.get_name(), exc_info=task.exception()
            )
            self._fail(f"its {task.get_name()} task failed: {task.exception()!r}")

    def _log_failed(self, error: OSError) -> None:
        """The log could not write an epoch's block: its clients can never be answered."""
        logger.error("node %d: writing the log failed: %s", self.id, error)
        self._fail(f"writing its log failed: {error}")

    def _fail(self, why: str) -> None:
        if not self.stopped.is_set():
            self.failure = self.failure or f"node {self.id} stopped: {why}"
            self.stop()

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
        for writer in [*self._out.values(), *self._client_writers]:
            writer.close()  # (what is buffered still leaves: the answer to a stop request)
        if self.durability is not None:
            self.durability.close()
        self.release_dir()
        self.stopped.set()

    def release_dir(self) -> None:
        """Give up the data dir's lock (idempotent; ``stop`` does, once the log is closed)."""
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def _check_ready(self) -> None:
        if len(self._out) == len(self.peers) and self._in >= set(self.peers):
            self.ready.set()

    async def _connect(self, peer: int) -> None:
        """Open the sending connection to ``peer``, retrying while it starts (bounded).

        Also retried: the peer refusing us because it still holds our previous link open (this
        node restarted, or dropped that link, and the peer has not yet read its end).
        """
        address = self.config.nodes[peer]
        deadline_s = time.monotonic() + CONNECT_TIMEOUT_S
        pause_s = 0.02
        while True:
            try:
                reader, writer = await asyncio.open_connection(address.host, address.port)
            except OSError as error:
                failure = str(error)
            else:
                try:
                    answer = await self._introduce(peer, reader, writer)
                except (ConnectionLost, FrameError, TimeoutError, OSError) as error:
                    # (a peer still starting, or too busy to answer in time): try again
                    writer.close()
                    failure = str(error) or type(error).__name__
                    answer = None
                except BaseException:
                    writer.close()
                    raise
                if answer is not None and answer[0] == "ready":
                    self._out[peer] = writer
                    return
                if answer is not None:
                    writer.close()
                    if answer[0] != "error" or PEER_CONNECTED not in str(answer[1:2]):
                        raise HandshakeError(
                            f"node {self.id}: peer {peer} refused us: {brief(answer)}"
                        )
                    failure = str(answer[1])
            if time.monotonic() > deadline_s:
                raise ConnectionLost(f"node {self.id}: peer {peer} unreachable: {failure}")
            await asyncio.sleep(pause_s)  # backoff between connection attempts
            pause_s = min(pause_s * 2, 0.5)

    async def _introduce(
        self, peer: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple:
        """Our side of the handshake on a new link to ``peer``; returns the peer's answer."""
        hello = await asyncio.wait_for(read_frame(reader, 4096), HANDSHAKE_TIMEOUT_S)
        if hello[0] != "hello" or len(hello) != 4 or hello[1] != VERSION or hello[2] != peer:
            raise HandshakeError(f"node {self.id}: bad hello from peer {peer}: {brief(hello)}")
        writer.write(frame(("hello", VERSION, "node", self.id, mac_of(self.secret, hello[3]))))
        return await asyncio.wait_for(read_frame(reader, 4096), HANDSHAKE_TIMEOUT_S)

    # -- connections ------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_name = str(writer.get_extra_info("peername"))
        role = "unknown"
        try:
            role, peer = await asyncio.wait_for(
                self._handshake(reader, writer), HANDSHAKE_TIMEOUT_S
            )
            if role == "node":
                self._in.add(peer)
                self._peer_readers[peer] = reader
                self._peer_inbound[peer] = writer
                self._check_ready()
                await self._serve_peer(reader, peer)
            else:
                self.stats["net/client_connections"] += 1
                self._client_writers.add(writer)
                link = ClientLink(writer, peer_name, self.config.frame_bytes_max)
                await self._serve_client(reader, link)
        except (FrameError, HandshakeError, TimeoutError) as error:
            self.stats["net/rejected_connections"] += 1
            if role == "node" and self._peer_readers.get(peer) is reader:
                # A peer that breaks the wire protocol is lost, as if its link had dropped (or
                # the link back to a restarting peer, to answer its rejoin, failed).
                what = "sent a bad frame" if isinstance(error, FrameError) else "link failed"
                detail = str(error) or type(error).__name__
                logger.warning("node %d: peer %d %s: %s", self.id, peer, what, detail)
                self._peer_lost(peer)
            else:
                logger.warning("node %d: closing connection from %s: %s", self.id, peer_name, error)
            if not writer.is_closing():
                writer.write(frame(("error", str(error)[:200])))
                await _linger(reader, writer)
        except (ConnectionLost, OSError) as error:  # (OSError: reset, unreachable host ...)
            # A client leaving is routine; a peer leaving stalls the epochs (until stop).
            peer_lost = role == "node" and not self.stopped.is_set()
            logger.debug("node %d: %s connection %s ended: %s", self.id, role, peer_name, error)
            if peer_lost and self._peer_readers.get(peer) is reader:
                self._peer_lost(peer)
        except asyncio.CancelledError:  # the event loop ends (after stop): a clean end; raised,
            return  # Python 3.11's stream server logs it as "Exception in callback" at exit
        except Exception as error:  # a bug on this link's path: the link ends, not the node
            logger.error("node %d: %s connection %s failed", self.id, role, peer_name,
                         exc_info=error)  # fmt: skip
            if role == "node" and self._peer_readers.get(peer) is reader:
                self._peer_lost(peer)
        finally:
            if role == "node" and self._peer_readers.get(peer) is reader:
                del self._peer_readers[peer]  # ended: the peer may connect again
                del self._peer_inbound[peer]
            self._client_writers.discard(writer)
            writer.close()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[str, Any]:
        nonce = os.urandom(16)
        writer.write(frame(("hello", VERSION, self.id, nonce)))
        answer = await read_frame(reader, 4096)
        if len(answer) != 5 or answer[0] != "hello":
            raise HandshakeError(f"expected a hello, got {brief(answer)}")
        _, version, role, peer, mac = answer
        if version != VERSION:
            raise HandshakeError(f"protocol version {version!r}, this node speaks {VERSION}")
        if role not in ("client", "node"):
            raise HandshakeError(f"unknown role {role!r}; expected client or node")
        if role == "node" and peer not in self.peers:
            raise HandshakeError(f"unknown peer node {peer!r}; peers are {self.peers}")
        if not check_mac(self.secret, nonce, mac):
            raise HandshakeError("wrong shared secret")
        if role == "node" and self._peer_link_open(peer):
            raise HandshakeError(f"node {self.id}: {PEER_CONNECTED} {peer}")
        writer.write(frame(("ready", self.id)))
        return role, peer

    def _peer_link_open(self, peer: int) -> bool:
        """Whether ``peer``'s current link is open: neither ended nor holding only its end.

        A restarted peer's old link has ended (its process died), or ends before its retries
        give up; a live link means the newcomer is someone else claiming to be ``peer``.
        """
        reader = self._peer_readers.get(peer)
        return reader is not None and not reader.at_eof()

    async def _serve_peer(self, reader: asyncio.StreamReader, peer: int) -> None:
        # Not the config's frame_bytes_max, which bounds one client frame: a peer (past the
        # handshake) sends whole epochs of calls, and reports and error reasons about them.
        limit = FRAME_BODY_MAX
        while True:
            message = await read_frame(reader, limit)
            kind = message[0]
            if len(message) != 4 or not isinstance(message[1], int) or message[2] != peer:
                raise FrameError(f"ill-shaped peer message {brief(message)}")
            epoch, body = message[1], message[3]
            if kind == "inputs":
                check_inputs(peer, body)
                self._inputs.setdefault(epoch, {})[peer] = body
                if self.durability is not None:
                    self.durability.retained.received_inputs(epoch, peer, body)
                self._collector_wake.set()
            elif kind == "values":
                if epoch < self._executed_epochs:
                    pass  # a rejoining peer re-sends the values of epochs this node finished
                elif epoch == self._running_epoch and self._run is not None:
                    peer_body(peer, kind, self._run.deliver, body)
                else:
                    self._values.setdefault(epoch, []).append((peer, body))
            elif kind == "report":
                self._on_report(epoch, peer, body)
            elif kind == "durable" and self.durability is not None:
                self.durability.peer_durable(peer, epoch)
            elif kind == "restart" and self.durability is not None:
                if self.durability.log is None:  # restarting too: a whole-cluster restart
                    peer_body(peer, kind, self._peer_restarting, peer, epoch, body)
                else:
                    await self._answer_rejoin(peer, epoch)
            elif kind == "rejoin" and self.durability is not None:
                peer_body(peer, kind, self.durability.peer_rejoin, peer, body)
            else:
                raise FrameError(f"unknown peer message kind {kind!r}")
            self._wake.set()

    async def _serve_client(self, reader: asyncio.StreamReader, client: ClientLink) -> None:
        limit = self.config.frame_bytes_max
        handlers: dict[str, Callable[[ClientLink, int], None]] = {
            "status": self._answer_status,
            "dump": self._answer_dump,
            "order": self._answer_order,
            "stop": self._answer_stop,
        }
        for count in itertools.count(1):
            message = await read_frame(reader, limit)
            if not count % YIELD_EVERY_FRAMES:  # frames already buffered are read without a
                await asyncio.sleep(0)  # yield: one client's burst must not starve the rest
            kind = message[0]
            if kind == "calls":
                if len(message) != 2 or not isinstance(message[1], tuple):
                    raise FrameError(f"ill-shaped calls message {brief(message)}")
                self._take_calls(client, message[1])
            elif kind in handlers and len(message) == 2 and isinstance(message[1], int):
                handlers[kind](client, message[1])
            else:
                raise FrameError(f"unknown or ill-shaped client message {brief(message)}")

    def _take_calls(self, client: ClientLink, calls: tuple) -> None:
        """Answer each ill-shaped call ERROR alone and add the rest, in order.

        Raises:
            FrameError: a call without a usable call id (nothing of the frame joins the epoch).
        """
        problems = [call_problem(call) for call in calls]  # all checked before any joins
        if not any(problems):
            self._add_calls(client, calls)
            return
        for call, problem in zip(calls, problems, strict=True):
            if problem is not None:
                client.result(call[0], Outcome(Status.ERROR, reason=problem))
        self._add_calls(client, tuple(c for c, p in zip(calls, problems, strict=True) if p is None))

    def _add_calls(self, client: ClientLink, calls: tuple) -> None:
        """Calls ``(call_id, procedure, params)`` join the open epoch, in order."""
        room = max(0, CALLS_WAITING_MAX - len(self._collect))  # bounded: refuse, not grow
        mine = max(0, CLIENT_CALLS_WAITING_MAX - client.waiting)  # one client cannot take it all
        take = min(room, mine)
        taken, refused = calls[:take], calls[take:]
        if taken:
            client.waiting += len(taken)
            self.stats["txn/calls"] += len(taken)
            first = not self._collect
            self._collect.extend([TxnRequest(procedure, params) for _, procedure, params in taken])
            self._callers.extend([(client, call_id) for call_id, _, _ in taken])
            count_max = self.config.epoch_calls_max
            if (
                first
                or (count_max and len(self._collect) >= count_max)
                or self._closed_epochs in self._inputs  # a peer closed it: is it enough now?
            ):
                self._collector_wake.set()
        if refused:
            reason = f"node {self.id} overloaded: {len(self._collect)} calls waiting"
            if mine < room:
                reason = (
                    f"node {self.id} overloaded: this client has {client.waiting} calls "
                    f"waiting (at most {CLIENT_CALLS_WAITING_MAX} of {CALLS_WAITING_MAX})"
                )
        for call_id, _, _ in refused:
            client.result(call_id, Outcome(Status.ERROR, reason=reason))

    # -- admin answers ----------------------------------------------------------------------

    def _answer_status(self, client: ClientLink, call_id: int) -> None:
        client.send(("status", call_id, self.status()))

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.address.host,
            "port": self.address.port,
            "pid": os.getpid(),
            "ready": self.ready.is_set(),
            "workload": self.config.workload,
            "epochs_closed": self._closed_epochs,
            "epochs_executed": self._executed_epochs,
            "waiting_calls": len(self._collect),
            "peers_down": sorted(self._down),
            "rows_held": sum(len(table) for table in self.db.tables.values()),
            "timing_s/cpu": time.process_time(),
            **self.stats,
        }

    def _answer_dump(self, client: ClientLink, call_id: int) -> None:
        try:
            client.send(("dump", call_id, self.owned_dump()))
        except FrameError as error:  # rows beyond what one frame can carry
            client.send(("error", call_id, f"node {self.id} cannot send its rows: {error}"))

    def owned_dump(self) -> dict[str, dict]:
        """This node's rows: those whose conflict key it owns, plus replicated rows."""
        return owned_rows(self.db, self.router, self.id)

    def _answer_order(self, client: ClientLink, call_id: int) -> None:
        if not self.config.order_log:
            client.send(("order", call_id, None))
        else:
            client.send(("order", call_id, tuple(self._order)))

    def _answer_stop(self, client: ClientLink, call_id: int) -> None:
        client.send(("stop", call_id, True))
        logger.info("node %d: stop requested", self.id)
        asyncio.get_running_loop().call_soon(self.stop)

    # -- peers ------------------------------------------------------------------------------

    def _send(self, peer: int, message: Any, data: bytes | None = None) -> None:
        """Send a message to a peer (``data``: the message already framed, to share it)."""
        writer = self._out.get(peer)
        if writer is None:  # down: what it will need is retained for its rejoin
            return
        if data is None:
            try:
                data = frame(message)
            except FrameError as error:  # this node's fault, not the peer's: stop, saying why
                raise DgccError(f"node {self.id}, sending to peer {peer}: {error}") from None
        self.stats["net/peer_messages"] += 1
        self.stats["net/peer_bytes"] += len(data)
        if self.config.delay_ms_max:
            delay_s = self._delay.uniform(0, self.config.delay_ms_max) / 1000
            asyncio.get_running_loop().call_later(delay_s, self._write_later, peer, writer, data)
            return
        try:
            writer.write(data)
        except RuntimeError:  # uvloop: the transport closed itself on a dead peer's socket
            self._peer_lost(peer)

    def _write_later(self, peer: int, writer: asyncio.StreamWriter, data: bytes) -> None:
        """A delayed send (tests only); dropped if the peer went down in between."""
        if self._out.get(peer) is not writer or writer.is_closing():
            return
        try:
            writer.write(data)
        except RuntimeError:
            self._peer_lost(peer)

    def _send_durable(self, epoch: int) -> None:
        for peer in self.peers:
            self._send(peer, ("durable", epoch, self.id, None))

    def _send_restart(self, log_end: int, new: bool, acked: int) -> None:
        for peer in self.peers:
            self._send(peer, ("restart", log_end, self.id, (new, acked)))

    def _peer_restarting(self, peer: int, log_end: int, body: Any) -> None:
        new, acked = body  # (new directory, the epoch its log records as durable everywhere)
        if type(new) is not bool or type(acked) is not int:
            raise ValueError(f"expected (bool, int), got {brief(body, 60)}")
        assert self.durability is not None
        self.durability.peer_restarting(peer, log_end, new, acked)

    async def _drain(self) -> None:
        for peer, writer in list(self._out.items()):
            try:
                await writer.drain()
            except OSError:  # reset, refused; on a real network also timed out, unreachable
                self._peer_lost(peer)

    def _bad_peer(self, peer: int, error: FrameError) -> None:
        """A message of ``peer``'s that was kept for later broke the protocol: both of its
        links end (as when a bad frame arrives), and its epochs wait until it rejoins."""
        logger.warning("node %d: peer %d sent a bad frame: %s", self.id, peer, error)
        inbound = self._peer_inbound.get(peer)
        if inbound is not None:
            inbound.close()  # its reader sees the end; _accept forgets the link
        self._peer_lost(peer)

    def _peer_lost(self, peer: int) -> None:
        """Stop writing to ``peer``: the epochs that need it wait until it rejoins."""
        writer = self._out.pop(peer, None)
        if writer is not None:
            writer.close()
        if peer not in self._down and not self.stopped.is_set():
            self._down.add(peer)
            logger.warning("node %d: peer %d lost; its epochs wait until it rejoins", self.id, peer)

    async def _answer_rejoin(self, peer: int, log_end: int) -> None:
        """``peer`` restarted while this node runs: reconnect and send what it kept for it.

        Everything sent to ``peer`` after the answer follows it on the new connection.
        """
        assert self.durability is not None, "only logging nodes answer a restart"
        self._peer_lost(peer)  # its old connection, if its end went unnoticed
        await self._connect(peer)
        self._down.discard(peer)
        retained = self.durability.retained
        try:
            retained.check_rejoin(peer, log_end)
        except RejoinError as error:
            logger.error("node %d: %s", self.id, error)
            self._send(peer, ("rejoin", 0, self.id, str(error)))
            return
        awaiting = [
            e for e, (assembler, _) in self._assemblers.items() if assembler.waits_for(peer)
        ]
        state = retained.state_for(
            peer,
            executed=self._executed_epochs,
            closed=self._closed_epochs,
            durable=self.durability.durable_epoch,
            awaiting=tuple(awaiting),
        )
        self._send(peer, ("rejoin", 0, self.id, state))
        logger.warning(
            "node %d: peer %d rejoins (its log ends at epoch %d)", self.id, peer, log_end
        )

    def _catch_up(self, plan: RejoinPlan) -> None:
        """Queue the epochs the running peers hold (re-run live); send them what they lack."""
        assert self.durability is not None, "only logging nodes rejoin"
        retained = self.durability.retained
        for epoch, batch in plan.own.items():
            self._inputs.setdefault(epoch, {})[self.id] = batch
            bodies = self._peer_inputs(batch)
            retained.sent_inputs(epoch, bodies)
            for peer in self.peers:
                if epoch in plan.resend_inputs[peer]:
                    self._send(peer, ("inputs", epoch, self.id, bodies[peer]))
        for epoch, by_peer in plan.inputs.items():
            for peer, body in by_peer.items():
                self._inputs.setdefault(epoch, {})[peer] = body
                retained.received_inputs(epoch, peer, body)
        for epoch, bodies in plan.values.items():
            self._values.setdefault(epoch, []).extend(bodies)
        for early in [e for e in self._early_reports if e < plan.closed]:
            del self._early_reports[early]  # their callers died with the old process
        self._closed_epochs = plan.closed
        self._reports_to, self._catch_up_until = plan.reports_to, plan.closed


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Let a refusal's error frame reach its client before the close: end our side, then read
    and drop what the client still sends (bounded); closing with unread input would reset the
    connection and lose the frame."""
    try:
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            dropped = 0
            while dropped < LINGER_BYTES_MAX:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                dropped += len(chunk)
    except (OSError, TimeoutError, ConnectionError, asyncio.CancelledError):
        pass  # (cancelled: the node stops; the connection closes either way)


async def _collect_garbage() -> None:
    """Take the cyclic GC off the hot path: collect only what each ``GC_PERIOD_S`` left.

    Rows (loaded or inserted) are long-lived and acyclic, and an epoch's objects die by
    reference counting (executing epochs leaves no cyclic garbage), yet automatic collections
    keep rescanning them: a quarter of the node's CPU at TPC-C scale, more with larger epochs.
    So automatic collection is off; each period's survivors are scanned once for cycles, then
    frozen out of later scans.
    """
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        while True:
            await asyncio.sleep(GC_PERIOD_S)  # a timer, not a synchronisation
            gc.collect(0)
            gc.freeze()
    finally:
        gc.enable()


async def run_node(
    config: ClusterConfig,
    node_id: int,
    on_ready: Callable[[Node], None],
    node_class: type[Node] | None = None,
) -> None:
    """Run node ``node_id`` until a stop request; ``on_ready`` fires once all peers are up.

    ``node_class`` is the protocol's server (``dgcc.net.servers``); DistDGCC's ``Node`` by default.
    """
    node = (node_class or Node)(config, node_id)
    # A stop request may come while the node still waits for its peers (it listens first):
    # it stops then, not once the peers' connect timeout has run out.
    started = await _unless_stopped(node, node.start())
    collector = None
    if started:
        collector = asyncio.create_task(_collect_garbage())  # the data is loaded (or recovered)
        if await _unless_stopped(node, node.ready.wait()):
            on_ready(node)
    await node.stopped.wait()
    if collector is not None:
        collector.cancel()
    await asyncio.sleep(0)  # let the stop answer leave the socket
    if node.failure is not None:
        raise NodeFailed(node.failure)


async def _unless_stopped(node: Node, awaitable: Awaitable[Any]) -> bool:
    """Await ``awaitable`` unless ``node`` stops first (then it is cancelled); whether it
    finished. What it raises is raised."""
    task = asyncio.ensure_future(awaitable)
    stopped = asyncio.create_task(node.stopped.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False
