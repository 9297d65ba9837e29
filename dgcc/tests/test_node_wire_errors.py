"""A node keeps its peer links and client connections through impostors and ill-shaped calls.

Goal: a connection claiming to be a peer that is already connected is refused and the real link
kept, while a restarted peer still gets in once its old link ends; a real peer that sends a
garbled or ill-shaped frame counts as lost (status shows it down, a log line names it); one
ill-shaped call in a ``calls`` frame is answered ERROR alone, the other calls are answered and
the connection kept; a piece output msgpack cannot carry fails its call alone wherever it would
cross nodes, under every kind of node. Method: in-process nodes on loopback in one event loop,
spoken to with raw frames or a client; node subclasses signal each refused handshake and each
lost peer, so the tests wait on events, not on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Hashable, Iterator, Mapping
from typing import Any

import pytest

from dgcc.api import Piece, PieceContext, Procedure, ProcedureRegistry, Status, TxnRequest
from dgcc.cluster import local_config
from dgcc.net import AsyncClient, Client, ConnectionLost, FrameError, FrameRefused, HandshakeError
from dgcc.net.calls import call_problem
from dgcc.net.node import Node
from dgcc.net.servers import server_class
from dgcc.net.wire import VERSION, frame, read_frame
from dgcc.storage import Database, Table
from dgcc.workloads import WORKLOADS, Workload

WAIT_S = 20.0
YCSB = {"workload": "ycsb", "workload_options": {"records": 100}, "epoch_ms": 2.0}


class _Watched(Node):
    """A node that sets ``refused`` whenever it refuses a handshake."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.refused = asyncio.Event()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
        try:
            return await super()._handshake(reader, writer)
        except HandshakeError:
            self.refused.set()
            raise


class _Losing(Node):
    """A node that sets ``lost`` whenever it marks a peer lost."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.lost = asyncio.Event()

    def _peer_lost(self, peer: int) -> None:
        super()._peer_lost(peer)
        self.lost.set()


async def _hello(port: int, role: str, peer: int | None) -> tuple:
    """Connect to a node's port and handshake as ``role``; (reader, writer, its answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await read_frame(reader, 4096)
    writer.write(frame(("hello", VERSION, role, peer, b"")))
    return reader, writer, await read_frame(reader, 4096)


async def _answers(reader: asyncio.StreamReader, ids: set[int]) -> dict[int, tuple]:
    """Read ``results`` frames until every call in ``ids`` is answered; by call id."""
    answers: dict[int, tuple] = {}
    while not ids <= answers.keys():
        message = await asyncio.wait_for(read_frame(reader, 2**20), WAIT_S)
        assert message[0] == "results", message
        answers.update((entry[0], entry[1:]) for entry in message[1])
    return answers


def test_an_impostor_peer_is_refused_and_the_real_link_kept():
    config = local_config(2, **YCSB)

    async def go() -> tuple:
        nodes = [_Watched(config, n) for n in range(2)]
        await asyncio.gather(*(node.start() for node in nodes))
        try:
            _, writer, answer = await _hello(config.nodes[0].port, "node", 1)
            writer.close()  # what used to make node 0 drop the real node 1
            await writer.wait_closed()
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                params = {"keys": [2, 3], "rmw": [True, True]}  # every epoch needs node 1
                outcome = await client.call("ycsb_txn", params, timeout_s=WAIT_S)
                status = await client.status()
        finally:
            for node in nodes:
                node.stop()
        return answer, outcome, status

    answer, outcome, status = asyncio.run(go())
    assert answer == ("error", "node 0: refused a second connection claiming to be node 1")
    assert outcome.committed, outcome
    assert status["peers_down"] == ()
    assert status["net/rejected_connections"] == 1


