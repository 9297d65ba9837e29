"""Single-node rejoin of a logging DistDGCC cluster: what peers keep, and the catch-up plan.

A node that dies while its peers keep running restarts from its own log (checkpoint, then its
blocks) and catches up on the epochs its peers executed or are stalled in. Every logging node
keeps (``Retained``), for each epoch not yet durable on every node, the inputs it sent each
peer, the inputs each peer sent it (an origin sends its whole batch along while logging is on,
so any peer holding an epoch can hand the origin back its own calls) and the value messages it
sent each peer. Running peers answer a rejoin with what they keep for the rejoining node
(``Retained.state_for``); ``plan_rejoin`` turns the answers into a ``RejoinPlan``: recover the
log to epoch ``restart`` (the oldest epoch some peer has yet to finish, or the log's end), then
re-execute every later epoch whose inputs survive, live, with the peers' retained values, so
stalled peers get the values they wait on. An epoch whose inputs no peer received was executed
nowhere: it is dropped with its callers, who were never answered.

The plan relies on each peer connection delivering in order (TCP): what a dead node's peer
received from it is a prefix of what it sent, so an epoch a peer still waits on (for values or
a report) is never below the epoch every node made durable, whose data the peers drop.

Epochs here are the node's 0-based epoch indices (the wire's); epoch index e is log epoch e + 1,
and "executed" counts equal log epochs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dgcc.api import TxnRequest
from dgcc.errors import DgccError

__all__ = ["RejoinError", "RejoinPlan", "Retained", "plan_rejoin"]

logger = logging.getLogger(__name__)


class RejoinError(DgccError):
    """A node cannot rejoin: the epochs it needs are gone, or several nodes restart at once."""


class Retained:
    """What a logging node keeps of the epochs not yet durable on every node.

    Args:
        node: this node's id.
    """

    def __init__(self, node: int) -> None:
        self.node = node
        self.since = 0  # epochs below this are durable on every node and dropped
        self._sent_inputs: dict[int, Mapping[int, Any]] = {}  # epoch -> peer -> body sent
        self._inputs: dict[int, dict[int, Any]] = {}  # epoch -> origin -> body received
        self._values: dict[int, dict[int, list]] = {}  # epoch -> peer -> value bodies sent

    def sent_inputs(self, epoch: int, bodies: Mapping[int, Any]) -> None:
        """This node closed ``epoch`` and sent each peer ``bodies[peer]``."""
        self._sent_inputs[epoch] = bodies

    def received_inputs(self, epoch: int, origin: int, body: Any) -> None:
        """Peer ``origin``'s inputs for ``epoch`` arrived (its whole batch is ``body[2]``)."""
        if epoch >= self.since:
            self._inputs.setdefault(epoch, {})[origin] = body

    def sent_values(self, epoch: int, peer: int, body: Any) -> None:
        """This node sent ``peer`` one value message of ``epoch`` (or would have: it is down)."""
        self._values.setdefault(epoch, {}).setdefault(peer, []).append(body)

    def drop_before(self, epoch: int) -> None:
        """Epochs below ``epoch`` are durable on every node: no rejoin will need them."""
        if epoch <= self.since:
            return
        for kept in (self._sent_inputs, self._inputs, self._values):
            for old in [e for e in kept if e < epoch]:
                del kept[old]
        self.since = epoch

    def check_rejoin(self, peer: int, log_end: int) -> None:
        """Raise unless this node still holds every epoch ``peer`` may need.

        Args:
            log_end: the newest log epoch on the rejoining node's disk (it needs epoch indices
                ``log_end`` on at most, since its peers finished at least what it logged).

        Raises:
            RejoinError: epochs between its log's end and what this node keeps are gone.
        """
        if log_end < self.since:
            raise RejoinError(
                f"node {self.node} no longer holds epochs {log_end + 1}..{self.since} that "
                f"node {peer} needs to rejoin (its log ends at epoch {log_end}): {_lost(peer)}"
            )

    def state_for(
        self, peer: int, *, executed: int, closed: int, durable: int, awaiting: tuple[int, ...]
    ) -> dict[str, Any]:
        """What this node holds for rejoining node ``peer`` (a wire-ready map).

        Args:
            executed: epochs this node has executed; ``closed``: epochs it has closed.
            durable: its newest durable log epoch; ``awaiting``: the epochs whose report
                from ``peer`` it still waits for (as their origin).
        """
        return {
            "executed": executed,
            "closed": closed,
            "durable": durable,
            "since": self.since,
            "inputs_to": tuple(
                (e, bodies[peer])
                for e, bodies in sorted(self._sent_inputs.items())
                if peer in bodies
            ),
            "inputs_from": tuple(
                (e, by[peer]) for e, by in sorted(self._inputs.items()) if peer in by
            ),
            "values_to": tuple(
                (e, tuple(by[peer])) for e, by in sorted(self._values.items()) if peer in by
            ),
            "awaiting": tuple(awaiting),
        }


