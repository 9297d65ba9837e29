"""Bad input to cluster configs and ``dgcc cluster``: one-line errors, and no stray signals.

Method: build configs from bad values and check the ConfigError names the field and value;
run ``main`` in-process on bad directories, state files and ``--json`` paths (each fails
before any node starts); stand in for node processes with ``python -c`` children whose
command line ends like a real node's (they wait on stdin, so they run until signalled),
and bind, without listening, the ports of nodes that must be unreachable, so a connection
is refused at once and no other process can take the port. One test starts a real node
on a port already in use.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dgcc.cli import main
from dgcc.cli_cluster import _stop_summary
from dgcc.cluster import ClusterConfig, NodeAddress, load_config, local_config
from dgcc.errors import ConfigError
from dgcc.local_cluster import (
    STATE_FILE,
    StopResult,
    _node_args,
    _terminate,
    _wait_ready_or_kill,
    read_pids,
    start_local,
    start_node,
    stop,
)
from dgcc.net.wire import VERSION, frame

NODE = {"id": 0, "host": "127.0.0.1", "port": 7001}
WAIT_S = 30.0


def _config(**values: object) -> ClusterConfig:
    return ClusterConfig.from_dict({"nodes": [NODE], **values})


@pytest.fixture
def children():
    """Processes a test starts; killed and reaped whatever the test did."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=WAIT_S)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


WAIT_FOR_STDIN = "import sys; print('up', flush=True); sys.stdin.read()"


def _started(children: list, command: list[str]) -> subprocess.Popen:
    """``command`` running: it printed its first line, so its /proc command line is readable
    (right after ``Popen`` returns it can still read empty, and the child would not count)."""
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    children.append(process)
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    return process


def _fake_node(children: list, directory: Path, node: int) -> subprocess.Popen:
    """A child whose command line ends with node ``node``'s arguments; it runs until killed."""
    return _started(children, [sys.executable, "-c", WAIT_FOR_STDIN, *_node_args(directory, node)])


def _other_program(children: list) -> subprocess.Popen:
    return _started(children, [sys.executable, "-c", WAIT_FOR_STDIN])


def _write_cluster(directory: Path, config: ClusterConfig, pids: list[int]) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "cluster.json").write_text(json.dumps(config.to_dict()))
    (directory / STATE_FILE).write_text(json.dumps({"pids": pids}))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"frame_bytes_max": "x"}, "frame_bytes_max must be an int, got 'x'"),
        ({"frame_bytes_max": -1}, "frame_bytes_max must be an int >= 1024, got -1"),
        ({"secret": 123}, "secret must be a non-empty string, got 123"),
        ({"epoch_ms": float("inf")}, "epoch_ms must be a number of milliseconds in [0, 60000]"),
        ({"epoch_ms": float("nan")}, "epoch_ms must be a number of milliseconds in [0, 60000]"),
        ({"epoch_ms": 1e300}, "epoch_ms must be a number of milliseconds in [0, 6"),
        ({"delay_ms_max": float("nan")}, "delay_ms_max must be a number of milliseconds in [0, 6"),
        ({"delay_ms_max": 61_000}, "delay_ms_max must be a number of milliseconds in [0, 6"),
        ({"seed": "x"}, "seed must be an int, got 'x'"),
        ({"order_log": "yes"}, "order_log must be true or false, got 'yes'"),
        ({"protocol": ["x"]}, "protocol must be a name, got ['x']"),
        ({"protocol": "nope"}, "unknown protocol 'nope'"),
        ({"workload": 5}, "workload must be a name, got 5"),
        ({"workload": "nope"}, "unknown workload 'nope'"),
        ({"workload_options": [1]}, "workload_options must be a table of options, got [1]"),
        ({"workload_options": {"bogus": 1}}, "do not fit 'ycsb'"),
        ({"partition_nodes": 5}, "partition_nodes must be a list of node ids, got 5"),
        ({"nodes": "abc"}, "nodes must be a list of tables (id, host, port), got 'abc'"),
        ({"nodes": [NODE | {"port": 0}]}, "node 0: port 0 outside 1..65535"),
        ({"nodes": [NODE | {"id": "0"}]}, "node id must be an int, got '0'"),
        (
            {"nodes": [{"id": 0, "host": "h"}]},
            "node entry {'id': 0, 'host': 'h'} lacks ['port'] (it takes id, host, port)",
        ),
        ({"nodes": [NODE | {"name": "a"}]}, "has unknown keys ['name'] (it takes id, host, port)"),
        (
            {"nodes": [NODE, NODE | {"id": 1}]},
            "nodes 0 and 1 share the address 127.0.0.1:7001: each node needs its own host:port",
        ),
        (
            {"nodes": [NODE | {"host": "LOCALHOST"}, NODE | {"id": 1, "host": "localhost"}]},
            "nodes 0 and 1 share the address localhost:7001",  # host names ignore case
        ),
        (
            {"checkpoint_every_epochs": 5},
            "checkpoint_every_epochs = 5 needs data_dir (checkpoints are written there)",
        ),
        (
            {"protocol": "occ", "data_dir": "d", "checkpoint_every_epochs": 5},
            "protocol 'occ' logs without checkpoints (its prepare and commit records are the "
            "log); drop checkpoint_every_epochs = 5",
        ),
    ],
)
def test_bad_config_values_fail_when_built(values, message):
    with pytest.raises(ConfigError) as raised:
        _config(**values)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_config_without_nodes_says_so_and_any_name_reads_as_json_or_toml(tmp_path):
    with pytest.raises(ConfigError, match="cluster config has no nodes"):
        ClusterConfig.from_dict({"epoch_ms": 2})
    path = tmp_path / "cluster.yaml"  # TOML under another name: once "Expecting value"
    path.write_text('[[nodes]]\nid = 0\nhost = "127.0.0.1"\nport = 7001\n')
    assert load_config(path).nodes == (NodeAddress(0, "127.0.0.1", 7001),)
    path.write_text("nodes = [")
    with pytest.raises(ConfigError, match="is not valid JSON nor TOML: "):
        load_config(path)


