"""Per-node dependency logs of a DistDGCC cluster: a node recovers alone; a cluster restarts.

Goal: a node's log (its inputs and the values it received, one block per epoch) lets that node
rebuild exactly its state with no peer, while the others keep theirs; after a whole-cluster
stop with uneven durability, every node replays up to the newest epoch all made durable, and
the union of the nodes' owned rows equals the serial replay of exactly those epochs. Method:
N nodes in one process running ``LoggedEpochRun``s, value messages delivered in a seeded
random order through the wire codec, each node logging to its own directory.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import shutil
from pathlib import Path

import pytest

from dgcc.api import TxnRequest
from dgcc.errors import DgccError
from dgcc.net.wire import decode, encode
from dgcc.protocols.dist_placement import Placement, Router, global_batch, owned_rows
from dgcc.protocols.serial import SerialProtocol
from dgcc.wal.checkpoint import ACKED_RECORD, read_acked
from dgcc.wal.format import WalCorrupt, decode_payload
from dgcc.wal.node_log import (
    LoggedEpochRun,
    NodeDurability,
    NodeLog,
    cluster_durable_epoch,
    recover_node,
    replay_node_epoch,
)
from dgcc.wal.recovery import read_log
from dgcc.wal.rejoin import RejoinError
from dgcc.wal.writer import list_segments
from dgcc.workloads import get_workload

OPTIONS = {
    "warehouses": 3,
    "items": 200,
    "customers_per_district": 30,
    "orders_per_district": 30,
    "remote_item_fraction": 0.2,
    "remote_payment_fraction": 0.3,
}
NODES, EPOCHS, PER_NODE, SEED = 3, 4, 25, 4


def _wire(message):
    return decode(encode(("m", message)))[1]


class Cluster:
    """N logging nodes in one process (the node server's epoch loop without the network)."""

    def __init__(
        self,
        root: Path,
        upto_epoch: int | None = None,
        checkpoint_every: int = 0,
        keep_upto: int | None = None,
    ):
        self.workload = get_workload("tpcc", **OPTIONS)
        self.registry = self.workload.registry()
        self.router = Router(self.workload, Placement.round_robin(NODES))
        self.logs = [
            NodeLog(
                root / f"node{n}",
                n,
                self.registry,
                self.router,
                lambda: self.workload.build(SEED),
                self.workload.schema,
                upto_epoch=upto_epoch,
                checkpoint_every_epochs=checkpoint_every,
                keep_upto=keep_upto,
            )
            for n in range(NODES)
        ]
        self.durable: list[list[int]] = [[] for _ in range(NODES)]

    def run_epoch(
        self, batches: list[list[TxnRequest]], rng: random.Random, twice: bool = False
    ) -> None:
        """Run one epoch on every node (``twice``: deliver every value message two times)."""
        runs = [
            LoggedEpochRun(n, self.logs[n].db, self.registry, self.router, batches)
            for n in range(NODES)
        ]
        inflight = []
        while not all(run.finished for run in runs) or inflight:
            for run in runs:
                run.step(rng.randint(1, 20))
                inflight += [(t, _wire(entries)) for t, entries in run.take_outbox().items()]
            stuck = all(run.finished or not run.has_ready for run in runs)
            if inflight and (rng.random() < 0.7 or stuck):
                target, entries = inflight.pop(rng.randrange(len(inflight)))
                runs[target].deliver(entries)
                if twice:
                    runs[target].deliver(entries)
        for n, run in enumerate(runs):
            self.logs[n].record(run, self.durable[n].append)
        for log in self.logs:
            log.writer.wait()
        if all(self.durable):  # what the nodes' durable-epoch messages tell each other
            for log in self.logs:
                log.cluster_durable(min(durable[-1] for durable in self.durable))

    def close(self) -> None:
        for log in self.logs:
            log.close()


def _stream_batches(epochs: int) -> list[list[list[TxnRequest]]]:
    stream = get_workload("tpcc", **OPTIONS).requests(SEED + 1)
    return [
        [[TxnRequest(*_wire((r.procedure, r.params))) for r in itertools.islice(stream, PER_NODE)]
         for _ in range(NODES)]
        for _ in range(epochs)
    ]  # fmt: skip


def _serial(epochs: list[list[list[TxnRequest]]]) -> dict:
    workload = get_workload("tpcc", **OPTIONS)
    db = workload.build(SEED)
    serial = SerialProtocol(db, workload.registry())
    for batches in epochs:
        serial.run_batch(global_batch(batches))
    return db.dump()


@pytest.fixture(scope="module")
def stream() -> list[list[list[TxnRequest]]]:
    return _stream_batches(EPOCHS)


def test_single_node_recovers_alone(tmp_path: Path, stream: list) -> None:
    cluster = Cluster(tmp_path)
    rng = random.Random(SEED)
    for batches in stream:
        cluster.run_epoch(batches, rng)
    assert cluster.durable == [list(range(1, EPOCHS + 1))] * NODES  # every block acknowledged
    cluster.close()
    live = [log.db.dump() for log in cluster.logs]
    for node in range(NODES):  # each node alone, from its own directory only
        recovered = recover_node(
            tmp_path / f"node{node}",
            node,
            cluster.workload.schema,
            cluster.registry,
            cluster.router,
        )
        assert recovered.epoch == EPOCHS
        assert recovered.db.dump() == live[node]
    blocks, _ = read_log(tmp_path / "node1", 0)
    assert any(decode_payload(block)["values"] for block in blocks)  # remote values are logged


def test_a_log_cut_before_its_acked_epoch_is_refused_and_left_as_it_is(
    tmp_path: Path, stream: list, caplog: pytest.LogCaptureFixture
) -> None:
    # A tail inside the epochs the log records as durable on every node is no crash's torn
    # tail (those epochs were fsync'd everywhere; clients may have been answered): recovering
    # alone must refuse, as a whole-cluster restart does, and cut nothing (nor say it drops
    # the tail: the drop is said only where a recovery cuts it).
    cluster = Cluster(tmp_path)
    rng = random.Random(SEED)
    for batches in stream:
        cluster.run_epoch(batches, rng)
    cluster.close()
    directory = tmp_path / "node0"
    _, segment = list_segments(directory)[-1]
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) // 2])
    with pytest.raises(WalCorrupt, match=r"node 0's log ends at epoch \d+, before epoch \d+.*"
                       "nothing was cut"):  # fmt: skip
        recover_node(directory, 0, cluster.workload.schema, cluster.registry, cluster.router)
    assert segment.read_bytes() == data[: len(data) // 2]
    assert "dropping" not in caplog.text


def test_checkpoints_while_running_then_recover_alone(tmp_path: Path, stream: list) -> None:
    cluster = Cluster(tmp_path, checkpoint_every=2)
    rng = random.Random(SEED + 2)
    for batches in stream:
        cluster.run_epoch(batches, rng)
    cluster.close()  # waits for the last forked checkpoint
    for node, log in enumerate(cluster.logs):
        directory = tmp_path / f"node{node}"
        recovered = recover_node(
            directory, node, cluster.workload.schema, cluster.registry, cluster.router
        )
        assert recovered.checkpoint_epoch >= 2
        assert (recovered.epoch, recovered.db.dump()) == (EPOCHS, log.db.dump())
        assert list_segments(directory)[0][0] > 1  # the log before a checkpoint is gone


def test_whole_cluster_restart_replays_the_epochs_all_made_durable(
    tmp_path: Path, stream: list
) -> None:
    cluster = Cluster(tmp_path)
    rng = random.Random(SEED + 1)
    for batches in stream:
        cluster.run_epoch(batches, rng)
    cluster.close()
    for node in range(NODES):  # a crash, not a stop: no node recorded ACKED on the way out
        (tmp_path / f"node{node}" / ACKED_RECORD).unlink()
    _, segment = list_segments(tmp_path / "node2")[-1]  # node 2's last fsync never happened
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) - 5])
    durable = []
    for node in range(NODES):
        blocks, _ = read_log(tmp_path / f"node{node}", 0)
        durable.append(blocks[-1].epoch)
    assert durable == [EPOCHS, EPOCHS, EPOCHS - 1]
    upto = cluster_durable_epoch(durable)
    restarted = Cluster(tmp_path, upto_epoch=upto)
    assert [log.epoch for log in restarted.logs] == [upto] * NODES
    merged: dict = {}
    for node, log in enumerate(restarted.logs):
        for name, rows in owned_rows(log.db, restarted.router, node).items():
            merged.setdefault(name, {}).update(rows)
    assert merged == _serial(stream[:upto])
    restarted.run_epoch(stream[upto], random.Random(1))  # the cluster goes on from there
    restarted.close()
    for node in range(NODES):
        blocks, _ = read_log(tmp_path / f"node{node}", 0)
        assert [block.epoch for block in blocks] == list(range(1, upto + 2))