def test_a_restarted_peer_retries_until_its_old_link_ends():
    """The newcomer is refused while the old node 1's link is open, and gets in after it ends."""
    config = local_config(2, **YCSB)

    async def go() -> tuple[Node, Node]:
        first, old = _Watched(config, 0), _Watched(config, 1)
        await asyncio.gather(first.start(), old.start())
        old._server.close()  # frees the port; the old links stay open
        await old._server.wait_closed()
        new = Node(config, 1)
        try:
            starting = asyncio.create_task(new.start())  # connects to node 0: refused, retries
            await asyncio.wait_for(first.refused.wait(), WAIT_S)
            assert not starting.done()
            old.stop()  # its link to node 0 ends, as when a process dies
            await asyncio.wait_for(starting, WAIT_S)
        finally:
            for node in (first, old, new):
                node.stop()
        return first, new

    first, new = asyncio.run(go())
    assert 0 in new._out
    assert first.stats["net/rejected_connections"] == 1
    assert first._down == {1}  # the old link's end was seen; its rejoin would clear this


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x00\x00\x00\x01\xc1", "undecodable frame of 1 bytes"),  # 0xc1: never msgpack
        (frame(("values", "x")), "ill-shaped peer message"),
        (frame(("inputs", 0, 1, ("x", (), None))), "bad 'inputs' message from peer 1"),
    ],
    ids=["undecodable", "ill_shaped", "garbled_inputs"],
)
def test_a_bad_frame_from_a_peer_counts_as_that_peer_lost(data, problem, caplog):
    config = local_config(2, **YCSB)
    caplog.set_level(logging.WARNING, logger="dgcc.net.node")

    async def go() -> dict:
        first, second = _Losing(config, 0), Node(config, 1)
        await asyncio.gather(first.start(), second.start())
        try:
            second._out[0].write(data)  # on node 1's real link to node 0
            await asyncio.wait_for(first.lost.wait(), WAIT_S)
            return first.status()
        finally:
            for node in (first, second):
                node.stop()

    status = asyncio.run(go())
    assert status["peers_down"] == [1]
    assert status["net/rejected_connections"] == 1
    assert f"node 0: peer 1 sent a bad frame: {problem}" in caplog.text, caplog.text


def test_a_bad_report_that_came_before_its_epoch_closed_counts_as_that_peer_lost(caplog):
    """A report can overtake this node's closing of its epoch; it is kept and read once the
    epoch closes. A garbled one then ends that peer's link, as on arrival, and the node runs
    on (it used to stop the node)."""
    config = local_config(2, **YCSB)
    caplog.set_level(logging.WARNING, logger="dgcc.net.epochs")

    async def go() -> tuple[dict, bool]:
        first, second = _Losing(config, 0), Node(config, 1)
        await asyncio.gather(first.start(), second.start())
        try:
            second._out[0].write(frame(("report", 0, 1, ("garbled",))))  # node 0: epoch 0 open
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                client.submit("ycsb_txn", {"keys": [7], "rmw": [True]}, lambda outcome: None)
                await asyncio.wait_for(first.lost.wait(), WAIT_S)  # once epoch 0 closed
            return first.status(), first.stopped.is_set()
        finally:
            for node in (first, second):
                node.stop()

    status, stopped = asyncio.run(go())
    assert status["peers_down"] == [1] and not stopped
    assert "node 0: peer 1 sent a bad frame: bad 'report' message from peer 1" in caplog.text


