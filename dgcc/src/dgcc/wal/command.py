"""Command logging: an epoch's block is its requests in global order; replay re-runs them serially.

The smallest log, and the slowest recovery: every read and every piece runs again, one after
another (Malviya et al. 2014). The baseline dependency logging is measured against.

Requests are logged as plain ``(procedure, params)`` pairs, which pickle about twice as fast
as the dataclass; a malformed request (not a ``TxnRequest``) is logged as ``None``: it never
ran, and replaying it as ``None`` fails the same way without touching state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dgcc.api import ProcedureRegistry, TxnRequest
from dgcc.protocols.serial import SerialProtocol
from dgcc.storage import Database

__all__ = ["pack_requests", "record_epoch", "replay_epoch", "unpack_requests"]

Packed = tuple[str, Any] | None


def pack_requests(requests: Sequence[TxnRequest]) -> list[Packed]:
    """The requests as ``(procedure, params)`` pairs (``None`` for a malformed one)."""
    return [
        (request.procedure, request.params) if isinstance(request, TxnRequest) else None
        for request in requests
    ]


def unpack_requests(packed: Sequence[Packed]) -> list[TxnRequest | None]:
    return [None if entry is None else TxnRequest(*entry) for entry in packed]


def record_epoch(requests: Sequence[TxnRequest]) -> dict[str, Any]:
    return {"requests": pack_requests(requests)}


def replay_epoch(db: Database, registry: ProcedureRegistry, payload: dict[str, Any]) -> int:
    """Re-run the epoch's requests in order on ``db``; returns how many there were."""
    requests = unpack_requests(payload["requests"])
    SerialProtocol(db, registry).run_batch(requests)  # type: ignore[arg-type]
    return len(requests)
