"""Command logging: an epoch's block is its requests in global order; replay re-runs them serially.

The smallest log, and the slowest recovery: every read and every piece runs again, one after
another (Malviya et al. 2014). The baseline dependency logging is measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dgcc.api import ProcedureRegistry, TxnRequest
from dgcc.protocols.serial import SerialProtocol
from dgcc.storage import Database

__all__ = ["record_epoch", "replay_epoch"]


def record_epoch(requests: Sequence[TxnRequest]) -> dict[str, Any]:
    return {"requests": list(requests)}


def replay_epoch(db: Database, registry: ProcedureRegistry, payload: dict[str, Any]) -> int:
    """Re-run the epoch's requests in order on ``db``; returns how many there were."""
    requests = payload["requests"]
    SerialProtocol(db, registry).run_batch(requests)
    return len(requests)