def test_rejoin_recovers_short_of_its_log_and_logs_no_epoch_twice(
    tmp_path: Path, stream: list
) -> None:
    """A rejoining node recovers to an epoch before its log's end (a peer has yet to finish the
    next one), keeps the log's tail, re-runs those epochs (value messages arriving twice, as a
    rejoin re-sends them) without logging them again, then logs on."""
    cluster = Cluster(tmp_path)
    for batches in stream:
        cluster.run_epoch(batches, random.Random(SEED))
    cluster.close()
    before = [read_log(tmp_path / f"node{n}", 0)[0] for n in range(NODES)]
    upto = EPOCHS - 2
    rejoined = Cluster(tmp_path, upto_epoch=upto, keep_upto=EPOCHS)
    assert [(log.epoch, log.logged) for log in rejoined.logs] == [(upto, EPOCHS)] * NODES
    for batches in stream[upto:]:
        rejoined.run_epoch(batches, random.Random(SEED + 3), twice=True)
    assert rejoined.durable == [[]] * NODES  # nothing written for the re-run epochs
    extra = _stream_batches(EPOCHS + 1)[EPOCHS]
    rejoined.run_epoch(extra, random.Random(SEED + 4), twice=True)
    rejoined.close()
    merged: dict = {}
    for node, log in enumerate(rejoined.logs):
        for name, rows in owned_rows(log.db, rejoined.router, node).items():
            merged.setdefault(name, {}).update(rows)
    assert merged == _serial([*stream, extra])
    for node in range(NODES):
        blocks, _ = read_log(tmp_path / f"node{node}", 0)
        assert [block.epoch for block in blocks] == list(range(1, EPOCHS + 2))
        assert blocks[:EPOCHS] == before[node]  # the tail was kept, not rewritten