def test_ill_shaped_calls_are_answered_alone_and_the_connection_kept():
    config = local_config(1, **YCSB)
    bad = {
        2: ((2, 5, {}), "procedure must be a string, got int 5"),
        3: ((3, "ycsb_txn", [1]), "params must be a map, got tuple (1,)"),
        4: ((4, "ycsb_txn"), "a call is (call_id, procedure, params), got 2 items"),
    }

    async def go() -> tuple:
        node = Node(config, 0)
        await node.start()
        try:
            reader, writer, answer = await _hello(config.nodes[0].port, "client", None)
            assert answer[0] == "ready", answer
            good = (1, "ycsb_txn", {"keys": [7], "rmw": [True]})
            writer.write(frame(("calls", (good,))))  # answered only once its epoch runs
            writer.write(frame(("calls", tuple(call for call, _ in bad.values()))))
            writer.write(frame(("calls", ((5, "no_such_procedure", {}), (6, *good[1:])))))
            answers = await _answers(reader, {1, 2, 3, 4, 5, 6})
            writer.write(frame(("status", 9)))
            status = await asyncio.wait_for(read_frame(reader, 2**20), WAIT_S)
            writer.write(frame(("calls", ((7, *good[1:]), ("x", "ycsb_txn", {})))))
            closing = await asyncio.wait_for(read_frame(reader, 2**20), WAIT_S)
            writer.close()
        finally:
            node.stop()
        return answers, status, closing

    answers, status, closing = asyncio.run(go())
    assert [answers[i][0] for i in (1, 6)] == ["committed", "committed"], answers
    for call_id, (_, reason) in bad.items():
        assert answers[call_id][0] == "error"
        assert reason in answers[call_id][2], answers[call_id]
    assert answers[5][0] == "error", answers[5]
    assert status[:2] == ("status", 9)
    assert closing[0] == "error"
    assert "must start with an int call id" in closing[1], closing


@pytest.mark.parametrize(
    "call",
    [("x", "ycsb_txn", {}), (1.5, "p", {}), (), [1, "p", {}], None],
)
def test_a_call_without_a_usable_call_id_is_a_frame_error(call):
    with pytest.raises(FrameError, match="int call id"):
        call_problem(call)


def test_a_well_shaped_call_has_no_problem():
    assert call_problem((1, "ycsb_txn", {"keys": [1]})) is None


@pytest.mark.parametrize(
    ("kind", "body", "problem"),
    [
        ("values", ((7, 0, None, None, None),), "unexpected value for txn 7 piece 0"),
        ("values", 5, "object is not iterable"),  # not a list of entries at all
        ("report", ((0, {}, None, None),), "second or unknown report from node 1"),
        ("report", ((5, {}, None, None),), "node 1 reported slot 5 of 0 calls"),
    ],
)
def test_a_well_framed_but_wrong_peer_message_is_that_peers_fault(kind, body, problem):
    """Values nobody waits for, a second report, a body of the wrong shape: a bad frame."""
    from dgcc.protocols.dist_dgcc import EpochRun
    from dgcc.protocols.dist_results import ResultAssembler

    config = local_config(2, **YCSB)

    async def go() -> None:
        node = Node(config, 0)
        node._running_epoch = 3  # mid-epoch 3, which waits for no value
        node._run = EpochRun(0, node.db, node.registry, node.router, [[], []])
        assembler = ResultAssembler(node.registry, [], 2)
        if "second" in problem:
            assembler.add(1, [])  # node 1 has reported epoch 3 already
        node._assemblers[3] = (assembler, [])
        reader = asyncio.StreamReader()
        reader.feed_data(frame((kind, 3, 1, body)))
        reader.feed_eof()
        with pytest.raises(FrameError, match=f"bad {kind!r} message from peer 1: .*{problem}"):
            await node._serve_peer(reader, 1)

    asyncio.run(go())


@pytest.mark.parametrize(
    "body",
    [((7, 0, None, None, None),), 5, ((7,),)],
    ids=["unexpected", "not-entries", "short-entry"],
)
def test_a_bad_values_body_kept_for_a_later_epoch_ends_the_link_not_the_node(body, caplog):
    # Values that arrive before their epoch runs are kept with their sender; when the epoch
    # runs and one breaks the protocol, that peer's link ends (as had it been checked on
    # arrival) and the node goes on with the epoch.
    config = local_config(2, **YCSB)

    async def go() -> _Losing:
        node = _Losing(config, 0)
        node._inputs[0] = {0: [], 1: (0, [], None)}  # epoch 0: no calls from either node
        node._values[0] = [(1, body)]
        executor = asyncio.create_task(node._executor())
        await asyncio.wait_for(node.lost.wait(), WAIT_S)
        for _ in range(1000):  # the executor goes on past the bad body (yields, no sleep)
            if node._executed_epochs:
                break
            await asyncio.sleep(0)
        assert not executor.done(), executor
        executor.cancel()
        return node

    with caplog.at_level(logging.WARNING, logger="dgcc.net.node"):
        node = asyncio.run(go())
    assert node._executed_epochs == 1 and node.failure is None
    assert 1 in node._down
    assert "peer 1 sent a bad frame: bad 'values' message from peer 1" in caplog.text


