"""A whole-cluster restart from the nodes' own dependency logs, measured node by node.

Part of ``wal_logging.py``'s report (run that script). A cluster of real DistDGCC node processes
on loopback (``NODES`` of them; fewer in its quick mode), dependency logging on (one block per
node per epoch, fsync'd), runs the calls of ``epochs`` count-closed epochs; every call must be
answered, so every epoch is durable on every node. Each node's block holds its inputs and the
values it received from peers, so a node recovers alone: on a machine with a core per node the
nodes restart side by side and the cluster is back when its slowest node is (a projection: a
real restart also has the nodes agree on the epoch to restart at). Here (2 cores) each node's
recovery runs by itself in this process, timed (replay wall and CPU after the checkpoint load,
as ``recover_node`` reports it); the union of the recovered nodes' rows is checked against the
serial replay of the global order read back from the logs, with TPC-C consistency and every
answered call in that order.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgcc.api import TxnRequest
from dgcc.cluster import ClusterConfig
from dgcc.local_cluster import start_local
from dgcc.protocols.dist_placement import Router, owned_rows
from dgcc.wal.cluster_trials import ClusterDrill, check_history, drive, durable_history
from dgcc.wal.node_log import recover_node
from dgcc.wal.trials import DrillFailure
from dgcc.workloads import get_workload

NODES = 16
READY_TIMEOUT_S = 300.0  # NODES processes each build and checkpoint the data on this host


@dataclass
class ClusterLogs:
    drill: ClusterDrill
    config: ClusterConfig
    data_dir: Path
    history: list[list[TxnRequest]]  # the global order of every epoch, read from the logs
    answered: list[list]  # each node's answered calls


def run_cluster(
    work: Path, options: dict, batch: int, epochs: int, seed: int, nodes: int = NODES
) -> ClusterLogs:
    """Run ``epochs`` epochs of about ``batch`` TPC-C calls on a logging ``nodes``-node cluster
    (each node's clients send ``batch // nodes`` calls per epoch) and stop it.

    Raises:
        DrillFailure: a call went unanswered, or the logs do not hold every epoch.
    """
    drill = ClusterDrill(
        nodes=nodes, epoch_calls=batch // nodes, epochs=epochs, seed=seed, options=options
    )
    data_dir = work / "cluster_data"
    config = drill.config(data_dir)
    cluster = start_local(config, work / "cluster_run", ready_timeout_s=READY_TIMEOUT_S)
    try:
        answered = asyncio.run(drive(cluster, drill.requests(seed), None, lambda: None))
    finally:
        cluster.stop()
    sent = nodes * epochs * drill.epoch_calls
    if sum(map(len, answered)) != sent:
        raise DrillFailure(f"{sum(map(len, answered))} of {sent} calls were answered")
    history = durable_history(data_dir, nodes)
    if len(history) != epochs:
        raise DrillFailure(f"{data_dir}: the logs hold {len(history)} epochs, not {epochs}")
    return ClusterLogs(drill, config, data_dir, history, answered)


def recover_nodes(logs: ClusterLogs, rounds: int) -> list[dict[str, float]]:
    """Each node's recovery timings (best of ``rounds``) with ``rows_held``, the rows of its
    recovered database, and ``rows_whole``, those of the whole recovered state, after
    checking that the recovered nodes together hold the serial replay of the logged history.

    Raises:
        DrillFailure: the recovered rows differ from the serial replay, TPC-C consistency
            fails, or an answered call is not in the history.
    """
    workload = get_workload("tpcc", **logs.drill.options)
    registry = workload.registry()
    router = Router(workload, logs.config.placement())
    merged: dict[str, dict[Any, Any]] = {}
    timings = []
    for node in range(logs.drill.nodes):
        best: dict[str, float] = {}
        for _ in range(rounds):
            recovered = recover_node(
                logs.data_dir / f"node{node}", node, workload.schema, registry, router, repair=False
            )
            for name, seconds in recovered.timing_s.items():
                best[name] = min(best.get(name, seconds), seconds)
        for table, rows in owned_rows(recovered.db, router, node).items():
            merged.setdefault(table, {}).update(rows)
        best["rows_held"] = sum(len(table) for table in recovered.db.tables.values())
        del recovered
        timings.append(best)
    check_history(logs.drill, logs.data_dir, logs.history, merged, logs.answered)
    rows_whole = sum(map(len, merged.values()))
    for best in timings:
        best["rows_whole"] = rows_whole
    return timings