def test_a_rejoin_cuts_blocks_no_running_peer_has_the_inputs_of(
    tmp_path: Path, stream: list
) -> None:
    """Node 0 died during a whole-cluster restart before cutting its log to the agreed epoch 2:
    it holds epoch 3 from its previous life while the others cut theirs and wait for its
    inputs of a new epoch 3. Rejoining them, it cuts that block (kept, it would stand for the
    new epoch 3, which ``record`` would not log) and tells the peers it made epoch 2 durable."""
    cluster = Cluster(tmp_path)
    for batches in stream[:3]:
        cluster.run_epoch(batches, random.Random(SEED))
    cluster.close()
    for node in (1, 2):  # the peers cut their logs to epoch 2 and run on
        blocks = read_log(tmp_path / f"node{node}", 0)[0]
        [(_, segment)] = list_segments(tmp_path / f"node{node}")
        with open(segment, "r+b") as log:
            log.truncate(blocks[2].offset)
    workload = cluster.workload
    durability = NodeDurability(tmp_path / "node0", 0, NODES)
    told: list[int] = []
    durability.broadcast = told.append
    state = {"executed": 2, "closed": 2, "durable": 2, "since": 0, "inputs_to": (),
             "inputs_from": (), "values_to": (), "awaiting": ()}  # fmt: skip

    async def scenario() -> None:
        for peer in (1, 2):
            durability.peer_rejoin(peer, dict(state))
        await durability.recover(
            workload.registry(), cluster.router, lambda: workload.build(SEED), workload.schema
        )

    asyncio.run(scenario())
    assert (durability.log.epoch, durability.log.logged) == (2, 2)
    assert told == [2] and durability.durable_epoch == 2
    durability.close()
    blocks = read_log(tmp_path / "node0", 0)[0]
    assert [block.epoch for block in blocks] == [1, 2]


def test_a_missing_remote_value_is_detected(tmp_path: Path, stream: list) -> None:
    """Canary: without the logged remote values a node cannot redo its epoch."""
    cluster = Cluster(tmp_path)
    cluster.run_epoch(stream[0], random.Random(SEED))
    cluster.close()
    blocks, _ = read_log(tmp_path / "node1", 0)
    payload = decode_payload(blocks[0])
    assert payload["values"]
    payload["values"] = []
    fresh = cluster.workload.build(SEED)
    with pytest.raises(DgccError, match="wait for values not in the log"):
        replay_node_epoch(1, fresh, cluster.registry, cluster.router, payload)