def test_a_dump_larger_than_any_frame_is_refused_with_a_reason(monkeypatch):
    # A frame header announces at most 4 GiB: a node whose rows encode to more answers the
    # dump request with an error naming why, and the connection stays usable (shown here with
    # the bound lowered, as 4 GiB of rows will not fit a test).
    import dgcc.net.wire as wire

    config = local_config(1, **YCSB)

    async def go() -> tuple:
        node = Node(config, 0)
        await node.start()
        try:
            client = await AsyncClient.connect("127.0.0.1", config.nodes[0].port)
            try:
                monkeypatch.setattr(wire, "FRAME_BODY_MAX", 4096)
                with pytest.raises(FrameError) as refused:
                    await client.dump(timeout_s=WAIT_S)
                monkeypatch.undo()
                status = await client.status(timeout_s=WAIT_S)
            finally:
                await client.close()
        finally:
            node.stop()
        return str(refused.value), status

    reason, status = asyncio.run(go())
    assert "cannot answer: node 0 cannot send its rows: a 'dump' message of" in reason, reason
    assert "does not fit one frame (at most 4,096 bytes)" in reason, reason
    assert status["id"] == 0


class _BigOutputs(Workload):
    """Ten keys over two nodes (``k % 2``); ``carry`` reads ``src`` (``2**70`` with ``big``, an
    output msgpack cannot carry) and writes ``dst`` from it (a value message when the two keys
    lie on different nodes)."""

    name = "big_outputs_test"

    def schema(self) -> Database:
        return Database((Table("kv"),))

    def build(self, seed: int) -> Database:
        db = self.schema()
        db["kv"].rows.update({k: {"v": k} for k in range(10)})
        return db

    def partition_of(self, key: Hashable, partitions: int) -> int:
        return key[1] % partitions  # type: ignore[index]

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable]:
        return [("kv", params["src"]), ("kv", params["dst"])]

    def registry(self) -> ProcedureRegistry:
        def plan(params: Mapping[str, Any], view: object) -> list[Piece]:
            src, dst, big = params["src"], params["dst"], params["big"]

            def read(ctx: PieceContext) -> int:
                return 2**70 if big else ctx.get("kv", src)["v"]

            def write(ctx: PieceContext) -> None:
                ctx.update("kv", dst, {"v": ctx.input("read") % 1000})

            return [
                Piece("read", read, reads=(("kv", src),)),
                Piece("write", write, writes=(("kv", dst),), after=("read",)),
            ]

        return ProcedureRegistry([Procedure("carry", {"src": int, "dst": int, "big": int}, plan)])

    def requests(self, seed: int) -> Iterator[TxnRequest]:
        while True:
            yield TxnRequest("carry", {"src": 1, "dst": 0, "big": 0})

    def check(self, db: Database) -> list[str]:
        return []