def test_json_infinity_and_nan_fail_when_loaded(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text('{"nodes": [{"id": 0, "host": "127.0.0.1", "port": 7001}], "epoch_ms": 1e400}')
    with pytest.raises(ConfigError, match=r"epoch_ms must be .* in \[0, 60000\], got inf"):
        load_config(path)
    assert _config(seed=-3, secret="s", order_log=True).seed == -3  # good values still pass


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("garbage", "is unreadable"),
        ("{}", "holds no list of pids"),
        ('{"pids": "abc"}', "holds no list of pids"),
        ('{"pids": [-1]}', "holds no list of pids"),
        ('{"pids": [1099511627776]}', "holds no list of pids"),  # beyond any pid: damage
    ],
)
def test_a_bad_state_file_is_one_line_error(tmp_path, text, message, cli_error):
    (tmp_path / STATE_FILE).write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_pids(tmp_path)
    err = cli_error(["cluster", "start", "--nodes", "1", "--dir", str(tmp_path)])
    assert "remove it if no cluster runs there" in err


def test_unusable_dir_and_json_paths_fail_up_front(tmp_path, cli_error):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    start = ["cluster", "start", "--nodes", "1", "--dir"]
    assert "Not a directory" in cli_error([*start, str(a_file)])
    assert "No such file" in cli_error([*start, "/proc/nope"])
    assert "no cluster in" in cli_error(["cluster", "stop", "--dir", str(a_file)])
    bench = ["bench", "--seconds", "0.1", "--warmup-s", "0"]
    err = cli_error([*bench, "--json", "/proc/nope/x.json"])
    assert "--json '/proc/nope/x.json' cannot be written" in err
    err = cli_error(["recover", str(tmp_path), "--json", str(a_file / "x.json")])
    assert "cannot be written: Not a directory" in err
    assert "Is a directory" in cli_error([*bench, "--json", str(tmp_path)])


