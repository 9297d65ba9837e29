"""A 2PC node that loses a peer keeps serving, and frees what the lost peer held.

Goal: a call that needs a lost peer fails at once with an ERROR naming it (it waited 120 s,
and the timeout then stopped the surviving node), local calls keep committing, and the
branches a lost coordinator left here unvoted are aborted (presumed abort), so their locks do
not block later calls. Method: in-process 2-node clusters of each 2PC server on loopback
(YCSB, 100 records: keys 0..49 on node 0, 50..99 on node 1).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from dgcc import Status, TxnRequest
from dgcc.cluster import local_config
from dgcc.net import AsyncClient
from dgcc.net.servers import server_class

WAIT_S = 20.0
TWO_PC = ["no_wait", "wait_die", "occ"]


async def _until(condition, what: str) -> None:
    """Wait (polling the event loop) until ``condition()`` holds; fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _cluster(protocol: str):
    config = local_config(2, workload="ycsb", workload_options={"records": 100},
                          protocol=protocol)  # fmt: skip
    return config, [server_class(protocol)(config, node) for node in (0, 1)]


@pytest.mark.parametrize("protocol", TWO_PC)
def test_a_call_needing_a_lost_peer_fails_at_once_and_the_node_serves_on(protocol: str) -> None:
    config, nodes = _cluster(protocol)

    async def go() -> tuple[list, float]:
        await asyncio.gather(*(node.start() for node in nodes))
        try:
            nodes[1].stop()
            await _until(lambda: 1 in nodes[0]._down, "node 0 to see node 1 lost")
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                started_s = time.monotonic()
                spanning = await client.call("ycsb_txn", {"keys": [3, 81], "rmw": [True, True]},
                                             timeout_s=WAIT_S)  # fmt: skip
                took_s = time.monotonic() - started_s
                local = await client.call("ycsb_txn", {"keys": [3, 4], "rmw": [True, True]},
                                          timeout_s=WAIT_S)  # fmt: skip
            assert not nodes[0].stopped.is_set()
        finally:
            for node in nodes:
                node.stop()
        return [spanning, local], took_s

    (spanning, local), took_s = asyncio.run(go())
    assert spanning.status is Status.ERROR and "node 1" in spanning.reason, spanning
    assert took_s < 5.0, f"{took_s:.1f} s"  # not the 120 s RPC timeout
    assert local.status is Status.COMMITTED, local


@pytest.mark.parametrize("protocol", TWO_PC)
def test_a_lost_coordinators_unvoted_branch_is_aborted_and_frees_its_keys(protocol: str) -> None:
    config, nodes = _cluster(protocol)

    async def go():
        await asyncio.gather(*(node.start() for node in nodes))
        try:
            participant = nodes[1]
            branch_id = (0, 10**6, 0, 0)  # a branch node 0 coordinates, its pieces run here
            request = TxnRequest("ycsb_txn", {"keys": [81], "rmw": [True]})
            ts = (time.time_ns(), 0, 10**6)
            kind, _ = await participant._run_pieces(branch_id, ts, request, [0], {})
            assert kind == "ok" and branch_id in participant._branches  # holds key 81 now
            participant._peer_lost(0)  # its coordinator is gone before it voted
            assert branch_id not in participant._branches
            async with await AsyncClient.connect("127.0.0.1", config.nodes[1].port) as client:
                return await client.call("ycsb_txn", {"keys": [81], "rmw": [True]},
                                         timeout_s=WAIT_S)  # fmt: skip
        finally:
            for node in nodes:
                node.stop()

    outcome = asyncio.run(go())
    assert outcome.status is Status.COMMITTED, outcome  # key 81 is free again


def test_a_branch_its_coordinator_aborts_while_it_waits_ends_and_holds_nothing() -> None:
    """WAIT_DIE: an older branch waits for key 81, held by a younger one; its coordinator
    gives up on it (a timeout) and sends abort. The waiting piece used to wake, take the lock
    again and run for a branch nothing would ever end (key 81 locked for good). Now it ends
    when it stops waiting; an abort that comes before the branch's pieces refuses them."""
    config, nodes = _cluster("wait_die")

    async def go():
        await asyncio.gather(*(node.start() for node in nodes))
        try:
            participant = nodes[1]
            request = TxnRequest("ycsb_txn", {"keys": [81], "rmw": [True]})
            now = time.time_ns()
            young, old = (0, 10**6, 0, 0), (0, 10**6 + 1, 0, 0)
            kind, _ = await participant._run_pieces(young, (now, 0, 10**6), request, [0], {})
            assert kind == "ok"  # the young branch holds key 81
            waiting = asyncio.create_task(
                participant._run_pieces(old, (now - 10**9, 0, 10**6 + 1), request, [0], {})
            )
            await _until(lambda: old in participant._branches, "the old branch to wait")
            await participant._answer(0, 10**6, ("abort", old))  # its coordinator gave up
            participant._end(young, commit=False)  # key 81 is released: the old one wakes
            woke = await asyncio.wait_for(waiting, WAIT_S)
            early = (0, 10**6 + 2, 0, 0)
            await participant._answer(0, 10**6 + 1, ("abort", early))  # before its pieces
            refused = await participant._run_pieces(early, (now, 0, 1), request, [0], {})
            async with await AsyncClient.connect("127.0.0.1", config.nodes[1].port) as client:
                outcome = await client.call("ycsb_txn", {"keys": [81], "rmw": [True]},
                                            timeout_s=WAIT_S)  # fmt: skip
            return woke, refused, outcome, dict(participant._branches)
        finally:
            for node in nodes:
                node.stop()

    woke, refused, outcome, branches = asyncio.run(go())
    assert woke == ("error", "aborted by its coordinator")
    assert refused == ("error", "aborted by its coordinator")
    assert branches == {}
    assert outcome.status is Status.COMMITTED, outcome  # key 81 is free
