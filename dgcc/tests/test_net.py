"""The wire format, cluster config validation and client errors, without a cluster.

Method: round-trip messages through the codec and an in-memory ``StreamReader``; feed it
truncated, oversized and garbage frames; build configs with bad values; point clients at a
closed port and at a server that never answers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest

from dgcc.cluster import ClusterConfig, NodeAddress, load_config, local_config
from dgcc.errors import ConfigError
from dgcc.net import AsyncClient, CallTimeout, Client, ConnectionLost, FrameError
from dgcc.net.wire import check_mac, decode, encode, frame, mac_of, read_frame
from dgcc.protocols.dist_dgcc import Placement


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