@pytest.mark.timeout(60)  # a cluster that took it would wait for 2000 calls per epoch
def test_epochs_closed_by_count_alone_are_refused_on_the_command_line(tmp_path, cli_error):
    """``--epoch-ms 0`` made every node wait for epoch_calls_max (2000) calls before it
    closed an epoch: a ``dgcc call`` then hung until its timeout."""
    start = ["cluster", "start", "--nodes", "1", "--dir", str(tmp_path), "--epoch-ms", "0"]
    assert "--epoch-ms must be > 0, got 0: epochs closed by count alone" in cli_error(start)
    assert not (tmp_path / "cluster.json").exists()
    bench = ["bench", "--nodes", "2", "--seconds", "0.1", "--warmup-s", "0", "--epoch-ms", "0"]
    assert "--epoch-ms must be > 0" in cli_error(bench)
    assert "--epoch-ms must be > 0, got -1" in cli_error([*bench[:-1], "-1"])


def test_a_node_log_that_cannot_be_opened_is_one_line_and_rolled_back(tmp_path, cli_error):
    (tmp_path / "node0.log").mkdir()  # where node 0's log file goes
    start = ["cluster", "start", "--nodes", "1", "--dir", str(tmp_path)]
    assert f"cannot use {str(tmp_path)!r} as a cluster directory" in cli_error(start)
    assert not (tmp_path / "cluster.json").exists()


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("raise ValueError('bad default')\n", "raised ValueError: bad default"),
        ("def broken(:\n", "raised SyntaxError"),
    ],
)
def test_a_workload_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch, cli_error,
                                                            source, says):  # fmt: skip
    (tmp_path / "badworkload.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    bench = ["bench", "--workload", "badworkload:Mine", "--seconds", "0.1"]
    assert f"workload 'badworkload:Mine': importing 'badworkload' {says}" in cli_error(bench)


@pytest.mark.timeout(60)  # a node that took the config would serve until stopped
def test_a_config_file_is_refused_with_one_line_before_any_node_starts(tmp_path, cli_error):
    path = tmp_path / "c.json"
    nodes = [NODE, NODE | {"id": 1}]
    path.write_text(json.dumps({"nodes": nodes}))
    start = ["cluster", "start", "--config", str(path), "--dir", str(tmp_path / "run")]
    for argv in (["node", "--config", str(path), "--id", "0"], start):
        assert "share the address 127.0.0.1:7001" in cli_error(argv)
    path.write_text(json.dumps({"nodes": [NODE], "checkpoint_every_epochs": 3}))
    assert "checkpoint_every_epochs = 3 needs data_dir" in cli_error(start)
    assert not (tmp_path / "run").exists()
    # a node given the data dir the file leaves out: checkpoints have a place to go
    assert load_config(path, data_dir=str(tmp_path / "data")).checkpoint_every_epochs == 3


def test_node_refuses_a_data_dir_it_cannot_use_with_one_line(tmp_path, cli_error):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"nodes": [NODE, NODE | {"id": 1, "port": 7002}]}))
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    node = ["node", "--config", str(path), "--id", "1", "--data-dir"]
    err = cli_error([*node, str(a_file)])
    assert f"cannot use {str(a_file)!r} as a data dir: Not a directory" in err
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "node1").write_text("")  # where node 1 would log
    err = cli_error([*node, str(tmp_path / "data")])
    assert f"cannot use {str(tmp_path / 'data' / 'node1')!r} as a data dir: Not a" in err
    assert "data_dir must be a non-empty string" in cli_error([*node, ""])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--timeout-s", "-1"], "--timeout-s must be a number of seconds in (0, 604800], got -1.0"),
        (["--timeout-s", "0"], "--timeout-s must be a number of seconds in (0, 604800], got 0.0"),
        (["--timeout-s", "nan"], "--timeout-s must be a number of seconds in (0, 604800], got nan"),
        (["--timeout-s", "inf"], "--timeout-s must be a number of seconds in (0, 604800], got inf"),
        (["--timeout-s", "1e12"], "in (0, 604800], got 1000000000000.0"),
        (
            ['{"keys": [99999999999999999999999], "rmw": [true]}'],
            "hold an integer outside -2**63 .. 2**64 - 1, which a call cannot carry",
        ),
        (['{"keys": [-9223372036854775809]}'], "hold an integer outside -2**63 .. 2**64 - 1"),
        (['{"name": "a\\ud800"}'], "hold '\\ud800', which is not valid in UTF-8 (a lone surr"),
        (['{"a": ' + "[" * 5000 + "]" * 5000 + "}"], "are not JSON: maximum recursion depth"),
        (['{"w_id": 1, "w_id": 2}'], """params '{"w_id": 1, "w_id": 2}' name 'w_id' twice"""),
        (['{"a": {"b": 1, "b": 1}}'], "name 'b' twice"),  # (json would keep the last)
    ],
)
def test_call_refuses_bad_timeouts_and_params_with_one_line(tmp_path, cli_error, flags, message):
    """Refused before any connection: the cluster's nodes (port 7001) are not running."""
    directory = tmp_path / "run"
    _write_cluster(directory, _config(), [])
    err = cli_error(["call", "balance", *flags, "--dir", str(directory)])
    assert message in err


