"""The network layer of the cluster (every protocol's nodes): wire format, node server, and
client library."""

from dgcc.net.client import AsyncClient, Client, call_each_in_order
from dgcc.net.wire import (
    CallTimeout,
    ConnectionLost,
    FrameError,
    FrameRefused,
    HandshakeError,
    NetError,
)

__all__ = [
    "AsyncClient",
    "CallTimeout",
    "Client",
    "ConnectionLost",
    "FrameError",
    "FrameRefused",
    "HandshakeError",
    "NetError",
    "call_each_in_order",
]
