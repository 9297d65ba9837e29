"""``dgcc cluster start`` and ``dgcc bench --nodes`` flags: the config they build, and refusals.

Method: parse the flags with the real ``dgcc`` parser and build the config the command would
start, or run ``main`` in-process on flags it must refuse; every refusal happens before any
node process starts, so these tests start none. The config keys documented in dgcc/README.md
are checked against ``ClusterConfig`` and its example file is loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import socket
import struct
import threading
from pathlib import Path

import pytest

from dgcc.cli import WORKLOAD_FLAGS, build_parser
from dgcc.cli_cluster import _bench_config, _flags_config
from dgcc.cluster import ClusterConfig, load_config, local_config
from dgcc.errors import ConfigError
from dgcc.net.loadgen import EPOCH_MS_DEFAULT, ClusterBenchConfig, check_tpcc_placement
from dgcc.net.wire import FRAME_BYTES_MAX, VERSION, decode, frame

README = Path(__file__).resolve().parents[1] / "README.md"
SMALL_TPCC = ["--items", "100", "--customers-per-district", "10", "--orders-per-district", "10"]


def _start_config(*flags: str) -> ClusterConfig:
    return _flags_config(build_parser().parse_args(["cluster", "start", *flags]))


def _write_cluster(directory: Path, **options: object) -> None:
    """A cluster dir as ``cluster start`` leaves it, with nothing running."""
    directory.mkdir()
    config = local_config(2, workload="smallbank", workload_options={"accounts": 100}, **options)
    (directory / "cluster.json").write_text(json.dumps(config.to_dict()))


def test_tpcc_warehouses_count_per_node_so_every_node_owns_some():
    config = _start_config("--nodes", "3", "--workload", "tpcc", *SMALL_TPCC)
    assert config.workload_options["warehouses"] == 3 * 2  # the default: 2 per node
    check_tpcc_placement(config)
    config = _start_config("--nodes", "2", "--workload", "tpcc", "--warehouses", "3", *SMALL_TPCC)
    assert config.workload_options["warehouses"] == 6
    assert config.workload_options["items"] == 100
    with pytest.raises(ConfigError, match="tpcc warehouses per node must be an int >= 1, got 0"):
        _start_config("--workload", "tpcc", "-o", "warehouses=0")


def test_a_tpcc_config_file_leaving_a_node_without_warehouses_is_refused(tmp_path, cli_error):
    config = local_config(2, workload="tpcc", workload_options={"warehouses": 1, "items": 100})
    path = tmp_path / "one_warehouse.json"
    path.write_text(json.dumps(config.to_dict()))
    err = cli_error(["cluster", "start", "--config", str(path), "--dir", str(tmp_path)])
    assert "tpcc with warehouses=1 leaves nodes [1] of 2 owning no warehouse" in err
    assert "give at least 2 warehouses" in err
    assert not (tmp_path / "cluster.json").exists()  # refused before anything was written


def test_durability_flags_build_the_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _start_config(
        "--data-dir", "data", "--checkpoint-every-epochs", "50", "--secret-env", "DGCC_TEST"
    )
    assert config.data_dir == str(tmp_path / "data")  # absolute: --node may run elsewhere
    assert config.checkpoint_every_epochs == 50
    assert config.secret_env == "DGCC_TEST"
    assert _start_config().data_dir is None


def test_cli_epoch_ms_defaults_agree_with_the_cluster_benchmarks():
    assert _start_config().epoch_ms == EPOCH_MS_DEFAULT
    args = build_parser().parse_args(["bench", "--nodes", "2", "--workload", "ycsb"])
    bench = _bench_config(args)
    assert bench.epoch_ms == EPOCH_MS_DEFAULT == ClusterBenchConfig("ycsb", 2).epoch_ms
    assert bench.durable is False


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--warmup-s", "nan"], "warmup_s must be in [0, 3600], got nan"),
        (["--warmup-s", "-1"], "warmup_s must be in [0, 3600], got -1.0"),
        (["--warmup-s", "1e9"], "warmup_s must be in [0, 3600], got 1000000000.0"),
        (["--distributed-fraction", "1.5"], "distributed_fraction must be in [0, 1], got 1.5"),
    ],
)
def test_bench_on_nodes_refuses_bad_flags_before_starting_anything(flags, message):
    args = build_parser().parse_args(["bench", "--nodes", "2", "--workload", "ycsb", *flags])
    with pytest.raises(ConfigError) as info:
        _bench_config(args)
    assert str(info.value) == message


def test_bench_durable_asks_for_logging_nodes():
    args = build_parser().parse_args(["bench", "--nodes", "2", "--durable", "--warehouses", "1"])
    bench = _bench_config(args)
    assert bench.durable is True
    assert bench.workload_options == {"warehouses": 1}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--checkpoint-every-epochs", "5"], "--checkpoint-every-epochs needs --data-dir"),
        (["--data-dir", ""], "--data-dir must name a directory, got ''"),
        (["--data-dir", "d", "--checkpoint-every-epochs", "-1"], "must be an int >= 0, got -1"),
        (["--secret-env", "DGCC_TEST_UNSET"], "secret_env 'DGCC_TEST_UNSET' is not set"),
        (["--epoch-ms", "-1"], "--epoch-ms must be > 0, got -1"),
    ],
)
def test_bad_start_flags_are_one_line_errors(tmp_path, monkeypatch, cli_error, flags, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DGCC_TEST_UNSET", raising=False)
    err = cli_error(["cluster", "start", "--dir", "run", *flags])
    assert message in err
    assert not any(tmp_path.iterdir())  # refused before any directory or process


def test_a_data_dir_that_is_a_file_is_refused(tmp_path, cli_error):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    err = cli_error(["cluster", "start", "--dir", str(tmp_path / "run"), "--data-dir", str(a_file)])
    assert f"cannot use {str(a_file)!r} as a data dir: Not a directory" in err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--nodes", "3", "--workload", "tpcc"], "--nodes, --workload do not apply with --node"),
        (["--protocol", "calvin"], "--protocol does not apply with --node"),
        (["--warehouses", "2", "-o", "theta=0.5"], "--warehouses, --workload-option do not"),
        (["--config", "x.toml"], "--config does not apply with --node"),
        (["--data-dir", "d", "--seed", "3"], "--seed, --data-dir do not apply with --node"),
    ],
)
def test_node_refuses_the_flags_it_would_ignore(tmp_path, cli_error, flags, named):
    _write_cluster(tmp_path / "run", data_dir=str(tmp_path / "data"))
    argv = ["cluster", "start", "--dir", str(tmp_path / "run"), "--node", "1", *flags]
    err = cli_error(argv)
    assert named in err
    assert "the node restarts with the config of the cluster in --dir" in err


def test_config_refuses_the_flags_it_would_ignore(tmp_path, cli_error):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(local_config(1).to_dict()))
    argv = ["cluster", "start", "--config", str(path), "--dir", str(tmp_path / "run")]
    err = cli_error([*argv, "--nodes", "3", "--epoch-ms", "1"])
    assert "--nodes, --epoch-ms do not apply with --config" in err
    assert not (tmp_path / "run").exists()


def test_a_node_of_a_cluster_without_logging_is_refused_at_once(tmp_path, cli_error):
    run = tmp_path / "run"
    _write_cluster(run)  # started without --data-dir
    err = cli_error(["cluster", "start", "--dir", str(run), "--node", "1"])
    assert "node 1 cannot restart alone" in err
    assert "runs without logging (no data_dir)" in err
    assert "--data-dir DIR" in err
    assert not (run / "node1.log").exists()  # no node process was started


def _sub_commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_every_command_and_flag_has_help():
    commands = _sub_commands(build_parser())
    cluster = _sub_commands(commands.choices["cluster"])
    for actions in (commands, cluster):
        for choice in actions._choices_actions:
            assert choice.help and choice.help != choice.dest, choice.dest
    parsers = {**commands.choices, **{f"cluster {n}": p for n, p in cluster.choices.items()}}
    for name, command in parsers.items():
        for action in command._actions:
            if action.option_strings and action.option_strings != ["-h", "--help"]:
                assert action.help, f"{name} {action.option_strings}"
    assert len(WORKLOAD_FLAGS) > 10  # (the workload flags are among them)


def test_readme_documents_every_config_key_and_its_example_loads(tmp_path, monkeypatch):
    text = README.read_text()
    documented = re.findall(r"^\| `(\w+)`(?:, `(\w+)`)?", text, re.MULTILINE)
    keys = {key for pair in documented for key in pair if key}
    assert keys == {field.name for field in dataclasses.fields(ClusterConfig)}
    example = re.search(r"```toml\n(.*?)```", text, re.DOTALL)
    assert example is not None
    path = tmp_path / "cluster.toml"
    path.write_text(example.group(1))
    monkeypatch.setenv("DGCC_SECRET", "s")  # hosts beyond loopback need the secret
    config = load_config(path)
    assert [node.host for node in config.nodes] == ["10.0.0.1", "10.0.0.2"]
    assert (config.data_dir, config.secret_env) == ("/var/lib/dgcc", "DGCC_SECRET")


class _FakeNodes:
    """Stands in for two running Smallbank nodes: status answers from a script, dumps of the
    rows each owns (``check``'s merging and quiescence logic, without processes)."""

    def __init__(self, statuses: list[list[dict]], negative: bool = False) -> None:
        self.statuses = iter(statuses)
        self.limits: list[int] = []  # each client's frame limit, then its dump's
        rows = {c: {"bal": -5 if negative and c == 3 else 100} for c in range(4)}
        names = {c: {"name": f"c{c}"} for c in range(4)}
        tables = {"accounts": names, "savings": rows, "checking": rows}
        self.dumps = [  # customers 0, 1 on node 0; 2, 3 on node 1
            {name: {c: row for c, row in table.items() if c // 2 == node}
             for name, table in tables.items()}
            for node in range(2)
        ]  # fmt: skip

    def status(self, config, *, timeout_s):
        return next(self.statuses)

    def client(self, host, port, *, secret, timeout_s, frame_bytes_max):
        dump = self.dumps[port % 2]
        limits = self.limits

        class _Client:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return None

            def dump(self, *, frame_bytes_max):
                limits.append(frame_bytes_max)
                return dump

        limits.append(frame_bytes_max)

        return _Client()


def _quiet(commits: int, waiting: int = 0, behind: int = 0, down: int | None = None) -> list:
    keys = {"txn/committed": commits, "txn/aborted": 0, "txn/error": 0, "epochs_closed": 9}
    return [
        {"id": n, "waiting_calls": waiting, "epochs_executed": 9 - behind * n,
         "peers_down": [] if down is None else [down], **keys}
        for n in range(2)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([_quiet(5), _quiet(5)], []),  # quiet: one read
        ([_quiet(5), _quiet(6), _quiet(6), _quiet(6)], []),  # a commit during the read: again
        ([_quiet(5, waiting=1)] * 2 + [_quiet(5)] * 2, []),  # a waiting call: again
        ([_quiet(5, behind=1)] * 2 + [_quiet(5)] * 2, []),  # node 1 has not run an epoch yet
        ([_quiet(5, down=0)] * 2 + [_quiet(5)] * 2, []),  # a peer link down: stalled
    ],
)
def test_check_merges_every_nodes_rows_once_the_cluster_is_quiet(
    monkeypatch, statuses, expected
) -> None:
    from dgcc import local_cluster as cluster

    fake = _FakeNodes(statuses)
    monkeypatch.setattr(cluster, "status", fake.status)
    monkeypatch.setattr("dgcc.net.client.Client", fake.client)
    config = local_config(2, workload="smallbank", workload_options={"accounts": 4})
    config = dataclasses.replace(config, nodes=tuple(
        dataclasses.replace(node, port=10_000 + node.id) for node in config.nodes
    ))  # fmt: skip
    assert cluster.check(config) == expected
    # the config's limit for every frame but a node's rows, which may be far larger
    assert fake.limits[:4] == [config.frame_bytes_max, cluster.DUMP_BYTES_MAX] * 2


def test_check_reports_violations_and_refuses_a_busy_cluster(monkeypatch) -> None:
    from dgcc import local_cluster as cluster

    config = local_config(2, workload="smallbank", workload_options={"accounts": 4})
    config = dataclasses.replace(config, nodes=tuple(
        dataclasses.replace(node, port=10_000 + node.id) for node in config.nodes
    ))  # fmt: skip
    fake = _FakeNodes([_quiet(5), _quiet(5)], negative=True)
    monkeypatch.setattr(cluster, "status", fake.status)
    monkeypatch.setattr("dgcc.net.client.Client", fake.client)
    assert cluster.check(config) == ["negative savings for customers [3]"]  # node 1's row
    fake = _FakeNodes([[{**entry, "error": "refused"} for entry in _quiet(5)]])
    monkeypatch.setattr(cluster, "status", fake.status)
    with pytest.raises(ConfigError, match=r"nodes \[0, 1\] do not answer"):
        cluster.check(config)
    fake = _FakeNodes([_quiet(n) for n in range(10)])
    monkeypatch.setattr(cluster, "status", fake.status)
    with pytest.raises(ConfigError, match="stayed busy over 3 tries"):
        cluster.check(config)


def _read_frame(connection: socket.socket) -> tuple:
    with connection.makefile("rb") as stream:
        (length,) = struct.unpack(">I", stream.read(4))
        return decode(stream.read(length))


def _serve_node(listener: socket.socket, connections: int, answers: dict[str, object]) -> None:
    """One node, over a real socket: ``connections`` clients in turn, each with the handshake
    (no secret) and one request answered from ``answers`` by kind."""
    for _ in range(connections):
        connection, _ = listener.accept()
        with connection:
            connection.sendall(frame(("hello", VERSION, 0, b"nonce")))
            assert _read_frame(connection)[:3] == ("hello", VERSION, "client")
            connection.sendall(frame(("ready", 0)))
            kind, request_id = _read_frame(connection)
            connection.sendall(frame((kind, request_id, answers[kind])))


def test_check_reads_a_dump_larger_than_any_frame_limit_for_calls() -> None:
    """A node's rows in one answer over 64 MiB (a default TPC-C node's are ~130 MB), through
    the real client; the check used to refuse them at the 64 MiB default frame limit."""
    from dgcc import local_cluster as cluster

    names = {c: {"name": f"c{c}"} for c in range(4)} | {0: {"name": "x" * (FRAME_BYTES_MAX + 1)}}
    balances = {c: {"bal": 100} for c in range(4)}
    dump = {"accounts": names, "savings": balances, "checking": balances}
    answers = {"status": _quiet(5)[0], "dump": dump}
    with socket.create_server(("127.0.0.1", 0)) as listener:
        config = local_config(1, workload="smallbank", workload_options={"accounts": 4})
        node = dataclasses.replace(config.nodes[0], port=listener.getsockname()[1])
        config = dataclasses.replace(config, nodes=(node,))
        server = threading.Thread(target=_serve_node, args=(listener, 3, answers), daemon=True)
        server.start()  # status, dump, status: a quiet cluster is read once
        assert cluster.check(config) == []
        server.join(timeout=60)
    assert not server.is_alive()


def test_call_refuses_params_that_are_not_a_json_object(tmp_path, cli_error) -> None:
    _write_cluster(tmp_path / "run")
    call = ["call", "balance", "--dir", str(tmp_path / "run")]
    assert "params '{bad' are not JSON" in cli_error([*call[:2], "{bad", *call[2:]])
    assert "params must be a JSON object" in cli_error([*call[:2], "[1]", *call[2:]])
    assert "--node 5 is not a node" in cli_error([*call, "--node", "5"])


def test_a_node_of_a_2pc_cluster_is_refused_at_once(tmp_path, cli_error):
    """A 2PC node does not rejoin running peers: restarting one alone would wait out the ready
    timeout; the whole cluster restarts instead (each node recovers from its log)."""
    run = tmp_path / "run"
    _write_cluster(run, protocol="occ", data_dir=str(tmp_path / "data"))
    err = cli_error(["cluster", "start", "--dir", str(run), "--node", "1"])
    assert "node 1 cannot restart alone: occ nodes do not rejoin running peers" in err
    assert "dgcc cluster stop, then dgcc cluster start" in err
    assert not (run / "node1.log").exists()  # no node process was started


@pytest.mark.parametrize("protocol", ["dgcc", "occ"])
def test_status_names_a_node_that_lost_its_peer_link(monkeypatch, capsys, protocol) -> None:
    """A node up and ready whose link to a peer failed (a crash, a frame it refused) stalls the
    epochs it shares, or (2PC, which runs no epochs) fails the calls that need the peer:
    status says which below the table and exits 1, as for a node down."""
    from dgcc import cli_cluster

    config = local_config(2, protocol=protocol)
    entries = [
        dict(node, host="127.0.0.1", port=7001 + node["id"], pid=100, ready=True, rows_held=4)
        for node in _quiet(5, down=1)
    ]
    monkeypatch.setattr(cli_cluster, "cluster_status", lambda config: entries)
    assert cli_cluster._status(config) == 1
    out = capsys.readouterr().out
    assert out.count("peers down") == 2, out
    if protocol == "dgcc":
        assert "node 0 lost its link to nodes [1]: the epochs they share wait until" in out
    else:
        assert "node 0 lost its link to nodes [1]: its calls that need them fail; a occ " in out
        assert "restarts whole (dgcc cluster stop, then dgcc cluster start" in out
        assert cli_cluster._status(config, by_file=True) == 1  # nodes started by hand
        assert "then dgcc node --config FILE --id N on each host" in capsys.readouterr().out
    epochs_cells = {line.split("│")[5].strip() for line in out.splitlines() if "127.0.0.1" in line}
    assert epochs_cells == ({"9"} if protocol == "dgcc" else {"-"}), out
    entries = [entry | {"peers_down": []} for entry in entries]
    assert cli_cluster._status(config) == 0
    assert "peers down" not in capsys.readouterr().out
