"""The wire format, cluster config validation and client errors, without a cluster.

Method: round-trip messages through the codec and an in-memory ``StreamReader``; feed it
truncated, oversized and garbage frames; build configs with bad values; point clients at a
closed port, at a server that never answers, and at a fake node that batches its answers out
of order and then hangs up. Also: each workload's ``route_keys`` covers every key its plans use.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import re
import socket
import struct

import pytest

from dgcc.api import Outcome, TxnRequest, plan_batch
from dgcc.cluster import ClusterConfig, NodeAddress, load_config, local_config
from dgcc.errors import ConfigError, brief, clip
from dgcc.net import AsyncClient, CallTimeout, Client, ConnectionLost, FrameError
from dgcc.net.client import CALLS_PER_FRAME_MAX
from dgcc.net.wire import (
    VERSION,
    HandshakeError,
    check_mac,
    decode,
    encode,
    frame,
    mac_of,
    read_frame,
)
from dgcc.protocols.dist_placement import REPLICATED, Placement, Router
from dgcc.workloads import get_workload


def _read(data: bytes, limit: int = 1024) -> tuple:
    async def go() -> tuple:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_frame(reader, limit)

    return asyncio.run(go())


def test_frames_round_trip_with_tuple_keys():
    message = ("values", 3, 1, ((7, 2, {"a": (1, 2)}, None, None),), {(1, 2): "x"})
    assert _read(frame(message)) == message
    assert decode(encode(("k", [1, [2]]))) == ("k", (1, (2,)))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (struct.pack(">I", 5000) + b"x" * 10, "exceeds the limit"),
        (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "undecodable"),
        (frame({"no": "tuple"}), "tuple starting with its kind"),
        (frame((1, 2)), "tuple starting with its kind"),
    ],
)
def test_bad_frames_raise_frame_error(data, match):
    with pytest.raises(FrameError, match=match):
        _read(data)


def test_truncated_frame_is_a_lost_connection():
    with pytest.raises(ConnectionLost):
        _read(frame(("call", 1, "x", {}))[:-2])


def test_mac_checks_the_secret():
    nonce = b"0123456789abcdef"
    assert check_mac("s", nonce, mac_of("s", nonce))
    assert not check_mac("s", nonce, mac_of("t", nonce))
    assert not check_mac("s", nonce, "not bytes")
    assert check_mac(None, nonce, b"")
    with pytest.raises(HandshakeError, match="nonce must be bytes, got str"):
        mac_of("s", "a nonce off the wire that is no bytes")


def test_brief_bounds_any_value_in_an_error_message():
    deep: object = 1
    for _ in range(5000):  # deeper than the recursion limit: a plain repr raises
        deep = (deep,)
    assert brief(deep) == "((((...),),),)"
    assert len(brief("\x00" * 100_000)) <= 80  # (its repr is 4x its length)
    assert brief({"k": list(range(1000))}, 40).startswith("{'k': [0, 1, 2, 3, 4, 5, ...]}")
    assert brief(7) == "7"
    assert clip("x" * 10) == "x" * 10
    clipped = clip("y" * 5000)
    assert len(clipped) < 1000 and clipped.endswith("... (5,000 chars)")


def test_secret_required_beyond_loopback():
    nodes = (NodeAddress(0, "10.1.2.3", 7000), NodeAddress(1, "127.0.0.1", 7001))
    with pytest.raises(ConfigError, match="shared secret"):
        ClusterConfig(nodes=nodes)
    assert ClusterConfig(nodes=nodes, secret="x").shared_secret() == "x"


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"epoch_ms": -1}, "epoch_ms"),
        ({"epoch_ms": 0, "epoch_calls_max": 0}, "both be 0"),
        ({"pipeline_epochs": 0}, "pipeline_epochs"),
        ({"partition_nodes": (0, 0)}, "own no partition"),
        ({"partition_nodes": (0, 5)}, "must name nodes"),
        ({"secret_env": "DGCC_TEST_NO_SUCH_VARIABLE"}, "not set"),
    ],
)
def test_bad_cluster_configs(changes, match):
    with pytest.raises(ConfigError, match=match):
        local_config(2, **changes).shared_secret()


def test_a_local_config_names_its_data_dir_from_any_working_directory(tmp_path, monkeypatch):
    # (a drill's trial config, written with a relative data dir, restarted from elsewhere
    # started afresh in a new directory instead of recovering the logs it had)
    monkeypatch.chdir(tmp_path)
    config = local_config(2, workload="ycsb", data_dir="trial0/data")
    assert config.data_dir == str(tmp_path / "trial0" / "data")


def test_config_files_toml_and_json(tmp_path):
    toml = tmp_path / "cluster.toml"
    toml.write_text(
        'workload = "smallbank"\nepoch_ms = 3\n'
        "partition_nodes = [0, 1, 1]\n"
        "[workload_options]\naccounts = 50\n"
        '[[nodes]]\nid = 0\nhost = "127.0.0.1"\nport = 7100\n'
        '[[nodes]]\nid = 1\nhost = "localhost"\nport = 7101\n'
    )
    config = load_config(toml)
    assert config.placement() == Placement(2, (0, 1, 1))
    assert config.workload_options == {"accounts": 50}
    again = tmp_path / "cluster.json"
    again.write_text(json.dumps(config.to_dict()))
    assert load_config(again) == config
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes": [], "colour": "red"}))
    with pytest.raises(ConfigError, match="unknown cluster config keys"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not valid"):
        load_config(_write(tmp_path / "broken.toml", "nodes = ["))


def _write(path, text):
    path.write_text(text)
    return path


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_clients_report_unreachable_nodes():
    port = _closed_port()
    with pytest.raises(ConnectionLost, match=f"127.0.0.1:{port}"):
        Client("127.0.0.1", port, timeout_s=2)
    with pytest.raises(ConnectionLost, match=f"127.0.0.1:{port}"):
        asyncio.run(AsyncClient.connect("127.0.0.1", port, timeout_s=2))


def test_clients_time_out_on_a_silent_server():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(CallTimeout):
            Client("127.0.0.1", port, timeout_s=0.2)
        with pytest.raises(CallTimeout):
            asyncio.run(AsyncClient.connect("127.0.0.1", port, timeout_s=0.2))


async def _fake_node(
    batches: list[int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Handshake, then answer each ``calls`` frame with one ``results`` frame, last call first
    (noting each frame's call count in ``batches``); a ``hang_up`` call closes the connection."""
    writer.write(frame(("hello", VERSION, 0, b"nonce")))
    await read_frame(reader, 4096)
    writer.write(frame(("ready", 0)))
    while True:
        message = await read_frame(reader, 2**20)
        assert message[0] == "calls"
        batches.append(len(message[1]))
        if any(procedure == "hang_up" for _, procedure, _ in message[1]):
            writer.close()
            return
        answers = [
            (call_id, "committed", {"echo": params}, None) for call_id, _, params in message[1]
        ]
        writer.write(frame(("results", tuple(reversed(answers)))))


