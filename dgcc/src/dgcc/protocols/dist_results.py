"""DistDGCC's results: an origin node builds its callers' outcomes from every node's report.

Each node reports, per origin, the outputs of the pieces it ran, the logic-abort decisions it
took and the errors of its planning (``EpochRun.reports``); the origin's ``ResultAssembler``
merges them once every node has reported the epoch (the failure, abort or error, of the
lowest piece index wins, as in serial execution, where the pieces after it never run) and
builds each committed call's result with its procedure's builder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dgcc.api import Outcome, ProcedureRegistry, Status, TxnRequest, raised
from dgcc.errors import BadRequest, ProcedureError

__all__ = ["ReportEntry", "ResultAssembler"]

# A report entry for an origin: (slot in origin batch, outputs, (piece index, abort reason),
# (piece index, error)); an error of planning, or of sending the outputs, has piece index -1.
ReportEntry = tuple[int, dict[str, Any], tuple[int, str] | None, tuple[int, str] | None]
_STATUS_OF = {status.value: status for status in Status}  # an answer's status on the wire
_COMMITTED, _ABORTED, _ERROR = Status.COMMITTED.value, Status.ABORTED.value, Status.ERROR.value


class ResultAssembler:
    """Builds the outcomes of one origin's batch from every node's reports.

    Args:
        registry: the procedures (for each procedure's result builder).
        batch: the origin's requests of this epoch, in order.
        nodes: how many nodes report.
    """

    def __init__(self, registry: ProcedureRegistry, batch: Sequence[TxnRequest], nodes: int):
        self._registry = registry
        self._batch = batch
        self._waiting = set(range(nodes))
        self._outputs: list[dict[str, Any] | None] = [None] * len(batch)
        self._aborts: list[tuple[int, str] | None] = [None] * len(batch)
        self._errors: list[tuple[int, str] | None] = [None] * len(batch)

    @property
    def complete(self) -> bool:
        return not self._waiting

    def waits_for(self, node: int) -> bool:
        """Whether node ``node``'s report is still missing."""
        return node in self._waiting

    def add(self, node: int, entries: Sequence[Sequence[Any]]) -> None:
        """Take one node's report (exactly once per node).

        The report's output dicts are taken over, not copied: a node's report is built for
        this assembler alone (a finished run's, or a decoded message's).
        """
        if node not in self._waiting:
            raise ProcedureError(f"second or unknown report from node {node}")
        self._waiting.discard(node)
        all_outputs, aborts, errors = self._outputs, self._aborts, self._errors
        calls = len(self._batch)
        for slot, outputs, abort, error in entries:
            if type(slot) is not int or not 0 <= slot < calls:
                raise ProcedureError(f"node {node} reported slot {slot!r} of {calls} calls")
            current = all_outputs[slot]
            if current is None:
                all_outputs[slot] = outputs
            elif outputs:
                current.update(outputs)
            if abort is not None:
                current_abort = aborts[slot]
                if current_abort is None or abort[0] < current_abort[0]:
                    aborts[slot] = (abort[0], abort[1])
            if error is not None:
                current_error = errors[slot]
                if current_error is None or tuple(error) < current_error:  # (then by text)
                    errors[slot] = (error[0], error[1])

    def outcomes(self) -> list[Outcome]:
        """One outcome per request of the origin's batch, in order."""
        return [
            Outcome(_STATUS_OF[status], result, reason) for status, result, reason in self.answers()
        ]

    def answers(self) -> list[tuple[str, Any, str]]:
        """``outcomes`` as ``(status value, result, reason)`` tuples, the form a node's answer
        takes on the wire (no ``Outcome`` object per call on the node's hot path)."""
        assert self.complete, f"reports missing from nodes {sorted(self._waiting)}"
        answers: list[tuple[str, Any, str]] = []
        builders: dict[str, Any] = {}  # procedure name -> its result builder (or None)
        for slot, request in enumerate(self._batch):
            error, abort = self._errors[slot], self._aborts[slot]
            if error is not None and (abort is None or error[0] < abort[0]):
                answers.append((_ERROR, None, error[1]))
                continue
            if abort is not None:
                answers.append((_ABORTED, None, abort[1]))
                continue
            name = request.procedure
            if name not in builders:
                try:
                    builders[name] = self._registry.get(name).result
                except BadRequest as error:  # every planner failed the same way; keep it
                    answers.append((_ERROR, None, str(error)))
                    continue
            build, outputs = builders[name], self._outputs[slot]
            if outputs is None:
                outputs = {}
            try:
                answers.append((_COMMITTED, build(outputs) if build else dict(outputs), ""))
            except Exception as error:  # as ``committed_outcome``: this call's answer fails
                answers.append((_ERROR, None, raised(name, "result", error)))
        return answers
