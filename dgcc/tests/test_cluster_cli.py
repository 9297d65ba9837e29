"""The cluster command line: start, status, stop, and ``bench --nodes`` on real processes.

Method: run ``python -m dgcc`` (the ``dgcc`` entry point) as a user would; each command
returns only when its work is done (start waits for every node's READY line), so the test
reads exit codes and output, never the clock. A killed node is waited for through a pidfd.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from dgcc.cluster import load_config, local_config
from dgcc.local_cluster import read_pids, wait_ready_lines
from dgcc.net import Client
from dgcc.net.wire import frame

pytestmark = pytest.mark.integration

TIMEOUT_S = 120


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dgcc", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={"COLUMNS": "200", **_env()},
    )


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_start_status_stop(tmp_path):
    directory = str(tmp_path / "cluster")
    options = ["--workload", "smallbank", "--workload-option", "accounts=100"]
    started = _cli("cluster", "start", "--nodes", "2", "--dir", directory, *options)
    assert started.returncode == 0, started.stderr
    assert started.stdout.count("listening on 127.0.0.1:") == 2
    try:
        again = _cli("cluster", "start", "--nodes", "2", "--dir", directory, *options)
        assert again.returncode == 2
        assert "a cluster is already running in" in again.stderr, again.stderr
        assert len(again.stderr.splitlines()) == 1, again.stderr
        assert again.stdout == ""  # refused before anything said it starts
        restart = _cli("cluster", "start", "--dir", directory, "--node", "1")
        assert restart.returncode == 2
        assert "node 1 (pid " in restart.stderr and "is still running" in restart.stderr
        assert restart.stdout == ""
        status = _cli("cluster", "status", "--dir", directory)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("yes") == 2
        assert "rows held" in status.stdout, status.stdout
        port = load_config(tmp_path / "cluster" / "cluster.json").nodes[0].port
        idle = socket.create_connection(("127.0.0.1", port))  # still open when the node stops
    finally:
        stopped = _cli("cluster", "stop", "--dir", directory)
    idle.close()
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 2 of 2 nodes" in stopped.stdout
    after = _cli("cluster", "status", "--dir", directory)
    assert after.returncode == 1
    for node in (0, 1):  # each unreachable node, with the reason in full below the table
        assert f"node {node} down: ConnectionLost: cannot connect to 127.0.0.1:" in after.stdout
    for log in sorted((tmp_path / "cluster").glob("node*.log")):  # a clean stop logs no error
        assert "Traceback" not in log.read_text(), log.read_text()
    restarted = _cli("cluster", "start", "--dir", directory)  # the same cluster, no log
    try:
        assert restarted.returncode == 0, restarted.stderr
        assert "every node loads its initial data again, and what the earlier run committed " \
            "is not kept" in restarted.stdout  # fmt: skip
    finally:
        assert _cli("cluster", "stop", "--dir", directory).returncode == 0


def _kill(pid: int) -> None:
    """SIGKILL a node process (not our child: its launcher has exited) and wait for its end."""
    pidfd = os.pidfd_open(pid)
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        assert select.select([pidfd], [], [], TIMEOUT_S)[0], f"pid {pid} still runs"
    finally:
        os.close(pidfd)


def test_a_logging_cluster_restarts_a_killed_node_alone(tmp_path):
    directory = tmp_path / "cluster"
    options = ["--workload", "smallbank", "--accounts", "100", "--nodes", "2"]
    data = ["--data-dir", str(tmp_path / "data"), "--checkpoint-every-epochs", "2"]
    started = _cli("cluster", "start", "--dir", str(directory), *options, *data)
    assert started.returncode == 0, started.stderr
    assert "restart a stopped node with" in started.stdout
    node0 = load_config(directory / "cluster.json").nodes[0]
    try:
        with Client(node0.host, node0.port, timeout_s=TIMEOUT_S) as client:
            # accounts 0..49 live on node 0, 50..99 on node 1
            paid = client.call("send_payment", {"source": 10, "target": 80, "amount": 7})
            assert paid.committed, paid
            before = client.call("balance", {"customer": 80}).result["balance_cents"]
        # a running node's directory is its own: recovery may not read (or cut) its log
        busy = _cli("recover", str(tmp_path / "data" / "node1"), "--cluster",
                    str(directory / "cluster.json"), "--node", "1")  # fmt: skip
        assert busy.returncode == 2 and "(node 1): one process at a time" in busy.stderr
        _kill(read_pids(directory)[1])
        again = _cli("cluster", "start", "--dir", str(directory), "--node", "1")
        assert again.returncode == 0, again.stderr
        assert "node 1 started again" in again.stdout
        with Client(node0.host, node0.port, timeout_s=TIMEOUT_S) as client:
            paid = client.call("send_payment", {"source": 10, "target": 80, "amount": 5})
            assert paid.committed, paid
            after = client.call("balance", {"customer": 80}).result["balance_cents"]
        assert after == before + 5  # node 1 recovered the first payment and took the second
        status = _cli("cluster", "status", "--dir", str(directory))
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("yes") == 2
        on_node1 = ["--dir", str(directory), "--node", "1"]
        balance = _cli("call", "balance", '{"customer": 80}', *on_node1)
        assert balance.returncode == 0, balance.stderr
        assert json.loads(balance.stdout)["result"]["balance_cents"] == after
        poor = _cli("call", "send_payment", '{"source": 10, "target": 80, "amount": 99999999}',
                    "--dir", str(directory))  # fmt: skip
        assert poor.returncode == 1 and json.loads(poor.stdout)["reason"] == "insufficient funds"
        nope = _cli("call", "no_such", "--dir", str(directory))
        assert nope.returncode == 2 and json.loads(nope.stdout)["status"] == "error"
        checked = _cli("cluster", "check", "--dir", str(directory))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "cluster of 2 nodes (smallbank): consistent" in checked.stdout
    finally:
        stopped = _cli("cluster", "stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 2 of 2 nodes" in stopped.stdout
    assert sorted(os.listdir(tmp_path / "data")) == ["node0", "node1"]
    # A crash mid-write leaves a torn block at a log's tail: the restart cuts it off, and says
    # so on the console (not only in the node's log).
    segment = max((tmp_path / "data" / "node1").glob("wal-*.log"))
    with segment.open("ab") as log:
        log.write(b"DGWL" + bytes(10))
    restarted = _cli("cluster", "start", "--dir", str(directory))  # no flags: the same cluster
    try:
        assert restarted.returncode == 0, restarted.stderr
        assert f"restarting the cluster of {directory / 'cluster.json'}" in restarted.stdout
        torn = [line for line in restarted.stdout.splitlines() if line.startswith("node 1: ")]
        assert any("dropping 14 bytes" in line and "torn header" in line for line in torn), torn
    finally:
        assert _cli("cluster", "stop", "--dir", str(directory)).returncode == 0
    # the data dir records its workload: a cluster of other options may not reuse it
    options = ["--workload", "smallbank", "--accounts", "200", "--nodes", "2"]
    other = _cli("cluster", "start", "--dir", str(tmp_path / "other"), *options, *data)
    assert other.returncode == 2, other.stdout
    assert "holds the log of workload 'smallbank' with options {'accounts': 100}" in other.stderr


def test_check_reads_tpcc_rows_beyond_the_frame_limit_and_stop_works_after(tmp_path):
    """Each node's rows outgrow the config's frame limit (as a default TPC-C node's outgrow
    the 64 MiB default): the check still reads them, and the nodes stop by request after."""
    options = {"warehouses": 2, "items": 100, "customers_per_district": 10}
    options["orders_per_district"] = 10
    data_dir = str(tmp_path / "data")
    config = local_config(
        2, workload="tpcc", workload_options=options, frame_bytes_max=16384, data_dir=data_dir
    )
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(config.to_dict()))
    directory = str(tmp_path / "cluster")
    started = _cli("cluster", "start", "--config", str(path), "--dir", directory)
    assert started.returncode == 0, started.stderr
    try:
        node0 = config.nodes[0]
        with Client(node0.host, node0.port, timeout_s=TIMEOUT_S) as client:
            assert len(frame(("dump", 1, client.dump(frame_bytes_max=2**32 - 1)))) > 16384
        checked = _cli("cluster", "check", "--dir", directory)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "cluster of 2 nodes (tpcc): consistent" in checked.stdout
    finally:
        stopped = _cli("cluster", "stop", "--dir", directory)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 2 of 2 nodes" in stopped.stdout


def test_bad_flags_are_one_line_errors(tmp_path):
    missing = _cli("cluster", "status", "--dir", str(tmp_path / "nothing"))
    assert missing.returncode == 2
    assert "no cluster in" in missing.stderr
    bad = _cli("cluster", "start", "--nodes", "0", "--dir", str(tmp_path / "none"))
    assert bad.returncode == 2
    assert "nodes must be an int in 1.." in bad.stderr
    assert len(bad.stderr.splitlines()) == 1


@pytest.mark.slow
def test_bench_on_two_nodes(tmp_path):
    out = tmp_path / "bench.json"
    result = _cli(
        "bench",
        "--nodes",
        "2",
        "--workload",
        "smallbank",
        "--workload-option",
        "accounts=200",
        "--distributed-fraction",
        "0.5",
        "--seconds",
        "1",
        "--warmup-s",
        "0.5",
        "--inflight",
        "40",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[summary] workload=smallbank protocol=dgcc nodes=2" in result.stdout
    header = next(line for line in result.stdout.splitlines() if "commits/s" in line)
    assert "aborts" in header and "cc aborts" in header, result.stdout  # as in-process runs
    record = json.loads(out.read_text())
    assert record["host"]["cpus"] == os.cpu_count()
    assert len(record["git_commit"]) == 40 or record["git_commit"] == "unknown"  # (no git)
    metrics = record["metrics"]
    assert metrics["txn/commits_per_s"] > 0
    assert 0.2 < metrics["txn/multi_node_fraction"] < 0.8
    assert metrics["net/messages_per_commit"] > 0


def _children(pid: int) -> dict[int, str]:
    """The live child processes of ``pid`` and their command lines (from /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if ppid == pid and command:
            found[int(entry)] = command
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_a_cluster_bench_with_its_nodes_and_clients(tmp_path):
    # `timeout`, CI or `kill` stop a bench with SIGTERM: its node and client processes stop
    # with it (they used to outlive it), as with Ctrl-C, and its temp folder goes.
    command = [sys.executable, "-m", "dgcc", "bench", "--nodes", "2", "--workload", "smallbank"]
    command += ["-o", "accounts=200", "--seconds", "120", "--warmup-s", "0.5", "--inflight", "20"]
    bench = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while sum("dgcc.net.loadgen" in c for c in _children(bench.pid).values()) < 2:
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline, "the bench's clients never started"
            time.sleep(0.05)  # polling the process table for the clients, not a synchronisation
        children = _children(bench.pid)
        folders = {part.rsplit("/", 1)[0] for c in children.values() for part in c.split()
                   if "/dgcc_bench_" in part}  # fmt: skip
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=TIMEOUT_S)
    finally:
        bench.kill()
        bench.communicate()  # reaped, its pipes closed, whatever happened above
    assert bench.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == "dgcc: terminated"
    assert len(children) == 4, children  # two nodes, two clients
    assert not [pid for pid in children if _alive(pid)], children
    assert len(folders) == 1 and not any(os.path.exists(folder) for folder in folders), folders


