"""What a node writes to a client: frames it can announce and encode, answers split to the
client's frame limit, a result msgpack cannot carry lost alone, and a client that stops reading
its answers (or piles up admin answers) closed instead of buffered without bound.

Method: ``frame`` and ``ClientLink`` driven directly, the link writing into an in-memory writer
whose transport reports how much the client has not read; no sockets, no nodes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dgcc.net import FrameError
from dgcc.net.wire import decode, frame


def test_frame_refuses_a_body_its_header_cannot_announce(monkeypatch):
    import dgcc.net.wire as wire

    monkeypatch.setattr(wire, "FRAME_BODY_MAX", 10)
    assert len(frame(("ok",))) == 4 + len(wire.encode(("ok",)))
    size = len(wire.encode(("calls", "x" * 10)))
    with pytest.raises(FrameError, match=f"a 'calls' message of {size} bytes does not fit one"):
        frame(("calls", "x" * 10))


class _Writer:
    """A client link's writer: keeps what is written; its transport holds ``buffered`` bytes
    the client has not read yet."""

    def __init__(self, buffered: int = 0) -> None:
        self.data = b""
        self.transport = self
        self.buffered, self.aborted = buffered, False

    def is_closing(self) -> bool:
        return self.aborted

    def write(self, data: bytes) -> None:
        self.data += data

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def abort(self) -> None:
        self.aborted = True


def test_a_client_that_stops_reading_its_answers_is_closed(caplog):
    from dgcc.net.calls import ANSWERS_BUFFERED_MAX, ClientLink

    writer = _Writer(buffered=ANSWERS_BUFFERED_MAX)
    link = ClientLink(writer, "slow")  # type: ignore[arg-type]
    link._results = [(1, "committed", 7, "")]
    link._flush()
    assert not writer.aborted and writer.data  # at the limit: kept
    written = writer.data
    writer.buffered += 1
    link._results = [(2, "committed", 7, "")]
    link._flush()
    assert writer.aborted and "closing client slow" in caplog.text
    assert writer.data == written  # the answer it would not read is dropped, not buffered


def test_one_answer_larger_than_the_bound_goes_to_a_client_that_reads(monkeypatch):
    # A node's dump of 1 TPC-C warehouse is about 128 MB, twice ANSWERS_BUFFERED_MAX: it must
    # reach a client that has read everything before (the bound is on answers left unread).
    import dgcc.net.calls as calls

    monkeypatch.setattr(calls, "ANSWERS_BUFFERED_MAX", 1000)
    writer = _Writer()

    async def go() -> None:
        link = calls.ClientLink(writer, "checker")  # type: ignore[arg-type]
        link.send(("dump", 1, {"rows": "r" * 5000}))
        await asyncio.sleep(0)  # the flush scheduled by send runs

    asyncio.run(go())
    assert not writer.aborted
    [(_, answer)] = _written_frames(writer.data)
    assert answer == ("dump", 1, {"rows": "r" * 5000})


def _written_frames(data: bytes) -> list[tuple[int, Any]]:
    frames = []
    while data:
        length = int.from_bytes(data[:4], "big")
        frames.append((length, decode(data[4 : 4 + length])))
        data = data[4 + length :]
    return frames


def test_answers_go_in_frames_the_client_can_read():
    # A frame over the client's limit would end its connection and every call on it: the
    # answers are split to fit, and one answer too large alone loses only its result.
    from dgcc.net.calls import ClientLink

    writer = _Writer()
    link = ClientLink(writer, "test", frame_bytes_max=1000)  # type: ignore[arg-type]
    link._results = [(i, "committed", "x" * 300, None) for i in range(6)]
    link._results.append((6, "committed", "y" * 5000, None))
    link._flush()
    frames = _written_frames(writer.data)
    assert len(frames) > 2 and all(length <= 1000 for length, _ in frames)
    answers = [entry for _, (_, entries) in frames for entry in entries]
    assert [entry[0] for entry in answers] == list(range(7))
    assert answers[5] == (5, "committed", "x" * 300, None)
    assert answers[6][:3] == (6, "committed", None)
    assert "exceeds the client's frame limit" in answers[6][3]


def test_admin_answers_piling_up_unread_close_the_client(caplog, monkeypatch):
    # One client asking for dump after dump in one burst: beyond ANSWERS_BUFFERED_MAX bytes
    # waiting, the connection closes instead of the node encoding every dump.
    import dgcc.net.calls as calls

    monkeypatch.setattr(calls, "ANSWERS_BUFFERED_MAX", 10_000)
    writer = _Writer()

    async def go() -> int:
        link = calls.ClientLink(writer, "greedy")  # type: ignore[arg-type]
        for request in range(100):
            link.send(("dump", request, {"rows": "r" * 3000}))
        return len(link._frames)

    kept = asyncio.run(go())
    assert writer.aborted and kept < 10 and "closing client greedy" in caplog.text


def test_a_result_msgpack_cannot_carry_loses_only_that_result():
    # A procedure's result with an int beyond 64 bits: its call is answered with its status,
    # no result and a reason; the other answers in the frame go out as they are.
    from dgcc.net.calls import ClientLink

    writer = _Writer()
    link = ClientLink(writer, "test")  # type: ignore[arg-type]
    link._results = [(1, "committed", 2**70, ""), (2, "committed", 7, "")]
    link._flush()
    answers, data = [], writer.data
    while data:  # the frames written (one per answer once one could not be encoded)
        length = int.from_bytes(data[:4], "big")
        kind, entries = decode(data[4 : 4 + length])
        assert kind == "results"
        answers += entries
        data = data[4 + length :]
    assert answers[1] == (2, "committed", 7, "")
    assert answers[0][:3] == (1, "committed", None)
    reason = answers[0][3]
    assert "the call's result cannot be sent (OverflowError: " in reason, reason


def test_frame_refuses_values_msgpack_cannot_carry():
    with pytest.raises(FrameError, match="a 'calls' message cannot be encoded"):
        frame(("calls", 2**70))
