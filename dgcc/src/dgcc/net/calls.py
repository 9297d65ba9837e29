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
ANSWERS_BUFFERED_MAX = 64 * 2**20

logger = logging.getLogger(__name__)


class ClientLink:
    """A connected client; answers are gathered and written once per loop iteration.

    Call results go out batched, ``RESULTS_PER_FRAME_MAX`` to a ``results`` frame.
    """

    __slots__ = ("_frames", "_results", "name", "writer")

    def __init__(self, writer: asyncio.StreamWriter, name: str) -> None:
        self.writer = writer
        self.name = name
        self._frames: list[bytes] = []
        self._results: list[tuple] = []

    def send(self, message: Any) -> None:
        """Send one (admin) message."""
        if not self._frames and not self._results:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(frame(message))

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
            chunk = results[start : start + RESULTS_PER_FRAME_MAX]
            try:
                self._frames.append(frame(("results", chunk)))
            except FrameError:  # a result msgpack cannot carry: that call alone fails
                self._frames.extend(frame(("results", [_sendable(entry)])) for entry in chunk)
        data, self._frames = b"".join(self._frames), []
        if self.writer.is_closing():  # a client that died mid-call just loses its answers
            return
        self.writer.write(data)
        buffered = self.writer.transport.get_write_buffer_size()
        if buffered > ANSWERS_BUFFERED_MAX:  # it stopped reading: its later answers are lost
            logger.warning(
                "closing client %s: %d bytes of answers wait for it to read them (at most %d)",
                self.name,
                buffered,
                ANSWERS_BUFFERED_MAX,
            )
            self.writer.transport.abort()


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