def _recv_frame(conn: socket.socket) -> bytes:
    head = conn.recv(4, socket.MSG_WAITALL)
    return conn.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL)


def _against_a_fake_node(
    tmp_path: Path, serve: Any, argv: list[str], pids: list[int] | None = None
) -> tuple[int, int]:
    """``dgcc *argv --dir tmp_path`` against a one-node cluster folder whose node is
    ``serve(server)`` on a thread (``pids``: its state file's); (exit status, the port)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        _write_cluster(tmp_path, _config(nodes=[NODE | {"port": port}]), pids or [])
        node = threading.Thread(target=serve, args=(server,))
        node.start()
        code = main([*argv, "--dir", str(tmp_path)])
        node.join(WAIT_S)
    return code, port


def _handshake(conn: socket.socket) -> None:
    """A node's side of a client's handshake (no secret)."""
    conn.sendall(frame(("hello", VERSION, 0, b"nonce")))
    _recv_frame(conn)  # the client's hello
    conn.sendall(frame(("ready", 0)))


def _node_that_never_answers(server: socket.socket, hang_up: bool) -> None:
    """Accept one client, shake hands, take its call, then hang up or say nothing until the
    client leaves."""
    conn, _ = server.accept()
    with conn:
        _handshake(conn)
        _recv_frame(conn)  # the call
        if not hang_up:
            conn.recv(1)  # returns once the client gave up and closed its end


def _silent_listener(server: socket.socket) -> None:
    """Accept one connection and say nothing until the client leaves (not a dgcc node)."""
    conn, _ = server.accept()
    with conn:
        conn.recv(1)


def test_a_port_that_accepts_but_never_greets_is_named_so(tmp_path, capsys):
    # (not "sent nothing ... (connection closed)", which reads as a node that went quiet)
    code, port = _against_a_fake_node(
        tmp_path, _silent_listener, ["call", "balance", "{}", "--timeout-s", "0.5"]
    )
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert f"127.0.0.1:{port} accepted the connection but sent no greeting within 0.5 s" in err


@pytest.mark.parametrize("hang_up", [False, True])
def test_a_call_sent_but_not_answered_exits_3_as_unknown(tmp_path, capsys, hang_up):
    # The node may still commit such a call: a user who read "error" would call it again.
    serve = functools.partial(_node_that_never_answers, hang_up=hang_up)
    argv = ["call", "balance", '{"customer": 1}', "--timeout-s", "0.5"]
    code, port = _against_a_fake_node(tmp_path, serve, argv)
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"dgcc: error: node 0 at 127.0.0.1:{port}: ")
    assert "closed the connection" in err if hang_up else "sent nothing for 0.5 s" in err
    assert err.endswith("the call was sent, so its outcome is unknown: it may still commit "
                        "(look at its effect before calling again)")  # fmt: skip


def _node_that_answers(server: socket.socket, result: object) -> None:
    """Accept one client, shake hands, and answer its one call COMMITTED with ``result``."""
    import msgpack

    conn, _ = server.accept()
    with conn:
        _handshake(conn)
        calls = msgpack.unpackb(_recv_frame(conn), use_list=False)[1]
        conn.sendall(frame(("results", ((calls[0][0], "committed", result, None),))))


def test_a_call_result_with_keys_json_cannot_take_prints_them_as_reprs(tmp_path, capsys):
    # msgpack carries a procedure's map with tuple keys; json.dumps refuses such keys
    result = {(1, 2): "pair", "rows": [{(3,): b"raw"}], 7: None}
    serve = functools.partial(_node_that_answers, result=result)
    code, _ = _against_a_fake_node(tmp_path, serve, ["call", "balance", '{"customer": 1}'])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out) == {
        "status": "committed",
        "result": {"(1, 2)": "pair", "rows": [{"(3,)": "b'raw'"}], "7": None},
        "reason": None,
    }


def _another_clusters_node(server: socket.socket, pid: int, asked: list[str]) -> None:
    """Accept one client and answer its requests as a node of another cluster (pid ``pid``)
    would; note each request's kind in ``asked``."""
    import msgpack

    conn, _ = server.accept()
    with conn:
        _handshake(conn)
        while data := _recv_frame(conn):
            kind, request_id = msgpack.unpackb(data, use_list=False)[:2]
            asked.append(kind)
            body = {"id": 0, "pid": pid, "host": "127.0.0.1", "port": server.getsockname()[1],
                    "ready": True, "peers_down": (), "epochs_executed": 0, "rows_held": 0,
                    "txn/committed": 0, "txn/aborted": 0, "txn/error": 0}  # fmt: skip
            conn.sendall(frame((kind, request_id, body if kind == "status" else True)))


