"""2PL NO_WAIT: strict two-phase locking that aborts a transaction on any lock conflict.

The aborted transaction is undone from its before-image log and restarted (see ``_locking``);
aborts count under ``no_wait/cc_aborts/lock_conflict``.
"""

from __future__ import annotations

from dgcc.protocols._locking import Attempt, TwoPhaseLocking, Verdict

__all__ = ["NoWaitProtocol"]


class NoWaitProtocol(TwoPhaseLocking):
    name = "no_wait"

    def on_conflict(self, attempt: Attempt, blockers: list[Attempt]) -> tuple[Verdict, str]:
        return Verdict.ABORT, "lock_conflict"
