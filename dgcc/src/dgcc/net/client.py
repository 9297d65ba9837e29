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
import socket
import struct
from collections.abc import Mapping
from typing import Any

from dgcc.api import Outcome, Status
from dgcc.net.wire import (
    FRAME_BYTES_MAX,
    VERSION,
    CallTimeout,
    ConnectionLost,
    FrameError,
    HandshakeError,
    decode,
    frame,
    mac_of,
    read_frame,
)

__all__ = ["AsyncClient", "Client"]

TIMEOUT_S_DEFAULT = 30.0


def _outcome(message: tuple) -> Outcome:
    _, _, status, result, reason = message
    return Outcome(Status(status), result, reason)


def _check_ready(answer: tuple, where: str) -> None:
    if answer[0] == "error":
        raise HandshakeError(f"node at {where} refused the connection: {answer[1]}")
    if answer[0] != "ready":
        raise HandshakeError(f"node at {where} answered {answer!r:.80} to the handshake")


def _hello_answer(hello: tuple, secret: str | None, where: str) -> bytes:
    if hello[0] != "hello" or len(hello) != 4:
        raise HandshakeError(f"node at {where} sent {hello!r:.80} instead of a hello")
    if hello[1] != VERSION:
        raise HandshakeError(f"node at {where} speaks version {hello[1]!r}, we speak {VERSION}")
    return frame(("hello", VERSION, "client", None, mac_of(secret, hello[3])))


class AsyncClient:
    """An asyncio client; create it with ``await AsyncClient.connect(host, port)``."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str, limit: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.where = where
        self._limit = limit
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._closed: BaseException | None = None
        self._outgoing: list[bytes] = []  # frames written together once per loop iteration
        self._reader_task = asyncio.create_task(self._read_loop())

    def _flush(self) -> None:
        data, self._outgoing = b"".join(self._outgoing), []
        if not self._writer.is_closing():
            self._writer.write(data)

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
                if len(message) < 2:
                    raise FrameError(f"ill-shaped answer {message!r:.80}")
                future = self._pending.pop(message[1], None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (ConnectionLost, FrameError, OSError) as error:
            self._closed = error
        finally:
            lost = ConnectionLost(f"connection to {self.where} lost: {self._closed}")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(lost)
            self._pending.clear()

    async def _request(self, kind: str, *args: Any, timeout_s: float | None) -> tuple:
        if self._closed is not None or self._reader_task.done():
            raise ConnectionLost(f"connection to {self.where} is closed: {self._closed}")
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(frame((kind, call_id, *args)))
        try:
            return await asyncio.wait_for(future, timeout_s or TIMEOUT_S_DEFAULT)
        except TimeoutError:
            self._pending.pop(call_id, None)
            raise CallTimeout(f"{kind} to {self.where} got no answer in {timeout_s} s") from None

    async def call(
        self, procedure: str, params: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Outcome:
        """Run ``procedure(params)``; returns its outcome once its epoch committed."""
        return _outcome(await self._request("call", procedure, dict(params), timeout_s=timeout_s))

    async def status(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return (await self._request("status", timeout_s=timeout_s))[2]

    async def dump(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return (await self._request("dump", timeout_s=timeout_s))[2]

    async def order(self, *, timeout_s: float | None = None) -> Any:
        return (await self._request("order", timeout_s=timeout_s))[2]

    async def stop_node(self, *, timeout_s: float | None = None) -> None:
        await self._request("stop", timeout_s=timeout_s)

    async def close(self) -> None:
        self._writer.close()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


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
        self.timeout_s = timeout_s
        self._limit = frame_bytes_max
        self._ids = itertools.count(1)
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as error:
            raise ConnectionLost(f"cannot connect to {self.where}: {error}") from None
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.sendall(_hello_answer(self._read(), secret, self.where))
            _check_ready(self._read(), self.where)
        except BaseException:
            self._sock.close()
            raise

    def _read_exactly(self, count: int) -> bytes:
        chunks, left = [], count
        while left:
            try:
                chunk = self._sock.recv(left)
            except TimeoutError:
                raise CallTimeout(f"{self.where} sent nothing for {self.timeout_s} s") from None
            if not chunk:
                raise ConnectionLost(f"{self.where} closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read(self) -> tuple:
        (length,) = struct.unpack(">I", self._read_exactly(4))
        if length > self._limit:
            raise FrameError(f"frame of {length} bytes from {self.where} exceeds {self._limit}")
        return decode(self._read_exactly(length))

    def _request(self, kind: str, *args: Any) -> tuple:
        call_id = next(self._ids)
        self._sock.sendall(frame((kind, call_id, *args)))
        while True:
            message = self._read()
            if len(message) >= 2 and message[1] == call_id:
                return message

    def call(self, procedure: str, params: Mapping[str, Any]) -> Outcome:
        """Run ``procedure(params)``; returns its outcome once its epoch committed."""
        return _outcome(self._request("call", procedure, dict(params)))

    def status(self) -> dict[str, Any]:
        return self._request("status")[2]

    def dump(self) -> dict[str, Any]:
        return self._request("dump")[2]

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