@pytest.mark.parametrize("protocol", ["dgcc", "calvin", "no_wait"])
def test_an_output_no_message_can_carry_fails_its_call_alone(protocol, monkeypatch):
    # A piece's output beyond 64 bits, needed on another node (a value, a 2PC reply) or due in
    # another node's report: that call fails with a reason, the nodes keep running and the
    # next calls commit. (Such a node used to stop, and the cluster with it.)
    monkeypatch.setitem(WORKLOADS, _BigOutputs.name, _BigOutputs)
    config = local_config(2, workload=_BigOutputs.name, epoch_ms=2.0, protocol=protocol)
    inward = {"src": 1, "dst": 0}  # read on node 1, write on node 0 (the called node)
    outward = {"src": 0, "dst": 1}  # read on node 0, write on node 1
    remote = {"src": 1, "dst": 3}  # both on node 1: only its answer crosses

    async def go() -> tuple:
        nodes = [server_class(protocol)(config, n) for n in range(2)]
        await asyncio.gather(*(node.start() for node in nodes))
        try:
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                outcomes = [
                    await client.call("carry", {**params, "big": big}, timeout_s=WAIT_S)
                    for params, big in (
                        (inward, 1),
                        (outward, 1),
                        (remote, 1),
                        *((params, 0) for params in (inward, outward, remote)),
                    )
                ]
                status = await client.status()
        finally:
            for node in nodes:
                node.stop()
        return outcomes, status

    outcomes, status = asyncio.run(go())
    crossed, answered, after = outcomes[:2], outcomes[2], outcomes[3:]
    for outcome in crossed:
        assert outcome.status is Status.ERROR, outcome
        assert "cannot be sent" in outcome.reason and "OverflowError" in outcome.reason, outcome
    # DistDGCC and Calvin fail a call whose report cannot reach its origin (ERROR: the writes
    # of the pieces that ran stand); 2PC forwards a call owned elsewhere, which commits there
    # and loses only its result.
    assert answered.status is (Status.COMMITTED if protocol == "no_wait" else Status.ERROR)
    assert "cannot be sent" in answered.reason and "OverflowError" in answered.reason, answered
    assert [outcome.status for outcome in after] == [Status.COMMITTED] * 3, after
    assert status["peers_down"] == ()


@contextlib.asynccontextmanager
async def _running(config: Any) -> AsyncIterator[list[Node]]:
    """Every node of ``config``, started in this event loop; stopped on the way out."""
    nodes = [Node(config, n) for n in range(len(config.nodes))]
    await asyncio.gather(*(node.start() for node in nodes))
    try:
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_hostile_param_fails_its_call_alone_with_a_short_reason():
    """A param nested near msgpack's depth limit, or one whose repr is 4x its size, once stopped
    a node (a RecursionError printing it) or the cluster (a reason, sent in a peer's report,
    larger than a frame): each now fails its call with a reason of bounded length."""
    config = local_config(2, **YCSB, frame_bytes_max=64 * 1024)
    hostile = [
        {"keys": [_nested(980)], "rmw": [True]},  # a key is an int: the plan names the value
        {"keys": ["\x00" * 30_000], "rmw": [True]},  # repr 120 kB; unroutable: both nodes plan
        {"keys": [2, 3], "rmw": [True]},  # unequal lengths: the plan prints the params
    ]

    async def go() -> tuple:
        port = config.nodes[0].port
        async with _running(config), await AsyncClient.connect("127.0.0.1", port) as client:
            bad = [await client.call("ycsb_txn", p, timeout_s=WAIT_S) for p in hostile]
            params = {"keys": [2, 3], "rmw": [True, True]}  # needs both nodes
            good = await client.call("ycsb_txn", params, timeout_s=WAIT_S)
            status = await client.status()
        return bad, good, status

    bad, good, status = asyncio.run(go())
    for outcome in bad:
        assert outcome.status is Status.ERROR, outcome
        assert 0 < len(outcome.reason) <= 300, outcome.reason[:400]
    assert "key must be an int" in bad[0].reason and "((((...),),),)" in bad[0].reason
    assert "..." in bad[1].reason and "keys and rmw must be equally long" in bad[2].reason
    assert good.committed, good
    assert status["peers_down"] == ()


def test_peer_messages_may_exceed_the_client_frame_limit():
    """frame_bytes_max bounds one client frame; an epoch batches many calls, so the inputs it
    sends a peer can be larger (here 4 calls of ~1.2 kB under a 2 kB limit), and must pass."""
    config = local_config(  # the epoch closes at 4 calls; its timer is far off
        2,
        workload="ycsb",
        workload_options={"records": 100},
        epoch_ms=2000.0,
        epoch_calls_max=4,
        frame_bytes_max=2048,
    )
    keys = list(range(100)) * 6  # every call spans both nodes
    params = {"keys": keys, "rmw": [False] * len(keys)}

    async def one(port: int) -> Any:
        async with await AsyncClient.connect("127.0.0.1", port) as client:
            return await client.call("ycsb_txn", params, timeout_s=WAIT_S)

    async def go() -> tuple:
        async with _running(config) as nodes:  # 4 calls at node 0: one epoch, one inputs frame
            outcomes = await asyncio.gather(*(one(config.nodes[0].port) for _ in range(4)))
            return outcomes, nodes[0].status(), nodes[0].stats["net/peer_bytes"]

    outcomes, status, sent = asyncio.run(go())
    assert [o.status for o in outcomes] == [Status.COMMITTED] * 4, outcomes
    assert status["peers_down"] == [] and sent > 4 * 1200  # (the inputs, then the rest)


