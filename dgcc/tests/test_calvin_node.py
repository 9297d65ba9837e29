"""Calvin's node schedule: locks held across the read exchange, in the nodes' epoch runs.

A multi-node transaction holds its locks on a node until the grant (read) message of every other
participant came, a later conflicting transaction must wait behind it, and DistDGCC's piece
schedule must not; a participant's output leaves with its grant; and a simulated 3-node cluster
with shuffled messages must equal the serial executor.
"""

from __future__ import annotations

import pytest

from dgcc import debug
from dgcc.api import TxnRequest
from dgcc.net.servers.calvin import GRANT, STEP, CalvinEpochRun
from dgcc.net.wire import decode, encode
from dgcc.protocols.calvin import LockQueue
from dgcc.protocols.dist_dgcc import EpochRun
from dgcc.protocols.dist_placement import Placement, Router
from dgcc.protocols.serial import SerialProtocol
from dgcc.workloads import get_workload

YCSB = {"records": 400, "ops_per_txn": 4, "theta": 0.9}
TPCC = {
    "warehouses": 3,
    "items": 200,
    "customers_per_district": 30,
    "orders_per_district": 30,
    "remote_item_fraction": 0.3,
    "remote_payment_fraction": 0.3,
}


def _wire(message):
    return decode(encode(("m", message)))[1]


def _two_node_runs(run_class):
    """Node 1's run of: txn A writes key 1 (node 0) and key 399 (node 1); then B writes 399."""
    workload = get_workload("ycsb", **YCSB)
    router = Router(workload, Placement.round_robin(2))
    a = TxnRequest("ycsb_txn", {"keys": [1, 399], "rmw": [True, True]})
    b = TxnRequest("ycsb_txn", {"keys": [399], "rmw": [True]})
    batches = [[a], [b]]
    dbs = [workload.build(7) for _ in range(2)]
    return [run_class(n, dbs[n], workload.registry(), router, batches) for n in range(2)]


def test_active_participant_holds_its_locks_until_every_remote_read() -> None:
    dist = _two_node_runs(EpochRun)[1]
    assert dist.step(100) == 2 and dist.finished  # DistDGCC: nothing waits on node 0

    node0, node1 = _two_node_runs(CalvinEpochRun)
    assert node1.step(100) == 2  # A's grant and its write of 399, which needs no remote read
    grants = node1.take_outbox()
    assert list(grants) == [0] and [entry[0] for entry in grants[0]] == [0]  # A's grant
    assert node1.step(100) == 0  # A keeps its lock until node 0's read comes; B waits behind it
    assert not node1.has_ready and not node1.finished
    assert node0.step(100) == 2 and not node0.finished  # A's grant and write; A holds key 1
    node1.deliver(_wire(node0.take_outbox()[1]))
    assert node1.step(100) == 2 and node1.finished  # A's release, then B
    node0.deliver(_wire(grants[0]))
    assert node0.step(100) == 1 and node0.finished
    for run in (node0, node1):
        for entries in run.reports().values():
            assert all(not name.startswith(STEP) for entry in entries for name in entry[1])


def test_remote_stock_output_leaves_with_the_grant() -> None:
    """A distributed NewOrder: the supplying node's stock piece runs at its grant, so the home
    node finishes on that one message, as Calvin forwards a participant's reads."""
    workload = get_workload("tpcc", **TPCC)
    router = Router(workload, Placement.round_robin(2))
    request = next(
        r
        for r in workload.requests(3)
        if r.procedure == "new_order" and len(router.route(r) or ()) == 2
    )
    home = router.node_of_key(("district", request.params["w_id"], request.params["d_id"]))
    dbs = [workload.build(7) for _ in range(2)]
    batches = [[request], [None]] if home == 0 else [[None], [request]]
    runs = [CalvinEpochRun(n, dbs[n], workload.registry(), router, batches) for n in range(2)]
    supplier = runs[1 - home]
    assert supplier.step(100) >= 2  # its grant and its stock piece(s)
    message = supplier.take_outbox()[home]
    names = [supplier.piece_label(index, piece) for index, piece, *_ in message]
    assert any(".stock_" in name for name in names) and any(GRANT in name for name in names), names
    assert runs[home].step(100) >= 1 and not runs[home].finished  # the order line waits
    runs[home].deliver(_wire(message))
    assert runs[home].step(100) >= 2 and runs[home].finished  # the order, then the release
    supplier.deliver(_wire(runs[home].take_outbox()[1 - home]))
    assert supplier.step(100) == 1 and supplier.finished  # its release


@pytest.mark.parametrize(("name", "options"), [("ycsb", YCSB), ("tpcc", TPCC)])
@pytest.mark.parametrize("checked", [False, True])
def test_simulated_calvin_cluster_equals_serial(cluster_sim, name, options, checked) -> None:
    """``checked``: every access against its declaration and every piece against the lock
    graph (each transaction's chain here, its grant step first)."""
    workload = get_workload(name, **options)
    with debug.invariants(checked):
        order, outcomes, merged = cluster_sim(
            CalvinEpochRun, workload, nodes=3, epochs=3, per_node=25, seed=5
        )
    serial_db = workload.build(5)
    serial = SerialProtocol(serial_db, workload.registry())
    expected = [o for batch in order for o in serial.run_batch(batch)]
    assert [(o.status, _wire(o.result)) for o in outcomes] == [
        (o.status, _wire(o.result)) for o in expected
    ]
    assert merged == _wire(serial_db.dump())


def test_lock_queue_grants_groups_in_arrival_order() -> None:
    queue = LockQueue()
    assert queue.request(1, False) and queue.request(2, False)  # readers share the lock
    assert not queue.request(3, True)  # a writer waits for both
    assert not queue.grantable(False)  # a reader behind a waiting writer waits too
    assert not queue.request(4, False) and not queue.request(5, False)
    assert queue.release() == []  # one reader left
    assert queue.release() == [3]  # the writer alone
    assert not queue.grantable(False) and not queue.grantable(True)
    assert queue.release() == [4, 5]  # then the readers after it, together
    assert not queue.grantable(True) and queue.grantable(False)  # 4, 5 hold: a reader joins
    assert queue.release() == [] and queue.release() == []
    assert queue.idle and queue.grantable(True)