def test_stop_ends_the_recorded_nodes_when_the_config_no_longer_reads(tmp_path):
    directory = tmp_path / "cluster"
    started = _cli("cluster", "start", "--nodes", "1", "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    (pid,) = read_pids(directory)
    pidfd = os.pidfd_open(pid)  # (the node is not our child: its launcher has exited)
    try:
        (directory / "cluster.json").write_text("{ not json")
        status = _cli("cluster", "status", "--dir", str(directory))
        assert status.returncode == 2 and "is not valid JSON" in status.stderr, status.stderr
        stopped = _cli("cluster", "stop", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "ending the recorded ones by SIGTERM" in stopped.stdout, stopped.stdout
        assert "stopped 1 of 1 nodes" in stopped.stdout, stopped.stdout
        exited = select.select([pidfd], [], [], 0)[0]
    finally:
        if not select.select([pidfd], [], [], 0)[0]:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # a failed stop leaks no node
        os.close(pidfd)
    assert exited
    assert not (directory / "cluster_state.json").exists()


def test_nodes_started_by_hand_are_reached_through_their_config_file(tmp_path):
    # `dgcc node --config FILE --id N` on each host leaves no cluster dir: call, status, check
    # and stop take the same file.
    config = local_config(2, workload="smallbank", workload_options={"accounts": 100})
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(config.to_dict()))
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "dgcc", "node", "--config", str(path), "--id", str(node)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_env(),
        )
        for node in (0, 1)
    ]
    try:
        wait_ready_lines(nodes, TIMEOUT_S)
        by_file = ("--config", str(path))
        called = _cli("call", "deposit_checking", '{"customer": 7, "amount": 5}', *by_file)
        assert called.returncode == 0, called.stderr
        assert json.loads(called.stdout)["status"] == "committed"
        both = _cli("call", "balance", '{"customer": 7}', *by_file, "--dir", str(tmp_path))
        assert both.returncode == 2 and "give --dir" in both.stderr and "not both" in both.stderr
        status = _cli("cluster", "status", *by_file)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("yes") == 2, status.stdout
        checked = _cli("cluster", "check", *by_file)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "cluster of 2 nodes (smallbank): consistent" in checked.stdout
        stopped = _cli("cluster", "stop", *by_file)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "stopped 2 of 2 nodes" in stopped.stdout
        for node in nodes:
            assert node.wait(timeout=TIMEOUT_S) == 0
        again = _cli("cluster", "stop", *by_file)
        assert again.returncode == 1
        assert "nodes [0, 1] did not answer (not running, or not reachable from here)" in (
            again.stdout
        )
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