def test_answers_wait_until_every_node_made_the_epoch_durable(tmp_path: Path) -> None:
    workload = get_workload("tpcc", **OPTIONS)
    router = Router(workload, Placement.round_robin(NODES))
    durability = NodeDurability(tmp_path / "node0", 0, NODES)
    sent: list[tuple[int, bool, int]] = []
    durability.announce = lambda epoch, new, acked: sent.append((epoch, new, acked))
    answered: list[int] = []

    async def scenario() -> int:
        for peer in range(1, NODES):  # the peers' start-up reports: nothing on their disks
            durability.peer_durable(peer, 0)
        _, epoch = await durability.recover(
            workload.registry(), router, lambda: workload.build(SEED), workload.schema
        )
        durability.when_durable(1, lambda: answered.append(1))
        durability.when_durable(2, lambda: answered.append(2))
        for node in range(NODES - 1):
            durability.peer_durable(node, 2)
        assert answered == []  # the last node has not made epoch 1 durable yet
        durability.peer_durable(NODES - 1, 1)
        assert answered == [1]
        durability.peer_durable(NODES - 1, 2)
        return epoch

    assert asyncio.run(scenario()) == 0
    assert answered == [1, 2]
    assert sent == [(0, True, 0)]  # this node told the peers what its disk holds: no log yet
    durability.close()


@pytest.mark.parametrize("restarting", [0, 1])  # the node that holds epochs, or the new one
def test_a_restart_with_a_lost_directory_refuses_to_drop_logged_epochs(
    tmp_path: Path, stream: list, restarting: int
) -> None:
    """Whole-cluster restart where node 1's directory is gone: recovering every node to the
    smallest log end (0) would cut epochs clients may have been answered for. Both refuse."""
    cluster = Cluster(tmp_path)
    for batches in stream[:2]:
        cluster.run_epoch(batches, random.Random(SEED))
    cluster.close()
    before = read_log(tmp_path / "node0", 0)[0]
    shutil.rmtree(tmp_path / "node1")
    workload = cluster.workload
    durability = NodeDurability(tmp_path / f"node{restarting}", restarting, NODES)
    reports = {0: (len(before), False), 1: (0, True), 2: (len(before), False)}

    async def scenario() -> None:
        for peer, (epoch, new) in reports.items():
            if peer != restarting:
                durability.peer_restarting(peer, epoch, new)
        await durability.recover(
            workload.registry(), cluster.router, lambda: workload.build(SEED), workload.schema
        )

    with pytest.raises(RejoinError, match=r"nodes \[1\] start with no log while nodes \[0, 2\]"):
        asyncio.run(scenario())
    assert read_log(tmp_path / "node0", 0)[0] == before  # nothing cut


@pytest.mark.parametrize("restarting", [0, 1])  # a node with an intact log, the damaged one
def test_a_restart_refuses_to_cut_logs_back_past_an_epoch_every_node_made_durable(
    tmp_path: Path, stream: list, restarting: int
) -> None:
    """Whole-cluster restart where node 1's log lost its last blocks (damage, not a crash: the
    other nodes' logs record those epochs as durable on every node, so clients may have been
    answered). Recovering every node to node 1's end would cut them; every node refuses."""
    cluster = Cluster(tmp_path)
    for batches in stream[:3]:
        cluster.run_epoch(batches, random.Random(SEED))
    cluster.close()
    for n in range(NODES):  # as after a crash (no stop records ACKED): the blocks' own acked
        (tmp_path / f"node{n}" / ACKED_RECORD).unlink()
    blocks = read_log(tmp_path / "node1", 0)[0]
    assert [decode_payload(block)["acked"] for block in blocks] == [0, 1, 2]
    [(_, segment)] = list_segments(tmp_path / "node1")
    with open(segment, "r+b") as log:
        log.truncate(blocks[1].offset)  # node 1 keeps epoch 1 only
    before = read_log(tmp_path / "node0", 0)[0]
    workload = cluster.workload
    durability = NodeDurability(tmp_path / f"node{restarting}", restarting, NODES)
    reports = {0: (3, 2), 1: (1, 0), 2: (3, 2)}  # (log end, acked) as the nodes announce them

    async def scenario() -> None:
        for peer, (epoch, acked) in reports.items():
            if peer != restarting:
                durability.peer_restarting(peer, epoch, False, acked)
        await durability.recover(
            workload.registry(), cluster.router, lambda: workload.build(SEED), workload.schema
        )

    with pytest.raises(
        RejoinError,
        match=r"the logs of nodes \[1\] end at epochs \[1\], before "
        r"epoch 2, which node [02]'s log records as durable on every node",
    ):
        asyncio.run(scenario())
    assert read_log(tmp_path / "node0", 0)[0] == before  # nothing cut