@pytest.mark.parametrize("action", ["stop", "status"])
def test_a_port_another_cluster_took_is_not_this_folders_node(tmp_path, capsys, action):
    """The folder records pid 4241 for node 0; what answers on its port is pid 4242 (another
    cluster that got the port after this one stopped): stop leaves it alone, status says so."""
    asked: list[str] = []
    serve = functools.partial(_another_clusters_node, pid=4242, asked=asked)
    code, _ = _against_a_fake_node(tmp_path, serve, ["cluster", action], pids=[4241])
    out = capsys.readouterr().out
    assert "stop" not in asked, asked
    if action == "stop":
        assert "left pids [4242] alone" in out, out
    else:
        assert code == 1 and "answers from pid 4242, which is not the process this folder" in out


def test_start_refuses_a_directory_whose_cluster_runs(tmp_path, children):
    config = local_config(1)
    node = _fake_node(children, tmp_path, 0)
    _write_cluster(tmp_path, config, [node.pid])
    state = (tmp_path / STATE_FILE).read_text()
    with pytest.raises(ConfigError, match=rf"already running in .* \(pids \[{node.pid}\]\)"):
        start_local(config, tmp_path)
    with pytest.raises(ConfigError, match=f"node 0 \\(pid {node.pid}\\) is still running"):
        start_node(tmp_path, 0)
    assert (tmp_path / STATE_FILE).read_text() == state


def test_start_refuses_data_the_local_nodes_cannot_hold_together(tmp_path, monkeypatch):
    from dgcc import workloads

    options = {"records": 10_000}
    one_node = workloads.get_workload("ycsb", **options).data_bytes()[0]
    monkeypatch.setattr(workloads, "available_memory_bytes", lambda: int(2.5 * one_node))
    config = local_config(3, workload="ycsb", workload_options=options)
    with pytest.raises(
        ConfigError, match=r"3 local nodes of ycsb with records=10000, field_chars=10 need about"
    ):
        start_local(config, tmp_path)  # each fits alone; three loading at once do not
    assert not any(tmp_path.iterdir())  # refused before anything was written or spawned


def test_stop_signals_only_this_clusters_nodes(tmp_path, children, capsys):
    holders = [socket.socket() for _ in range(3)]  # bound, not listening: connects are refused
    for holder in holders:
        holder.bind(("127.0.0.1", 0))
    nodes = tuple(NodeAddress(n, "127.0.0.1", h.getsockname()[1]) for n, h in enumerate(holders))
    config = ClusterConfig(nodes=nodes)
    node0, other = _fake_node(children, tmp_path, 0), _other_program(children)
    stale = _fake_node(children, tmp_path / "elsewhere", 2)  # a node of another cluster
    pids = [node0.pid, other.pid, stale.pid]
    try:
        _write_cluster(tmp_path, config, pids)
        assert main(["cluster", "stop", "--dir", str(tmp_path)]) == 0
        assert not (tmp_path / STATE_FILE).exists()
        assert node0.wait(timeout=WAIT_S) == -signal.SIGTERM
        _write_cluster(tmp_path, config, pids)  # now stale for node 0 too
        assert stop(config, directory=tmp_path) == StopResult(not_ours=(other.pid, stale.pid))
    finally:
        for holder in holders:
            holder.close()
    assert other.poll() is None and stale.poll() is None
    out = capsys.readouterr().out
    assert "stopped 1 of 3 nodes (unreachable nodes [0] by SIGTERM)" in out
    assert "2 of 3 nodes were not running" in out
    assert f"left pids [{other.pid}, {stale.pid}] alone" in out


