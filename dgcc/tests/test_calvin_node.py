"""Calvin's node schedule: locks held across the read exchange, in the nodes' epoch runs.

A multi-node transaction's writing pieces must wait for the grant (read) message of every other
participant, a later conflicting transaction must wait behind it, and DistDGCC's piece graph must
not; and a simulated 3-node cluster with shuffled messages must equal the serial executor.
"""

from __future__ import annotations

import pytest

from dgcc import debug
from dgcc.api import TxnRequest
from dgcc.net.servers.calvin import GRANT, CalvinEpochRun
from dgcc.net.wire import decode, encode
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


def test_active_participant_waits_for_every_remote_read_and_blocks_later_conflicts() -> None:
    dist = _two_node_runs(EpochRun)[1]
    assert dist.step(100) == 2 and dist.finished  # DistDGCC: nothing waits on node 0

    node0, node1 = _two_node_runs(CalvinEpochRun)
    ran = node1.step(100)
    assert ran == 1 and not node1.has_ready and not node1.finished  # only A's grant ran
    grants = node1.take_outbox()
    assert list(grants) == [0] and grants[0][0][0] == 0  # A's grant goes to node 0
    assert node1.step(100) == 0  # A's write and B (behind A's lock) wait for node 0's read
    assert node0.step(100) == 1 and not node0.finished
    node1.deliver(_wire(node0.take_outbox()[1]))
    assert node1.step(100) == 2 and node1.finished  # A's write, then B
    node0.deliver(_wire(grants[0]))
    assert node0.step(100) == 1 and node0.finished
    for run in (node0, node1):
        for entries in run.reports().values():
            assert all(not name.startswith(GRANT) for entry in entries for name in entry[1])


@pytest.mark.parametrize(("name", "options"), [("ycsb", YCSB), ("tpcc", TPCC)])
@pytest.mark.parametrize("checked", [False, True])
def test_simulated_calvin_cluster_equals_serial(cluster_sim, name, options, checked) -> None:
    """``checked``: every access against its declaration and every piece against the lock
    graph. A multi-node call's grant step, heading its chain from the end of the plan, used
    to fail the check that edges point forward, so no Calvin node could run checked."""
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