@dataclass(frozen=True)
class RejoinPlan:
    """How a node rejoins its running peers.

    ``restart``: recover the log to this log epoch (= the first epoch index to re-execute);
    ``closed``: epoch indices below this have the node's own inputs (``own``) and are re-run;
    ``inputs``: epoch -> peer -> the inputs body that peer sent; ``values``: epoch -> value
    bodies peers sent; ``resend_inputs``: peer -> epochs whose inputs it never received;
    ``reports_to``: peer -> epochs whose report it still waits for; ``durable``: peer -> its
    durable log epoch.
    """

    restart: int
    closed: int
    own: dict[int, list[TxnRequest]]
    inputs: dict[int, dict[int, Any]]
    values: dict[int, list[tuple[int, Any]]]  # epoch -> (sending peer, value body)
    resend_inputs: dict[int, frozenset[int]]
    reports_to: dict[int, frozenset[int]]
    durable: dict[int, int]


def _lost(node: int) -> str:
    """What to do when the peers no longer hold the epochs node ``node`` needs: its log is
    older than the one it last wrote (a lost or restored data dir)."""
    return (
        f"restart node {node} with the data dir it last wrote (an older or empty one cannot "
        "catch up); if that is lost, its rows since are too: stop the cluster and start it "
        "afresh in a new data dir"
    )


def plan_rejoin(node: int, log_end: int, states: Mapping[int, Mapping[str, Any]]) -> RejoinPlan:
    """Combine the running peers' answers into node ``node``'s catch-up plan.

    Args:
        log_end: the newest intact log epoch on this node's disk.
        states: peer -> its ``Retained.state_for`` answer.

    Raises:
        RejoinError: a peer no longer holds an epoch the plan needs, or the peers' copies of
            this node's inputs have a gap.
    """
    assert states, "a rejoin needs running peers"
    # A peer still waiting for this node's report of an epoch needs it re-run (the report
    # died with the node); no such epoch is durable on every node, so its data is retained.
    awaiting = [epoch for state in states.values() for epoch in state["awaiting"]]
    restart = min(log_end, *awaiting, *(state["executed"] for state in states.values()))
    for peer, state in states.items():
        if state["since"] > restart:
            raise RejoinError(
                f"node {peer} no longer holds epochs {restart + 1}..{state['since']} that "
                f"node {node} needs to rejoin: {_lost(node)}"
            )
    own = _own_batches(node, restart, states)
    closed = restart + len(own)
    executed_max = max(state["executed"] for state in states.values())
    if closed < executed_max:
        raise RejoinError(
            f"peers executed epochs up to {executed_max} but hold node {node}'s inputs only "
            f"up to epoch {closed}"
        )
    inputs: dict[int, dict[int, Any]] = {}
    values: dict[int, list[tuple[int, Any]]] = {}
    for peer, state in states.items():
        sent = [e for e, _ in state["inputs_to"] if e >= restart]
        if sent != list(range(restart, max(restart, state["closed"]))):
            raise RejoinError(
                f"node {peer} closed {state['closed']} epochs but holds its inputs for {sent}"
            )
        for epoch, body in state["inputs_to"]:
            if epoch >= restart:
                inputs.setdefault(epoch, {})[peer] = body
        for epoch, bodies in state["values_to"]:
            if epoch >= restart:
                values.setdefault(epoch, []).extend((peer, body) for body in bodies)
    resend = {
        peer: frozenset(range(restart, closed)) - {e for e, _ in state["inputs_from"]}
        for peer, state in states.items()
    }
    again = f"re-executes {restart + 1}..{closed}" if closed > restart else "re-executes none"
    logger.info(
        "node %d rejoins: log ends at epoch %d, recovers to %d, %s", node, log_end, restart, again
    )
    return RejoinPlan(
        restart=restart,
        closed=closed,
        own=own,
        inputs=inputs,
        values=values,
        resend_inputs=resend,
        reports_to={peer: frozenset(state["awaiting"]) for peer, state in states.items()},
        durable={peer: state["durable"] for peer, state in states.items()},
    )


def _own_batches(
    node: int, restart: int, states: Mapping[int, Mapping[str, Any]]
) -> dict[int, list[TxnRequest]]:
    """This node's own batches from ``restart`` on, as any peer received them (no gaps)."""
    whole: dict[int, Any] = {}
    for state in states.values():
        for epoch, body in state["inputs_from"]:
            if epoch >= restart and body[2] is None:
                raise RejoinError(f"epoch {epoch + 1}: a peer holds node {node}'s calls sparse")
            if epoch >= restart:
                whole.setdefault(epoch, body[2])
    if sorted(whole) != list(range(restart, restart + len(whole))):
        raise RejoinError(f"peers hold node {node}'s inputs for epochs {sorted(whole)}: a gap")
    return {
        epoch: [TxnRequest(procedure, params) for procedure, params in whole[epoch]]
        for epoch in sorted(whole)
    }