def test_async_client_matches_batched_results_and_fails_callbacks_on_loss():
    batches: list[int] = []

    async def go() -> tuple[list, list, list]:
        server = await asyncio.start_server(functools.partial(_fake_node, batches), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, await AsyncClient.connect("127.0.0.1", port) as client:
            outcomes = await asyncio.gather(*(client.call("p", {"i": i}) for i in range(2500)))
            seen: list = []
            both = asyncio.Event()

            def done(result: object) -> None:
                seen.append(result)
                if len(seen) == 2:
                    both.set()

            client.submit("p", {"i": -1}, done)
            client.submit("hang_up", {}, done)
            await asyncio.wait_for(both.wait(), 10)
            with pytest.raises(ConnectionLost):
                client.submit("p", {}, seen.append)
        return outcomes, seen, [client.in_flight]

    outcomes, seen, in_flight = asyncio.run(go())
    assert [outcome.result["echo"]["i"] for outcome in outcomes] == list(range(2500))
    assert max(batches) <= CALLS_PER_FRAME_MAX < 2500, batches  # the calls left in batches
    assert all(outcome.committed for outcome in outcomes)
    assert all(isinstance(result, ConnectionLost) for result in seen)
    assert in_flight == [0]


def test_a_call_msgpack_cannot_carry_fails_alone_and_the_client_stays_usable():
    """Sent in the same loop turn as good calls and a status request: only it fails, with a
    FrameError naming the procedure; the others are answered, and so are later calls."""
    batches: list[int] = []

    async def go() -> tuple[list, object]:
        server = await asyncio.start_server(functools.partial(_fake_node, batches), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, await AsyncClient.connect("127.0.0.1", port) as client:
            first = await asyncio.gather(
                client.call("p", {"i": 1}),
                client.call("big", {"i": 2**70}),  # beyond 64 bits
                client.call("p", {"i": 3}),
                return_exceptions=True,
            )
            later = await client.call("p", {"i": 4}, timeout_s=10)
        return first, later

    (one, bad, three), later = asyncio.run(go())
    assert isinstance(bad, FrameError) and "'big' cannot be sent" in str(bad)
    assert [one.result["echo"]["i"], three.result["echo"]["i"]] == [1, 3]
    assert later.result["echo"]["i"] == 4


@pytest.mark.parametrize("workload_name", ["tpcc", "ycsb", "smallbank"])
def test_route_keys_name_every_node_a_call_touches(workload_name):
    options = {
        "tpcc": {
            "warehouses": 4,
            "items": 200,
            "customers_per_district": 30,
            "orders_per_district": 30,
            "remote_item_fraction": 0.3,
            "remote_payment_fraction": 0.3,
        },
        "ycsb": {"records": 400, "ops_per_txn": 4},
        "smallbank": {"accounts": 80},
    }[workload_name]
    workload = get_workload(workload_name, **options)
    router = Router(workload, Placement.round_robin(2))
    requests = list(itertools.islice(workload.requests(5), 300))
    planned = plan_batch(workload.registry(), workload.build(5), requests)
    spans = 0
    for request, txn in zip(requests, planned, strict=True):
        route = router.route(request)
        keys = {key for piece in txn.pieces for key in piece.reads + piece.writes}
        touched = {router.node_of_key(key) for key in keys} - {REPLICATED}
        assert route is not None and touched <= route, (request, route, touched)
        spans += len(route) > 1
    assert spans > 0, "the stream never spans two nodes"
    assert router.route(TxnRequest("no_such_procedure", {})) is None
    assert router.route(TxnRequest(requests[0].procedure, {})) is None  # bad params


class _Answers:
    """Stands in for a connected client: records the answers a node gives."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, Outcome]] = []
        self.waiting = 0

    def result(self, call_id: int, outcome: Outcome) -> None:
        self.answers.append((call_id, outcome))


def test_calls_join_the_epoch_in_order_and_overflow_is_refused(monkeypatch):
    from dgcc.net import node as node_module

    config = local_config(1, workload="ycsb", workload_options={"records": 100})
    node = node_module.Node(config, 0)
    monkeypatch.setattr(node_module, "CALLS_WAITING_MAX", 3)
    client = _Answers()
    calls = tuple((k, "ycsb_txn", {"keys": [k], "rmw": [False]}) for k in range(5))
    node._add_calls(client, calls[:2])
    node._add_calls(client, calls[2:])
    assert [request.params["keys"] for request in node._collect] == [[0], [1], [2]]
    assert [call_id for _, call_id in node._callers] == [0, 1, 2]
    assert [call_id for call_id, _ in client.answers] == [3, 4]
    assert all("overloaded: 3 calls waiting" in o.reason for _, o in client.answers)
    assert node.stats["txn/calls"] == 3 and client.waiting == 3


def test_one_client_cannot_take_every_waiting_slot(monkeypatch):
    # A client that floods the node gets its share of the collect buffer; another client's
    # calls still join the epoch, and closing the epoch gives the flooder its room back.
    from dgcc.net import node as node_module

    config = local_config(1, workload="ycsb", workload_options={"records": 100})
    node = node_module.Node(config, 0)
    monkeypatch.setattr(node_module, "CALLS_WAITING_MAX", 6)
    monkeypatch.setattr(node_module, "CLIENT_CALLS_WAITING_MAX", 3)
    flood, other = _Answers(), _Answers()
    calls = tuple((k, "ycsb_txn", {"keys": [k], "rmw": [False]}) for k in range(5))
    node._add_calls(flood, calls)
    node._add_calls(other, calls[:2])
    assert [call_id for call_id, _ in flood.answers] == [3, 4] and other.answers == []
    assert "this client has 3 calls waiting (at most 3 of 6)" in flood.answers[0][1].reason
    assert (flood.waiting, other.waiting) == (3, 2)
    node._close_epoch()
    assert (flood.waiting, other.waiting) == (0, 0)


def test_a_peers_close_waits_for_half_its_batch_unless_the_executor_would_idle():
    """A node asked to close by a peer (it closed the open epoch with 40 calls) closes once it
    holds 20 calls, or at once when its executor has nothing else to run; else it would close
    with a handful and the nodes' batches would alternate light and heavy."""
    from dgcc.net import node as node_module

    config = local_config(2, workload="ycsb", workload_options={"records": 100})
    node = node_module.Node(config, 0)
    calls = [TxnRequest("ycsb_txn", {"keys": [k], "rmw": [False]}) for k in range(30)]
    node._closed_epochs, node._executed_epochs = 3, 2  # executing epoch 2, 3 is open
    node._collect = calls[:5]
    later_s = float("inf")  # (the timer never fires here)
    assert not node._may_close(later_s)  # nobody asked: the timer closes it
    node._inputs[3] = {1: (40, (), None)}  # peer 1 closed epoch 3 with 40 calls
    assert not node._may_close(later_s)
    node._collect = calls[:20]
    assert node._may_close(later_s)
    node._collect = calls[:5]
    node._executed_epochs = 3  # the executor waits for epoch 3: no reason to wait
    assert node._may_close(later_s)
    node._collect = []
    assert node._may_close(later_s)  # even empty: the peer waits for this node's inputs
    node._executed_epochs, node._closed_epochs = 2, 2 + config.pipeline_epochs
    node._inputs = {node._closed_epochs: {1: (40, (), None)}}
    node._collect = calls[:25]
    assert not node._may_close(later_s)  # the pipeline is full


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("x", "expected (calls, entries, full)"),
        ((-1, (), None), "calls must be an int in 0..200000"),
        ((10**9, (), None), "calls must be an int in 0..200000"),
        ((2, ((2, "p", {}),), None), "slots in 0..1"),
        ((2, ((0, "p"),), None), "slots in 0..1"),
        ((2, (), (("p", {}),)), "full must be None or 2 (procedure, params) pairs"),
    ],
)
def test_a_garbled_inputs_body_is_refused_on_arrival(body, problem):
    """(It used to reach the executor, whose exception stopped the whole node.)"""
    from dgcc.net.epochs import check_inputs

    expected = rf"^bad 'inputs' message from peer 1: .*{re.escape(problem)}"
    with pytest.raises(FrameError, match=expected):
        check_inputs(1, body)
    check_inputs(1, (2, ((1, "p", {}),), (("p", {}), ("q", {}))))  # a good one passes


def test_calls_left_in_flight_after_the_drain_wait_do_not_fail_the_client(monkeypatch):
    """A closed-loop client gives up on calls still unanswered ``CLIENT_EXIT_TIMEOUT_S`` after
    its window; closing its connection then fails them as lost, which must not count as the
    connection lost mid-run (that failed whole benchmark runs of the 2PC baselines)."""
    import time

    from dgcc.net import loadgen

    class Unanswered:  # a node that never answers; closing fails the call, as AsyncClient does
        def __init__(self) -> None:
            self.callbacks: list = []

        @property
        def in_flight(self) -> int:
            return len(self.callbacks)

        def submit(self, procedure, params, callback) -> None:
            self.callbacks.append(callback)

        async def close(self) -> None:
            for callback in self.callbacks:
                callback(ConnectionLost("connection to node lost: None"))

    monkeypatch.setattr(loadgen, "CLIENT_EXIT_TIMEOUT_S", 0.01)
    now = time.time()
    loop = loadgen._ClosedLoop(Unanswered(), [TxnRequest("p", {})], now, now)
    result = asyncio.run(loop.run(inflight=2))
    assert result["counts"] == dict.fromkeys(loadgen.COUNTED, 0)
