"""2PL WAIT_DIE: strict two-phase locking where an older requester waits and a younger one dies.

Age is the transaction's first-attempt timestamp (batch number, batch position), kept across
restarts, so every transaction eventually becomes the oldest and commits; waits only go from
older to younger, so there is no deadlock. Deaths count under ``wait_die/cc_aborts/die``.
"""

from __future__ import annotations

from dgcc.protocols._locking import Attempt, TwoPhaseLocking, Verdict

__all__ = ["WaitDieProtocol"]


class WaitDieProtocol(TwoPhaseLocking):
    name = "wait_die"

    def on_conflict(self, attempt: Attempt, blockers: list[Attempt]) -> tuple[Verdict, str]:
        if all(attempt.ts < other.ts for other in blockers):
            self.stats["wait_die/waits"] = self.stats.get("wait_die/waits", 0) + 1
            return Verdict.WAIT, ""
        return Verdict.ABORT, "die"