def test_stop_status_and_call_need_not_import_the_workload(tmp_path, capsys):
    # A user workload off PYTHONPATH once made stop fail ("cannot import ...") with its nodes
    # left running; only check (which reads the rows) builds the workload.
    holder = socket.socket()  # bound, not listening: connects are refused
    holder.bind(("127.0.0.1", 0))
    nodes = (NodeAddress(0, "127.0.0.1", holder.getsockname()[1]),)
    config = ClusterConfig(nodes=nodes, workload="no_such_pkg.bank:Bank", check_workload=False)
    try:
        _write_cluster(tmp_path, config, [])
        assert main(["cluster", "stop", "--dir", str(tmp_path)]) == 0
        assert "1 of 1 nodes were not running" in capsys.readouterr().out
        main(["cluster", "status", "--dir", str(tmp_path)])
        assert "node 0 down" in capsys.readouterr().out
        assert main(["call", "p", "--dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "no_such_pkg" not in err and "cannot connect" in err
        assert main(["cluster", "check", "--dir", str(tmp_path)]) == 2
        assert "no_such_pkg" in capsys.readouterr().err
    finally:
        holder.close()


def test_terminate_never_signals_groups_or_exited_processes(tmp_path, children):
    assert _terminate(0, tmp_path, 0, WAIT_S) is None
    assert _terminate(-1, tmp_path, 0, WAIT_S) is None
    node = _fake_node(children, tmp_path, 0)
    node.stdin.close()  # it reads EOF and exits
    os.waitid(os.P_PID, node.pid, os.WEXITED | os.WNOWAIT)  # exited, left a zombie
    assert _terminate(node.pid, tmp_path, 0, WAIT_S) is None
    assert node.wait(timeout=WAIT_S) == 0  # it exited by itself, not by a signal


def test_stop_summary_counts_only_stopped_nodes():
    result = StopResult(by_request=(0,), still_running=(1,), not_ours=(99,))
    assert _stop_summary(result, 3).splitlines() == [
        "stopped 1 of 3 nodes",
        "1 of 3 nodes were not running",
        "nodes [1] still run after SIGTERM",
        "left pids [99] alone: not this cluster's node processes",
    ]


@pytest.mark.parametrize("says", ["dgcc: error: port 1 on h already in use\n", ""])
def test_a_node_that_fails_to_start_is_named_with_its_own_error(tmp_path, says, children):
    log = tmp_path / "node3.log"
    log.write_text("an error of an earlier run\n")
    start = log.stat().st_size
    script = f"import sys; sys.stderr.write({says!r}); sys.exit(2)"
    with log.open("ab") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=stderr
        )
    children.append(process)
    with pytest.raises(ConfigError) as raised:
        _wait_ready_or_kill(tmp_path, [process], [start], WAIT_S, first_node=3)
    line = "port 1 on h already in use" if says else "nothing in its log"
    assert str(raised.value) == f"node 3 failed to start (exit 2): {line} (see {log})"


def test_a_failed_start_names_each_node_that_failed_with_it(tmp_path, children):
    # Nodes start in step: when a stranger holds node 1's port, node 0 fails on the
    # stranger's answer and node 1 on the port itself, moments apart; both are named (the
    # first alone named only what node 0 saw).
    processes = []
    for node, (says, after_s) in enumerate(
        [("bad hello from peer 1", 0.0), ("port 7002 on 127.0.0.1 already in use", 0.3)]
    ):
        script = f"import sys, time; time.sleep({after_s}); sys.stderr.write({says!r}); sys.exit(2)"
        with (tmp_path / f"node{node}.log").open("ab") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=stderr
            )
        children.append(process)
        processes.append(process)
    with pytest.raises(ConfigError) as raised:
        _wait_ready_or_kill(tmp_path, processes, [0, 0], WAIT_S)
    assert str(raised.value) == (
        f"node 0 failed to start (exit 2): bad hello from peer 1 (see {tmp_path / 'node0.log'}); "
        f"node 1 failed to start (exit 2): port 7002 on 127.0.0.1 already in use "
        f"(see {tmp_path / 'node1.log'})"
    )


