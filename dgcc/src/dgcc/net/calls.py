"""A node's side of its client connections: the link answers go out on, and the check of one
call entry of a ``calls`` message (a bad entry is answered ERROR alone; one without a usable
call id closes the connection, since no answer could reach its caller)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dgcc.api import Outcome
from dgcc.errors import brief
from dgcc.net.wire import FrameError, frame, unencodable

__all__ = ["RESULTS_PER_FRAME_MAX", "ClientLink", "call_problem"]

RESULTS_PER_FRAME_MAX = 1000  # keeps a results frame far below any sane frame limit
# Answers written but not yet taken by the client (the socket's buffers full): a client that
# stops reading while its calls go on committing would otherwise grow the node without bound.
# Checked before each write, so one answer may exceed it (a dump of a node's rows).
ANSWERS_BUFFERED_MAX = 64 * 2**20

logger = logging.getLogger(__name__)


class ClientLink:
    """A connected client; answers are gathered and written once per loop iteration.

    Call results go out batched, ``RESULTS_PER_FRAME_MAX`` to a ``results`` frame and no frame
    over ``frame_bytes_max`` (the client's limit, as ours: a larger frame would end its
    connection, and every call in flight on it, not one answer).
    """

    __slots__ = ("_frames", "_results", "frame_bytes_max", "name", "waiting", "writer")

    def __init__(
        self, writer: asyncio.StreamWriter, name: str, frame_bytes_max: int = 64 * 2**20
    ) -> None:
        self.writer = writer
        self.name = name
        self.frame_bytes_max = frame_bytes_max
        self.waiting = 0  # its calls collected and not yet in a closed epoch (the node counts)
        self._frames: list[bytes] = []
        self._results: list[tuple] = []

    def send(self, message: Any) -> None:
        """Send one (admin) message. One that finds answers already waiting past
        ``ANSWERS_BUFFERED_MAX`` (a client asking for dump after dump without reading them)
        closes the connection instead of growing the node."""
        if not self._frames and not self._results:
            asyncio.get_running_loop().call_soon(self._flush)
        else:
            waiting = sum(map(len, self._frames)) + self.writer.transport.get_write_buffer_size()
            if waiting > ANSWERS_BUFFERED_MAX:
                self._overflow(waiting)
                return
        self._frames.append(frame(message))

    def _overflow(self, buffered: int) -> None:
        if not self.writer.is_closing():
            logger.warning(
                "closing client %s: %d bytes of answers wait for it to read them (at most %d)",
                self.name,
                buffered,
                ANSWERS_BUFFERED_MAX,
            )
            self.writer.transport.abort()

    def result(self, call_id: int, outcome: Outcome) -> None:
        """Answer call ``call_id``."""
        self.results([(call_id, outcome.status.value, outcome.result, outcome.reason)])

    def results(self, entries: list[tuple]) -> None:
        """Answer calls: ``(call_id, status value, result, reason)`` each."""
        if not self._frames and not self._results:
            asyncio.get_running_loop().call_soon(self._flush)
        self._results.extend(entries)

    def _flush(self) -> None:
        results, self._results = self._results, []
        for start in range(0, len(results), RESULTS_PER_FRAME_MAX):
            self._frames += self._result_frames(results[start : start + RESULTS_PER_FRAME_MAX])
        data, self._frames = b"".join(self._frames), []
        if self.writer.is_closing():  # a client that died mid-call just loses its answers
            return
        # What earlier flushes left unread decides, not this one: a single answer larger than
        # the bound (a whole node's rows for ``dump``) still goes out to a client that reads.
        buffered = self.writer.transport.get_write_buffer_size()
        if buffered > ANSWERS_BUFFERED_MAX:  # it stopped reading: its later answers are lost
            self._overflow(buffered)
            return
        self.writer.write(data)

    def _result_frames(self, chunk: list[tuple]) -> list[bytes]:
        """``results`` frames of the answers in ``chunk``, halved until each fits the
        client's frame limit; an answer that cannot go (msgpack cannot carry its result, or it
        alone is too large) goes with its status, no result and a reason."""
        try:
            data: bytes | None = frame(("results", chunk))
        except FrameError:  # a result msgpack cannot carry: that call alone fails
            data = None
        if data is not None and len(data) - 4 <= self.frame_bytes_max:
            return [data]
        if len(chunk) > 1:
            middle = len(chunk) // 2
            return self._result_frames(chunk[:middle]) + self._result_frames(chunk[middle:])
        if data is None:
            return [frame(("results", [_sendable(chunk[0])]))]
        call_id, status, _, _ = chunk[0]
        why = f"its result of {len(data)} bytes exceeds the client's frame limit"
        entry = (call_id, status, None, f"the call's result cannot be sent ({why})")
        return [frame(("results", [entry]))]


def _sendable(entry: tuple) -> tuple:
    """``entry`` if it encodes, else its call's status with no result and a reason saying why
    (a call that committed did commit; only its result is lost)."""
    why = unencodable(entry)
    if why is None:
        return entry
    return (entry[0], entry[1], None, f"the call's result cannot be sent ({why})")


def call_problem(call: object) -> str | None:
    """What is wrong with one entry ``(call_id, procedure, params)`` of a ``calls`` message.

    Raises:
        FrameError: the entry has no usable call id, so no answer could reach its caller.
    """
    if not isinstance(call, tuple) or not call or not isinstance(call[0], int):
        raise FrameError(f"ill-shaped call {brief(call)}: it must start with an int call id")
    if len(call) != 3:
        return f"a call is (call_id, procedure, params), got {len(call)} items: {brief(call)}"
    if not isinstance(call[1], str):
        return f"procedure must be a string, got {type(call[1]).__name__} {brief(call[1])}"
    if not isinstance(call[2], dict):
        return f"params must be a map, got {type(call[2]).__name__} {brief(call[2])}"
    return None
