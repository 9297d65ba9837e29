"""The wire format: length-prefixed msgpack frames, the handshake, and the net exception tree.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack. Arrays decode as
tuples (so tuple keys stay hashable and dumps compare equal across nodes) and map keys may be
any hashable msgpack value. Every message is a tuple whose first item is its kind (a short
string). A frame longer than the limit, undecodable bytes, or a message of the wrong shape
raise ``FrameError``; the server closes only that connection.

Handshake (server speaks first): ``("hello", VERSION, node_id, nonce)``; the peer answers
``("hello", VERSION, role, peer_node, mac)`` where ``mac`` is HMAC-SHA256(secret, nonce) when the
cluster has a secret (required when any node listens beyond loopback), and the server answers
``("ready", node_id)`` or an ``("error", reason)`` frame and closes.

Client messages carry calls in batches, since a load generator keeps thousands in flight:
``("calls", ((call_id, procedure, params), ...))`` in, ``("results", ((call_id, status,
result, reason), ...))`` out (answers in any order, matched by id), plus the admin requests
``(kind, request_id)`` for ``status``, ``dump``, ``order`` and ``stop``, answered by
``(kind, request_id, payload)``, or by ``("error", request_id, reason)`` when the answer cannot
be sent (a dump larger than any frame).

    NetError
     ├── FrameError        bytes off the wire are not a valid frame or message
     ├── HandshakeError    version, role or secret mismatch
     ├── ConnectionLost    the other side closed or reset the connection
     └── CallTimeout       no answer within the caller's timeout
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgpack

from dgcc.errors import DgccError, brief

__all__ = [
    "FRAME_BODY_MAX",
    "FRAME_BYTES_MAX",
    "VERSION",
    "CallTimeout",
    "ConnectionLost",
    "FrameError",
    "FrameRefused",
    "HandshakeError",
    "NetError",
    "decode",
    "encode",
    "frame",
    "mac_of",
    "read_frame",
    "run_async",
]

VERSION = 2  # 2: a restart announces (new directory, acked epoch)
FRAME_BYTES_MAX = 64 * 1024 * 1024
FRAME_BODY_MAX = 2**32 - 1  # the most a frame's 4-byte header can announce
_HEADER = struct.Struct(">I")
T = TypeVar("T")


class NetError(DgccError):
    """A transport failure or a peer breaking the wire protocol."""


class FrameError(NetError):
    """Bytes off the wire are not a valid frame or message."""


class HandshakeError(NetError):
    """The handshake failed: version, role or shared secret mismatch."""


class ConnectionLost(NetError):
    """The other side closed or reset the connection."""


class FrameRefused(ConnectionLost):
    """The node refused a frame this client sent (too large, ill-formed) and closed the
    connection: that frame's calls did not run (earlier ones still unanswered may have)."""


class CallTimeout(NetError):
    """No answer arrived within the caller's timeout."""


def encode(message: Any) -> bytes:
    """Raises FrameError for a value msgpack cannot carry (an int beyond 64 bits, an object)."""
    try:
        return msgpack.packb(message, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as error:
        raise FrameError(f"a {_kind(message)!r} message cannot be encoded: {error}") from None


def unencodable(value: Any) -> str | None:
    """Why msgpack cannot carry ``value`` (an int beyond 64 bits, an object ...), or None."""
    try:
        msgpack.packb(value, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def frame(message: Any) -> bytes:
    """A message as one length-prefixed frame.

    Raises:
        FrameError: the message holds a value msgpack cannot carry, or encodes to more bytes
            than a frame header can announce.
    """
    body = encode(message)
    if len(body) > FRAME_BODY_MAX:
        raise FrameError(
            f"a {_kind(message)!r} message of {len(body):,} bytes does not fit one frame "
            f"(at most {FRAME_BODY_MAX:,} bytes)"
        )
    return _HEADER.pack(len(body)) + body


def _kind(message: Any) -> str:
    """A message's kind for an error (its first item), or its type when it has none."""
    return message[0] if isinstance(message, tuple) and message else type(message).__name__


def decode(body: bytes) -> tuple:
    """Decode one frame body into a message tuple whose first item is a string kind."""
    try:
        message = msgpack.unpackb(body, use_list=False, strict_map_key=False, raw=False)
    except Exception as error:  # msgpack raises several unrelated types on garbage
        raise FrameError(
            f"undecodable frame of {len(body)} bytes: {type(error).__name__}"
        ) from None
    if not isinstance(message, tuple) or not message or not isinstance(message[0], str):
        raise FrameError(f"message must be a tuple starting with its kind, got {brief(message)}")
    return message


async def read_frame(reader: asyncio.StreamReader, frame_bytes_max: int) -> tuple:
    """Read and decode one frame.

    Raises:
        FrameError: the announced length exceeds ``frame_bytes_max`` or the body is garbage.
        ConnectionLost: the stream ended, cleanly or mid-frame.
    """
    try:
        header = await reader.readexactly(_HEADER.size)
        (length,) = _HEADER.unpack(header)
        if length > frame_bytes_max:
            raise FrameError(f"frame of {length} bytes exceeds the limit of {frame_bytes_max}")
        body = await reader.readexactly(length)
    except (asyncio.IncompleteReadError, OSError) as error:  # (reset, timed out, unreachable)
        raise ConnectionLost(f"connection closed: {type(error).__name__}") from None
    return decode(body)


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on uvloop's faster event loop when it is installed."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def mac_of(secret: str | None, nonce: object) -> bytes:
    """HMAC-SHA256 of the server's nonce under the shared secret (empty without one).

    Raises:
        HandshakeError: the nonce (off the wire) is not bytes.
    """
    if not secret:
        return b""
    if not isinstance(nonce, bytes):
        raise HandshakeError(f"the hello's nonce must be bytes, got {type(nonce).__name__}")
    return hmac.new(secret.encode(), nonce, hashlib.sha256).digest()


def check_mac(secret: str | None, nonce: bytes, mac: object) -> bool:
    if not secret:
        return True
    return isinstance(mac, bytes) and hmac.compare_digest(mac_of(secret, nonce), mac)
