"""Client library: call a procedure on any node and get its outcome once it is committed.

``AsyncClient`` (asyncio) keeps many calls in flight on one connection and matches answers by
call id; ``Client`` is a blocking socket client for scripts and the CLI. Both perform the
handshake of ``dgcc.net.wire`` (with the shared secret when the cluster has one) and raise
``CallTimeout``, ``ConnectionLost`` or ``HandshakeError`` with the node's address in the
message. A logic abort is an ``Outcome`` with status ABORTED and its reason, never an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dgcc.api import Outcome, Status
from dgcc.errors import brief
from dgcc.net.wire import (
    FRAME_BYTES_MAX,
    VERSION,
    CallTimeout,
    ConnectionLost,
    FrameError,
    FrameRefused,
    HandshakeError,
    NetError,
    decode,
    frame,
    mac_of,
    read_frame,
)

__all__ = ["AsyncClient", "Client", "call_each_in_order"]

logger = logging.getLogger(__name__)

TIMEOUT_S_DEFAULT = 30.0
CALLS_PER_FRAME_MAX = 1000  # keeps a calls frame far below any sane frame limit
RECV_BYTES_MAX = 1 << 20  # one recv's buffer, whatever length a frame header announces


_STATUSES = {status.value: status for status in Status}


def _check_ready(answer: tuple, where: str) -> None:
    if answer[0] == "error":
        raise HandshakeError(f"node at {where} refused the connection: {answer[1]}")
    if answer[0] != "ready":
        raise HandshakeError(f"node at {where} answered {brief(answer)} to the handshake")


def _hello_answer(hello: tuple, secret: str | None, where: str) -> bytes:
    if hello[0] != "hello" or len(hello) != 4:
        raise HandshakeError(f"node at {where} sent {brief(hello)} instead of a hello")
    if hello[1] != VERSION:
        raise HandshakeError(
            f"node at {where} speaks version {brief(hello[1])}, we speak {VERSION}"
        )
    return frame(("hello", VERSION, "client", None, mac_of(secret, hello[3])))


class AsyncClient:
    """An asyncio client; create it with ``await AsyncClient.connect(host, port)``.

    ``call`` awaits one outcome; ``submit`` hands it to a callback instead (no future, no
    timer: what a load generator with thousands of calls in flight wants). Calls submitted in
    one loop iteration leave in one ``calls`` frame.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str, limit: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.where = where
        self._limit = limit
        self._ids = itertools.count(1)
        self._callbacks: dict[int, Callable[[Outcome | NetError], None]] = {}
        self._pending: dict[int, asyncio.Future] = {}  # admin requests by id
        self._closed: BaseException | None = None
        self._calls: list[tuple[int, str, dict]] = []  # sent together once per loop iteration
        self._frames: list[bytes] = []
        self._reader_task = asyncio.create_task(self._read_loop())

    @property
    def in_flight(self) -> int:
        """Calls submitted and not yet answered."""
        return len(self._callbacks)

    def _schedule_flush(self) -> None:
        if not self._calls and not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        calls, self._calls = self._calls, []
        for start in range(0, len(calls), CALLS_PER_FRAME_MAX):
            chunk = calls[start : start + CALLS_PER_FRAME_MAX]
            try:
                self._frames.append(frame(("calls", chunk)))
            except FrameError:  # a call msgpack cannot carry, or too big: it fails alone
                self._frames += filter(None, map(self._frame_alone, chunk))
        data, self._frames = b"".join(self._frames), []
        if not self._writer.is_closing():
            self._writer.write(data)

    def _frame_alone(self, call: tuple[int, str, dict]) -> bytes | None:
        """One call's frame, or None after failing the call with the reason it has none."""
        try:
            return frame(("calls", [call]))
        except FrameError as error:
            callback = self._callbacks.pop(call[0], None)
            if callback is not None:
                callback(FrameError(f"call {call[1]!r} cannot be sent: {error}"))
            return None

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        secret: str | None = None,
        timeout_s: float = TIMEOUT_S_DEFAULT,
        frame_bytes_max: int = FRAME_BYTES_MAX,
    ) -> AsyncClient:
        """Connect and handshake; raises ConnectionLost, HandshakeError or CallTimeout."""
        where = f"{host}:{port}"
        writer = None
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port, limit=2**20)
                writer.write(_hello_answer(await read_frame(reader, 4096), secret, where))
                _check_ready(await read_frame(reader, 4096), where)
        except BaseException as error:
            if writer is not None:
                writer.close()
            if isinstance(error, TimeoutError):
                raise CallTimeout(f"no handshake with {where} within {timeout_s} s") from None
            if isinstance(error, OSError):
                raise ConnectionLost(f"cannot connect to {where}: {error}") from None
            raise
        return cls(reader, writer, where, frame_bytes_max)

    async def _read_loop(self) -> None:
        try:
            while True:
                message = await read_frame(self._reader, self._limit)
                if message[0] == "results" and len(message) == 2 and type(message[1]) is tuple:
                    self._answer_calls(message[1])
                    continue
                _raise_if_refused(message, self.where)
                if len(message) < 2:
                    raise FrameError(f"ill-shaped answer {brief(message)}")
                future = self._pending.pop(message[1], None)
                if future is not None and not future.done():
                    if message[0] == "error":  # the node cannot answer this request
                        future.set_exception(FrameError(_refusal(message, self.where)))
                    else:
                        future.set_result(message)
        except (ConnectionLost, FrameError, OSError) as error:
            self._closed = error
        finally:
            lost = self._closed
            if not isinstance(lost, FrameRefused):
                lost = ConnectionLost(f"connection to {self.where} lost: {self._closed}")
            self._closed = self._closed or lost
            self._writer.close()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(lost)
            self._pending.clear()
            callbacks, self._callbacks = self._callbacks, {}
            for callback in callbacks.values():
                _tell(callback, lost)

    def _answer_calls(self, results: tuple) -> None:
        callbacks = self._callbacks
        for result in results:
            if not isinstance(result, tuple) or len(result) != 4 or type(result[0]) is not int:
                raise FrameError(f"ill-shaped call result {brief(result)}")
            call_id, status, value, reason = result
            if not isinstance(status, str) or status not in _STATUSES:
                raise FrameError(f"unknown call status {status!r}")
            callback = callbacks.pop(call_id, None)
            if callback is not None:  # None: a call whose caller timed out
                _tell(callback, Outcome(_STATUSES[status], value, reason))

    def _check_open(self) -> None:
        if self._closed is not None or self._reader_task.done():
            raise ConnectionLost(f"connection to {self.where} is closed ({self._closed})")

    def submit(
        self,
        procedure: str,
        params: Mapping[str, Any],
        done: Callable[[Outcome | NetError], None],
    ) -> int:
        """Send ``procedure(params)``; ``done`` gets its outcome once committed (or the
        ``ConnectionLost`` that ended the wait, or a ``FrameError`` when the params cannot be
        sent: a value msgpack cannot carry, too many bytes). Returns the call id.

        Raises:
            ConnectionLost: the connection is already closed.
        """
        self._check_open()
        call_id = next(self._ids)
        self._callbacks[call_id] = done
        self._schedule_flush()
        self._calls.append((call_id, procedure, params if type(params) is dict else dict(params)))
        return call_id

    async def call(
        self, procedure: str, params: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Outcome:
        """Run ``procedure(params)``; returns its outcome once its epoch committed.

        Raises:
            CallTimeout: no outcome within ``timeout_s`` (default 30 s).
            ConnectionLost: the connection closed before the outcome came.
            FrameError: the call cannot be sent (its params hold a value msgpack cannot
                carry, or encode to more than a frame holds); the connection stays usable.
        """
        future = asyncio.get_running_loop().create_future()

        def done(result: Outcome | NetError) -> None:
            if not future.done():
                if isinstance(result, Outcome):
                    future.set_result(result)
                else:
                    future.set_exception(result)

        timeout_s = _timeout(timeout_s)
        call_id = self.submit(procedure, params, done)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self._callbacks.pop(call_id, None)
            raise CallTimeout(f"call to {self.where} got no answer in {timeout_s} s") from None

    async def _request(self, kind: str, *, timeout_s: float | None) -> tuple:
        self._check_open()
        timeout_s = _timeout(timeout_s)
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._schedule_flush()
        self._frames.append(frame((kind, request_id)))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self._pending.pop(request_id, None)
            raise CallTimeout(f"{kind} to {self.where} got no answer in {timeout_s} s") from None

    async def status(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return (await self._request("status", timeout_s=timeout_s))[2]

    async def dump(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return (await self._request("dump", timeout_s=timeout_s))[2]

    async def order(self, *, timeout_s: float | None = None) -> Any:
        return (await self._request("order", timeout_s=timeout_s))[2]

    async def stop_node(self, *, timeout_s: float | None = None) -> None:
        await self._request("stop", timeout_s=timeout_s)

    async def close(self) -> None:
        if self._closed is None:
            self._closed = ConnectionLost(f"the client of {self.where} was closed")
        self._writer.close()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def call_each_in_order(
    addresses: Sequence[tuple[str, int]],
    requests: Sequence[Sequence[Any]],
    *,
    secret: str | None = None,
    timeout_s: float = TIMEOUT_S_DEFAULT,
) -> list[list[Outcome]]:
    """Send ``requests[n]`` (objects with ``procedure`` and ``params``) to ``addresses[n]``, each
    node's calls pipelined on one connection in order; the outcomes, per node, in send order."""
    clients: list[AsyncClient] = []
    try:
        for host, port in addresses:  # (inside: a later connect that fails closes the earlier)
            clients.append(await AsyncClient.connect(host, port, secret=secret))
        calls = [
            asyncio.gather(*(c.call(r.procedure, r.params, timeout_s=timeout_s) for r in batch))
            for c, batch in zip(clients, requests, strict=True)
        ]
        return list(await asyncio.gather(*calls))
    finally:
        for client in clients:
            await client.close()


class Client:
    """A blocking client, one call at a time."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        secret: str | None = None,
        timeout_s: float = TIMEOUT_S_DEFAULT,
        frame_bytes_max: int = FRAME_BYTES_MAX,
    ) -> None:
        self.where = f"{host}:{port}"
        self.timeout_s = _timeout(timeout_s)  # (0 would make the socket non-blocking)
        self._limit = frame_bytes_max
        self._ids = itertools.count(1)
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as error:
            raise ConnectionLost(f"cannot connect to {self.where}: {error}") from None
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                hello = self._read()
            except CallTimeout:  # something accepted the connection, but no node greeted
                raise CallTimeout(
                    f"{self.where} accepted the connection but sent no greeting within "
                    f"{self.timeout_s} s: not a dgcc node, or one too busy to answer"
                ) from None
            self._send(_hello_answer(hello, secret, self.where))
            _check_ready(self._read(), self.where)
        except BaseException:
            self._sock.close()
            raise

    def _read_exactly(self, count: int) -> bytes:
        chunks, left = [], count
        while left:
            try:  # bounded: memory grows with what arrives, not with what a header announces
                chunk = self._sock.recv(min(left, RECV_BYTES_MAX))
            except TimeoutError:
                self._sock.close()  # the stream may stop mid-frame: it cannot be read on
                raise CallTimeout(
                    f"{self.where} sent nothing for {self.timeout_s} s (connection closed)"
                ) from None
            except OSError as error:
                raise ConnectionLost(f"connection to {self.where} lost: {error}") from None
            if not chunk:
                raise ConnectionLost(f"{self.where} closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read(self, limit: int | None = None) -> tuple:
        limit = self._limit if limit is None else limit
        (length,) = struct.unpack(">I", self._read_exactly(4))
        if length > limit:
            raise FrameError(f"frame of {length} bytes from {self.where} exceeds {limit}")
        return decode(self._read_exactly(length))

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as error:  # (a closed socket too: after a timeout, or close())
            raise ConnectionLost(f"connection to {self.where} lost: {error}") from None

    def _request(self, kind: str, limit: int | None = None) -> tuple:
        request_id = next(self._ids)
        self._send(frame((kind, request_id)))
        while True:
            message = self._read(limit)
            _raise_if_refused(message, self.where)
            if len(message) >= 2 and message[1] == request_id:
                if message[0] == "error":  # the node cannot answer this request
                    raise FrameError(_refusal(message, self.where))
                return message

    def call(self, procedure: str, params: Mapping[str, Any]) -> Outcome:
        """Run ``procedure(params)``; returns its outcome once its epoch committed."""
        call_id = next(self._ids)
        self._send(frame(("calls", ((call_id, procedure, dict(params)),))))
        while True:
            message = self._read()
            _raise_if_refused(message, self.where)
            if message[0] != "results" or len(message) != 2:
                continue
            for result in message[1]:
                if isinstance(result, tuple) and len(result) == 4 and result[0] == call_id:
                    _, status, value, reason = result
                    if not isinstance(status, str) or status not in _STATUSES:
                        raise FrameError(f"unknown call status {status!r} from {self.where}")
                    return Outcome(_STATUSES[status], value, reason)

    def status(self) -> dict[str, Any]:
        return self._request("status")[2]

    def dump(self, *, frame_bytes_max: int | None = None) -> dict[str, Any]:
        """The node's rows, in one answer of at most ``frame_bytes_max`` bytes (default: the
        client's limit); a node's rows may outgrow a limit sized for calls
        (``local_cluster.check``)."""
        return self._request("dump", frame_bytes_max)[2]

    def order(self) -> Any:
        return self._request("order")[2]

    def stop_node(self) -> None:
        self._request("stop")

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _timeout(timeout_s: float | None) -> float:
    """A call's or request's timeout: None is the default; it must be positive."""
    if timeout_s is None:
        return TIMEOUT_S_DEFAULT
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 (or None for {TIMEOUT_S_DEFAULT:g} s)")
    return timeout_s


def _tell(callback: Callable[[Outcome | NetError], None], result: Outcome | NetError) -> None:
    """Hand a call's result to its ``submit`` callback; one that raises is the caller's bug,
    logged, and does not stop the answers to the other calls."""
    try:
        callback(result)
    except Exception:
        logger.exception("a call's done callback raised")


def _raise_if_refused(message: tuple, where: str) -> None:
    """Raise FrameRefused for a node's ``("error", reason)``: its answer to a frame it would
    not read, sent as it closes the connection (an admin request's error carries its id)."""
    if message[0] == "error" and len(message) == 2:
        raise FrameRefused(f"{where} refused a frame: {brief(message[1], 300)}")


def _refusal(message: tuple, where: str) -> str:
    """The reason in a node's ``("error", request_id, reason)`` answer to an admin request."""
    reason = message[2] if len(message) > 2 else "no reason given"
    return f"{where} cannot answer: {reason}"
