"""The serial reference executor: the correctness oracle and the no-concurrency-control limit.

Plans the batch like every protocol (against the state at the batch start), then runs each
transaction's pieces in list order, one transaction after another, in batch order.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgcc.api import Outcome, PieceContext, PlannedTxn, Protocol, TxnRequest, plan_batch, run_piece


class SerialProtocol(Protocol):
    name = "serial"
    deterministic = True

    def run_batch(self, batch: Sequence[TxnRequest]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for planned in plan_batch(self.registry, self.db, batch):
            if isinstance(planned, PlannedTxn):
                ctx = PieceContext(self.db, planned)
                for piece in planned.pieces:
                    run_piece(ctx, planned, piece)
                outcomes.append(planned.outcome())
            else:
                outcomes.append(planned)
        return outcomes