@pytest.mark.parametrize("restarting", [0, 1])
def test_a_clean_stop_records_the_last_epoch_every_node_made_durable(
    tmp_path: Path, stream: list, restarting: int
) -> None:
    """No block records the last epochs as durable everywhere (each block knows only what was
    known as it was cut), so a log that later lost its last block looked like one that crashed
    before writing it, and a restart cut an answered epoch everywhere. A clean stop records
    that epoch (ACKED): a log short of it is refused, by the damaged node and by the others."""
    cluster = Cluster(tmp_path)
    for batches in stream[:3]:
        cluster.run_epoch(batches, random.Random(SEED))
    cluster.close()
    assert [read_acked(tmp_path / f"node{n}") for n in range(NODES)] == [3] * NODES
    blocks = read_log(tmp_path / "node1", 0)[0]
    [(_, segment)] = list_segments(tmp_path / "node1")
    with open(segment, "r+b") as log:
        log.truncate(blocks[2].offset + 10)  # node 1's last block torn: its log ends at 2
    announced = {n: NodeDurability(tmp_path / f"node{n}", n, NODES)._disk() for n in range(NODES)}
    assert announced == {0: (3, 3), 1: (2, 3), 2: (3, 3)}
    workload = cluster.workload
    durability = NodeDurability(tmp_path / f"node{restarting}", restarting, NODES)

    async def scenario() -> None:
        for peer, (epoch, acked) in announced.items():
            if peer != restarting:
                durability.peer_restarting(peer, epoch, False, acked)
        await durability.recover(
            workload.registry(), cluster.router, lambda: workload.build(SEED), workload.schema
        )

    with pytest.raises(RejoinError, match=r"the logs of nodes \[1\] end at epochs \[2\], before "):
        asyncio.run(scenario())


def test_a_node_directory_belongs_to_one_cluster_layout(tmp_path: Path) -> None:
    """A data dir records its cluster's protocol, node count, partition map and node id; a
    node of another layout is refused before it touches the log (a 2-node cluster's dirs
    restarted with 3 nodes would cut the logs to what the new node has: nothing)."""
    from dgcc.cluster import local_config
    from dgcc.errors import ConfigError
    from dgcc.wal.node_log import node_durability

    def config(nodes: int, protocol: str = "dgcc"):
        return local_config(nodes, workload="ycsb", workload_options={"records": 100},
                            protocol=protocol, data_dir=str(tmp_path))  # fmt: skip

    node_durability(config(2), 0)
    node_durability(config(2), 0)  # the same layout again: fine
    with pytest.raises(ConfigError, match=r"nodes 2 \(not 3\).*partition_nodes \[0, 1\]"):
        node_durability(config(3), 0)
    with pytest.raises(ConfigError, match="protocol 'dgcc' \\(not 'wait_die'\\)"):
        node_durability(config(2, "wait_die"), 0)


def test_an_epoch_log_refuses_a_directory_with_segments_but_no_manifest(tmp_path: Path) -> None:
    """A 2PC node's directory (its own log segments, no checkpoint manifest) is not started
    as a new epoch log on top of them."""
    workload = get_workload("ycsb", records=100)
    router = Router(workload, Placement.round_robin(1))
    (tmp_path / "wal-000000000001.log").write_bytes(b"\0" * 64)
    with pytest.raises(DgccError, match="holds log segments but no checkpoint manifest"):
        NodeLog(tmp_path, 0, workload.registry(), router, lambda: workload.build(SEED),
                workload.schema)  # fmt: skip
    assert not (tmp_path / "MANIFEST").exists()