def _blocking_call(port: int, params: dict) -> Any:
    with Client("127.0.0.1", port, timeout_s=WAIT_S) as client:
        return client.call("ycsb_txn", params)


@pytest.mark.parametrize("repeat", [15, 30000], ids=["3kB", "5MB"])
@pytest.mark.parametrize("blocking", [False, True], ids=["async", "blocking"])
def test_a_client_frame_over_the_limit_is_refused_and_said_so(blocking, repeat):
    """The node answers an oversized frame ("error", reason) and closes: the client raises
    FrameRefused with that reason (the call did not run), not a bare connection loss. (Far
    over the limit too: the node reads and drops the rest before closing, or the close with
    unread input resets the connection and the reason is lost.)"""
    config = local_config(1, **YCSB, frame_bytes_max=2048)
    params = {"keys": list(range(100)) * repeat, "rmw": [False] * (100 * repeat)}

    async def go() -> BaseException:
        async with _running(config):
            if blocking:  # in a thread: the node answers on this event loop
                call = asyncio.to_thread(_blocking_call, config.nodes[0].port, params)
                return (await asyncio.gather(call, return_exceptions=True))[0]
            async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
                call = client.call("ycsb_txn", params, timeout_s=WAIT_S)
                return (await asyncio.gather(call, return_exceptions=True))[0]

    error = asyncio.run(go())
    assert isinstance(error, FrameRefused), repr(error)
    assert "exceeds the limit of 2048" in str(error), error


def test_a_node_whose_log_cannot_be_written_stops_and_says_why(tmp_path, monkeypatch):
    """The disk fails under a logging node: the call in that epoch is never answered as
    committed, the node stops at once (not at its next epoch, which an idle node never
    reaches), and ``run_node`` raises, so ``dgcc node`` exits non-zero with the reason."""
    import errno

    import dgcc.wal.writer as writer_module
    from dgcc.net.node import NodeFailed, run_node

    config = local_config(1, **YCSB, data_dir=str(tmp_path))

    def full_disk(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def go() -> tuple[Any, BaseException | None]:
        started = asyncio.get_running_loop().create_future()
        running = asyncio.create_task(run_node(config, 0, started.set_result))
        await asyncio.wait_for(asyncio.shield(started), WAIT_S)
        monkeypatch.setattr(writer_module, "write_all", full_disk)
        async with await AsyncClient.connect("127.0.0.1", config.nodes[0].port) as client:
            answer = await asyncio.gather(
                client.call("ycsb_txn", {"keys": [7], "rmw": [True]}, timeout_s=WAIT_S),
                return_exceptions=True,
            )
        try:
            await asyncio.wait_for(running, WAIT_S)
        except NodeFailed as error:
            return answer[0], error
        return answer[0], None

    answer, error = asyncio.run(go())
    assert isinstance(answer, ConnectionLost), answer  # never "committed"
    assert isinstance(error, NodeFailed), error
    assert "node 0 stopped: writing its log failed" in str(error) and "No space" in str(error)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ((), "not a known request"),
        (("launch", (1, 2)), "not a known request"),
        (("prepare",), "an ill-shaped 'prepare' request"),
        (("prepare", 5), "an ill-shaped 'prepare' request"),  # no branch id
        (("call", (1, 2), 7, {}), "needs a procedure name and params"),
        (("pieces", (1, 2), (1,), "p", {}, ("x",), {}), "an ill-shaped 'pieces' request"),
        (("decided", (5,)), "needs transaction ids"),
    ],
)
def test_a_2pc_node_refuses_an_ill_shaped_request_as_a_bad_frame(body, problem):
    # Refused on arrival (the sender's link ends, as for any bad frame) instead of raising in
    # the request's task, which stopped the whole node, and as if asked to.
    from dgcc.net.servers.twopc import request_problem

    assert problem in request_problem(body)
    config = local_config(2, **YCSB, protocol="no_wait")

    async def go() -> None:
        node = server_class("no_wait")(config, 0)
        reader = asyncio.StreamReader()
        reader.feed_data(frame(("req", 1, 1, body)))
        reader.feed_eof()
        with pytest.raises(FrameError, match=f"bad .req. message from peer 1: .*{problem}"):
            await node._serve_peer(reader, 1)
        assert not node.stopped.is_set() and node.failure is None

    asyncio.run(go())


