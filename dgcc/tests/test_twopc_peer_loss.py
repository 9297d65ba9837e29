"""A 2PC node that loses a peer keeps serving, and frees what the lost peer held.

Goal: a call that needs a lost peer fails at once with an ERROR naming it (it waited 120 s,
and the timeout then stopped the surviving node), local calls keep committing, and the
branches a lost coordinator left here unvoted are aborted (presumed abort), so their locks do
not block later calls. A lost peer's link comes back: when the peer connects back (restarted,
or dropped the link too) or when a call needs it (one bounded try; while it is still down, the
call fails with a one-line ERROR). Method: in-process 2-node clusters of each 2PC server on
loopback (YCSB, 100 records: keys 0..49 on node 0, 50..99 on node 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from dgcc import Status, TxnRequest
from dgcc.cluster import local_config
from dgcc.net import AsyncClient
from dgcc.net.servers import server_class, twopc

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


SPANNING = {"keys": [3, 81], "rmw": [True, True]}  # key 3 on node 0, key 81 on node 1


@pytest.mark.parametrize("protocol", TWO_PC)
def test_a_restarted_peer_is_redialled_and_spanning_calls_commit_again(protocol: str) -> None:
    """Node 1 stops and a new node 1 starts on its port: node 0 re-dials it (its incoming link
    names it back), so the new node becomes ready and calls spanning both commit, without
    restarting node 0. Before, node 0 kept node 1 down for good: every such call failed."""
    config, nodes = _cluster(protocol)

    async def go() -> tuple[list, bool]:
        await asyncio.gather(*(node.start() for node in nodes))
        restarted = server_class(protocol)(config, 1)
        try:
            nodes[1].stop()
            await _until(lambda: 1 in nodes[0]._down, "node 0 to see node 1 lost")
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                while_down = await client.call("ycsb_txn", SPANNING, timeout_s=WAIT_S)
                await restarted.start()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(restarted.ready.wait(), WAIT_S)
                after = [await client.call("ycsb_txn", SPANNING, timeout_s=WAIT_S)
                         for _ in range(3)]  # fmt: skip
            return [while_down, *after], restarted.ready.is_set()
        finally:
            for node in (*nodes, restarted):
                node.stop()

    (while_down, *after), ready = asyncio.run(go())
    assert while_down.status is Status.ERROR and "node 1" in while_down.reason, while_down
    assert "\n" not in while_down.reason
    assert [o.status for o in after] == [Status.COMMITTED] * 3, after
    assert ready, "the restarted node 1 never got node 0's link back"


@pytest.mark.parametrize("protocol", TWO_PC)
def test_a_call_needing_a_dropped_link_redials_it(protocol: str) -> None:
    """Both nodes live on, but their links dropped (each side marked the other lost): the next
    call needing node 1 re-dials it, node 1 dials back, and the call commits."""
    config, nodes = _cluster(protocol)

    async def go():
        await asyncio.gather(*(node.start() for node in nodes))
        try:
            nodes[0]._peer_lost(1)  # closes node 0's link; node 1 sees it end and drops its own
            await _until(lambda: 0 in nodes[1]._down and not nodes[0]._peer_readers,
                         "both links to end")  # fmt: skip
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                return await client.call("ycsb_txn", SPANNING, timeout_s=WAIT_S)
        finally:
            for node in nodes:
                node.stop()

    outcome = asyncio.run(go())
    assert outcome.status is Status.COMMITTED, outcome


def test_dialing_a_lost_peer_again_is_bounded(monkeypatch) -> None:
    """Node 1's port accepts but never says hello (a hung process): the call needing node 1
    fails after one bounded try, with a one-line ERROR naming node 1 and the bound."""
    monkeypatch.setattr(twopc, "REDIAL_TIMEOUT_S", 0.3)
    config, nodes = _cluster("no_wait")
    accepted: list[asyncio.StreamWriter] = []

    async def go():
        await asyncio.gather(*(node.start() for node in nodes))
        silent = None
        try:
            nodes[1].stop()
            await _until(lambda: 1 in nodes[0]._down, "node 0 to see node 1 lost")
            silent = await asyncio.start_server(lambda _, writer: accepted.append(writer),
                                                "127.0.0.1", config.nodes[1].port)  # fmt: skip
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                started_s = time.monotonic()
                outcome = await client.call("ycsb_txn", SPANNING, timeout_s=WAIT_S)
                return outcome, time.monotonic() - started_s
        finally:
            for node in nodes:
                node.stop()
            if silent is not None:
                silent.close()
            for writer in accepted:
                writer.close()

    outcome, took_s = asyncio.run(go())
    assert outcome.status is Status.ERROR, outcome
    assert "node 1" in outcome.reason and "0.3 s" in outcome.reason, outcome.reason
    assert "\n" not in outcome.reason and accepted
    assert took_s < 3.0, f"{took_s:.1f} s"


def test_a_peer_back_before_its_old_link_was_seen_ending_is_treated_as_lost() -> None:
    """Node 1 restarts while node 0 still has its old link registered, already at its end but
    not yet seen to end (a FIN that loses the race with the new handshake). Accepting the new
    link ends the old one as a loss: node 0 dials the new node 1 back, so it becomes ready and
    spanning calls commit. Before, the old link's end then went unnoticed for good."""
    config, nodes = _cluster("no_wait")

    async def go():
        await asyncio.gather(*(node.start() for node in nodes))
        restarted = server_class("no_wait")(config, 1)
        try:
            ended = asyncio.StreamReader()
            ended.feed_eof()  # the old link's reader, at its end, its end not yet handled
            nodes[0]._peer_readers[1] = ended  # (so node 1's stop below goes unnoticed too)
            nodes[1].stop()
            await restarted.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(restarted.ready.wait(), WAIT_S)
            assert restarted.ready.is_set(), "node 0 never dialed the restarted node 1"
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                return await client.call("ycsb_txn", SPANNING, timeout_s=WAIT_S)
        finally:
            for node in (*nodes, restarted):
                node.stop()

    outcome = asyncio.run(go())
    assert outcome.status is Status.COMMITTED, outcome