@pytest.mark.integration
def test_a_busy_port_is_named_when_start_fails(tmp_path, cli_error):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = tmp_path / "busy.json"
        path.write_text(
            json.dumps({"nodes": [NODE | {"port": port}], "workload_options": {"records": 100}})
        )
        err = cli_error(["cluster", "start", "--config", str(path), "--dir", str(tmp_path)])
    assert f"node 0 failed to start (exit 2): port {port} on 127.0.0.1 already in use" in err
    assert f"(see {tmp_path / 'node0.log'})" in err


@pytest.mark.integration
def test_a_start_that_fails_leaves_the_cluster_directory_as_it_was(tmp_path, cli_error):
    # The folder holds a stopped cluster the user may start again (`cluster start --node`,
    # `recover --cluster` read its config): a start that fails must not leave its own config,
    # pids or half-made node directories in its place.
    earlier = local_config(2, workload="ycsb", workload_options={"records": 100})
    _write_cluster(tmp_path, earlier, [4242, 4243])
    before = {name: (tmp_path / name).read_bytes() for name in ("cluster.json", STATE_FILE)}
    data = tmp_path / "data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = tmp_path / "other.json"
        path.write_text(json.dumps({"nodes": [NODE | {"port": port}], "data_dir": str(data),
                                    "workload_options": {"records": 100}}))  # fmt: skip
        err = cli_error(["cluster", "start", "--config", str(path), "--dir", str(tmp_path)])
    assert f"port {port} on 127.0.0.1 already in use" in err
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert list(data.iterdir()) == []  # node0, made by the failed start, is gone


def test_spawn_into_holds_the_child_before_a_stop_can_interrupt(tmp_path):
    # A SIGTERM landing inside Popen once left a bench client running on after the bench had
    # stopped the others (it then failed on the deleted temp folder's config). Stops are held
    # back while the child starts and it is recorded; the child starts with them unblocked.
    import subprocess

    from dgcc.local_cluster import spawn_into

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    processes: list = []
    show_mask = "import signal; print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
    spawn_into(processes, [sys.executable, "-c", show_mask], stdout=subprocess.PIPE, text=True)
    out, _ = processes[0].communicate(timeout=60)
    assert out.strip() == "[]"  # nothing blocked in the child
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before  # nor left blocked here


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("host", "why"),
    [("no-such-host.invalid", "cannot listen on no-such-host.invalid:"), ("203.0.113.7", "assign")],
    ids=["unknown_name", "foreign_address"],
)
def test_a_node_that_cannot_listen_says_so_in_one_line(tmp_path, cli_error, host, why):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"nodes": [NODE | {"host": host}], "secret": "s3cret"}))
    err = cli_error(["node", "--config", str(path), "--id", "0"])
    assert f"node 0 cannot listen on {host}:7001: " in err and why in err


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("x={[1]: 2}", "x: '{[1]: 2}' is not a value (TypeError: unhashable type: 'list')"),
        ("x=" + "-" * 100_000 + "1", "is not a value ("),
    ],
    ids=["unhashable", "nested_too_deep"],
)
def test_a_workload_option_that_is_no_value_is_one_line(cli_error, option, says):
    assert says in cli_error(["bench", "--workload", "ycsb", "-o", option, "--seconds", "0.1"])


def test_a_json_config_naming_a_key_twice_is_refused(tmp_path, cli_error):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"nodes": [NODE], "seed": 1})[:-1] + ', "seed": 2}')
    with pytest.raises(ConfigError, match="names 'seed' twice"):
        load_config(path)
    assert "names 'seed' twice" in cli_error(["node", "--config", str(path), "--id", "0"])


def test_a_cluster_bench_refuses_a_bad_option_before_its_progress_bar(capsys):
    """The option used to fail inside the progress bar, which left a blank line on stdout."""
    from dgcc.cli import main

    assert main(["bench", "--nodes", "2", "-o", "bogus=1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dgcc: error: workload_options {'bogus': 1} do not fit 'ycsb'")