def test_a_2pc_answer_of_the_wrong_shape_is_the_peers_fault():
    from dgcc.net.servers.twopc import reply_problem, request_problem

    assert request_problem(("pieces", (1, 2), (3, 0), "p", {}, (0, 1), {})) is None
    assert reply_problem("call", ("committed", {"x": 1}, None)) is None
    assert reply_problem("pieces", ("ok", {"a": 1})) is None
    assert reply_problem("prepare", True) is None
    assert "an ill-shaped answer to 'call'" in reply_problem("call", (1,))
    assert "to 'pieces'" in reply_problem("pieces", ("ok", 5))
    assert "to 'prepare'" in reply_problem("prepare", "yes")
    assert "to 'decided'" in reply_problem("decided", (5,))


def test_a_raising_done_callback_does_not_cost_the_other_calls_their_answers(caplog):
    config = local_config(1, **YCSB)
    good = {"keys": [3], "rmw": [True]}

    async def go() -> tuple[list, str, str]:
        answers: list = []

        def broken(result: Any) -> None:
            raise RuntimeError("the caller's bug")

        async with _running(config):
            client = await AsyncClient.connect("127.0.0.1", config.nodes[0].port)
            client.submit("ycsb_txn", good, broken)
            last = asyncio.get_running_loop().create_future()
            client.submit("ycsb_txn", good, answers.append)
            client.submit("ycsb_txn", good, last.set_result)
            await asyncio.wait_for(last, WAIT_S)
            await client.status(timeout_s=WAIT_S)  # the read loop still runs
            with pytest.raises(ValueError, match="timeout_s must be > 0"):
                await client.call("ycsb_txn", good, timeout_s=0)
            await client.close()
            with pytest.raises(ConnectionLost) as closed:
                await client.status()
        return answers, str(closed.value), caplog.text

    with caplog.at_level(logging.ERROR, logger="dgcc.net.client"):
        answers, closed, logged = asyncio.run(go())
    assert [outcome.status for outcome in answers] == [Status.COMMITTED]
    assert "a call's done callback raised" in logged
    assert "was closed" in closed and "None" not in closed


def test_a_stop_request_ends_a_node_still_waiting_for_its_peers():
    """A node listens before it connects to its peers; a stop request then (``dgcc cluster
    stop`` while a peer never came up) ends it at once, not once its connect timeout (60 s)
    has run out with a "peer unreachable" failure."""
    from dgcc.net.node import run_node

    config = local_config(2, **YCSB)  # node 1 never starts

    async def go() -> None:
        ready: list[Any] = []
        running = asyncio.create_task(run_node(config, 0, ready.append))
        for _ in range(10_000):  # yield to the node until it listens (no timed wait)
            try:
                client = await AsyncClient.connect("127.0.0.1", config.nodes[0].port)
                break
            except ConnectionLost:
                await asyncio.sleep(0)
        async with client:
            await client.stop_node(timeout_s=WAIT_S)
        await asyncio.wait_for(running, WAIT_S)  # returns: no NodeFailed, no timeout
        assert ready == []  # it never had its peers

    asyncio.run(go())
