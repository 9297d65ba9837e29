"""Recovery of the durable engine under each logging scheme.

Goal: after running epochs and reopening the directory, the state equals the serial replay of
exactly the logged epochs, for command, value and dependency logs, with and without checkpoints
(forked or inline), for any number of dependency replay workers; recovering twice changes
nothing; TPC-C consistency holds. Method: the small drill TPC-C in a temp directory, in-process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dgcc.durable import DurableConfig
from dgcc.errors import ConfigError, DgccError
from dgcc.wal import dependency, parallel
from dgcc.wal.checkpoint import (
    WORKLOAD_RECORD,
    check_workload_record,
    load_snapshot,
    read_manifest,
    read_workload_record,
)
from dgcc.wal.drill import DRILL_TPCC, batches, open_engine, reference_state
from dgcc.wal.format import BlockKind, WalCorrupt, decode_payload, encode_block, scan_bytes
from dgcc.wal.recovery import read_log, recover, replay_block
from dgcc.workloads.tpcc import TpccWorkload
from dgcc.workloads.tpcc.checks import check
from dgcc.workloads.tpcc.schema import create_tables

SEED, BATCH, EPOCHS = 3, 25, 8


@pytest.fixture(scope="module")
def reference() -> dict:
    return reference_state(SEED, BATCH, EPOCHS).dump()


def _run(directory: Path, mode: str, epochs: int = EPOCHS, **options: object) -> dict:
    engine = open_engine(directory, mode, SEED, **options)
    for requests in batches(SEED, BATCH, engine.epoch + 1, epochs - engine.epoch):
        engine.run_epoch(requests)
    engine.close()
    return engine.db.dump()


@pytest.mark.parametrize("mode", ["command", "value", "dependency"])
@pytest.mark.parametrize("checkpoint_every", [0, 3])
def test_recovered_state_equals_serial_replay(
    tmp_path: Path, reference: dict, mode: str, checkpoint_every: int
) -> None:
    live = _run(tmp_path, mode, checkpoint_every_epochs=checkpoint_every)
    assert live == reference
    registry = TpccWorkload(**DRILL_TPCC).registry()
    recovered = recover(tmp_path, create_tables, registry)
    assert recovered.epoch == EPOCHS
    assert recovered.dropped == []
    assert recovered.db.dump() == reference
    assert check(recovered.db) == []
    again = recover(tmp_path, create_tables, registry)
    assert again.db.dump() == reference


def test_inline_checkpoint_truncates_log(tmp_path: Path, reference: dict) -> None:
    _run(tmp_path, "dependency", checkpoint_every_epochs=3, fork_checkpoint=False)
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [
        "LOCK",
        "MANIFEST",
        "WORKLOAD",
        "ckpt-000000000006.snap",
        "wal-000000000007.log",
    ]
    recovered = recover(tmp_path, create_tables, TpccWorkload(**DRILL_TPCC).registry())
    assert (recovered.checkpoint_epoch, recovered.replayed_epochs) == (6, 2)
    assert recovered.db.dump() == reference


def test_damage_in_a_segment_the_checkpoint_holds_is_not_read(
    tmp_path: Path, reference: dict
) -> None:
    """A crash between publishing checkpoint 3 and deleting the segment of epochs 1..3 leaves
    that segment behind; a damaged byte there loses nothing, so recovery does not refuse."""
    covered, older = tmp_path / "covered", tmp_path / "older"
    _run(covered, "dependency", checkpoint_every_epochs=3, fork_checkpoint=False)
    _run(older, "dependency", epochs=3)  # wal-000000000001.log: epochs 1..3
    stale = covered / "wal-000000000001.log"
    data = bytearray((older / stale.name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    stale.write_bytes(bytes(data))
    assert read_manifest(covered)[0] == 6  # type: ignore[index]
    registry = TpccWorkload(**DRILL_TPCC).registry()
    recovered = recover(covered, create_tables, registry)
    assert (recovered.epoch, recovered.dropped) == (EPOCHS, [])
    assert recovered.db.dump() == reference


def test_reopen_continues_the_stream(tmp_path: Path, reference: dict) -> None:
    _run(tmp_path, "dependency", epochs=5)
    assert _run(tmp_path, "dependency") == reference  # recovers 5, runs 6..8


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_dependency_replay_any_worker_count(tmp_path: Path, reference: dict, workers: int) -> None:
    _run(tmp_path, "dependency")
    registry = TpccWorkload(**DRILL_TPCC).registry()
    recovered = recover(tmp_path, create_tables, registry, workers=workers)
    assert recovered.db.dump() == reference


def test_dependency_log_holds_graph_and_aborts(tmp_path: Path) -> None:
    _run(tmp_path, "dependency")
    blocks, _ = read_log(tmp_path, 0)
    payloads = [decode_payload(block) for block in blocks]
    for payload in payloads:
        assert len(payload["requests"]) == BATCH
        assert all(0 <= slot < len(payload["piece_counts"]) for slot in payload["aborted"])
        shape = dependency.critical_path(payload)
        assert 1 <= shape.span <= shape.pieces
        assert shape.pieces <= sum(payload["piece_counts"])


def test_none_mode_recovers_only_the_checkpoint(tmp_path: Path) -> None:
    _run(tmp_path, "none")
    recovered = recover(tmp_path, create_tables, TpccWorkload(**DRILL_TPCC).registry())
    assert recovered.epoch == 0
    assert recovered.db.dump() == reference_state(SEED, BATCH, 0).dump()


def test_bad_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'undo'"):
        DurableConfig(tmp_path, mode="undo")
    with pytest.raises(ConfigError, match="'serial'"):
        DurableConfig(tmp_path, mode="dependency", protocol="serial")
    for protocol in ("no_wait", "wait_die", "occ"):  # recovery would replay another history
        with pytest.raises(ConfigError, match=f"mode 'command' needs a deterministic.*{protocol}"):
            DurableConfig(tmp_path, mode="command", protocol=protocol)
    with pytest.raises(ConfigError, match="unknown protocol 'nope'"):
        DurableConfig(tmp_path, mode="command", protocol="nope")
    with pytest.raises(ConfigError, match="-1"):
        DurableConfig(tmp_path, checkpoint_every_epochs=-1)
    with pytest.raises(ConfigError, match="workload must be a name, got 3"):
        DurableConfig(tmp_path, workload=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"workload_options \{'records': 5\} without a workload"):
        DurableConfig(tmp_path, workload_options={"records": 5})
    with pytest.raises(ConfigError, match="workload_options must be JSON values"):
        DurableConfig(tmp_path, workload="ycsb", workload_options={"keys": {1, 2}})


def test_a_new_directory_records_its_workload(tmp_path: Path) -> None:
    open_engine(tmp_path, "command", SEED).close()
    assert read_workload_record(tmp_path) == ("tpcc", DRILL_TPCC)
    (tmp_path / WORKLOAD_RECORD).write_text('{"workload": 1}')
    with pytest.raises(WalCorrupt, match="bad workload record"):
        read_workload_record(tmp_path)


def test_a_durable_engine_reopens_only_its_own_directory(tmp_path: Path) -> None:
    """Reopening checks the WORKLOAD record (it was written, never read back); a cluster
    node's directory and a log with no checkpoint are refused before anything is written."""
    from dgcc.durable import DurableEngine
    from dgcc.wal.checkpoint import LAYOUT_RECORD

    open_engine(tmp_path / "mine", "command", SEED).close()
    workload = TpccWorkload(**DRILL_TPCC)

    def reopen(directory: Path, **options: object) -> None:
        config = DurableConfig(directory, mode="command", workload="tpcc", **options)  # type: ignore[arg-type]
        DurableEngine(config, workload.registry(), create_tables, lambda: workload.build(SEED))

    with pytest.raises(ConfigError, match="holds the log of workload 'tpcc' with options"):
        reopen(tmp_path / "mine", workload_options={**DRILL_TPCC, "items": 77})
    node = tmp_path / "node"
    node.mkdir()
    (node / LAYOUT_RECORD).write_text("{}")
    with pytest.raises(ConfigError, match="holds a cluster node's log"):
        reopen(node, workload_options=DRILL_TPCC)
    orphan = tmp_path / "orphan"
    shutil.copytree(tmp_path / "mine", orphan)
    (orphan / "MANIFEST").unlink()
    with pytest.raises(WalCorrupt, match="a log but no checkpoint manifest"):
        reopen(orphan, workload_options=DRILL_TPCC)
    assert not (orphan / "MANIFEST").exists()


def test_a_directory_is_claimed_by_one_workload(tmp_path: Path) -> None:
    node = tmp_path / "node0"
    check_workload_record(node, "ycsb", {"records": 50}, claim=False)  # no record: nothing to say
    assert not node.exists()
    check_workload_record(node, "ycsb", {"records": 50, "pair": (1, 2)}, claim=True)
    assert read_workload_record(node) == ("ycsb", {"records": 50, "pair": [1, 2]})
    check_workload_record(node, "ycsb", {"pair": (1, 2), "records": 50}, claim=True)  # the same
    with pytest.raises(ConfigError, match=r"workload 'ycsb' with options .*'records': 50.*not"):
        check_workload_record(node, "ycsb", {"records": 60, "pair": (1, 2)}, claim=False)
    defaults = tmp_path / "node1"  # options spelled out at their defaults are the same
    check_workload_record(defaults, "ycsb", {}, claim=True)
    check_workload_record(defaults, "ycsb", {"records": 100_000}, claim=False)
    with pytest.raises(ConfigError, match="not 'tpcc'"):
        check_workload_record(node, "tpcc", {"records": 50, "pair": (1, 2)}, claim=True)
    assert read_workload_record(node) == ("ycsb", {"records": 50, "pair": [1, 2]})  # kept


def test_forked_checkpoint_is_the_state_at_its_epoch(tmp_path: Path) -> None:
    """The child writes epoch 3's state while the parent already runs epochs 4..8."""
    engine = open_engine(tmp_path, "dependency", SEED, checkpoint_every_epochs=3)
    for requests in batches(SEED, BATCH, 1, EPOCHS):
        engine.run_epoch(requests)
        if engine.epoch == 3:
            assert engine.checkpointer.busy
    engine.close()
    manifest = read_manifest(tmp_path)
    assert manifest is not None
    epoch, snapshot = manifest
    assert epoch in (3, 6)
    loaded = load_snapshot(snapshot, epoch, create_tables)
    assert loaded.dump() == reference_state(SEED, BATCH, epoch).dump()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_partitioned_replay_in_worker_processes(
    tmp_path: Path, reference: dict, workers: int
) -> None:
    _run(tmp_path, "dependency", partitions=2)
    blocks, _ = read_log(tmp_path, 0)
    payloads = [decode_payload(block) for block in blocks]
    assert all(parallel.splittable(payload) for payload in payloads)
    assert any(payload["remote_values"] for payload in payloads)  # remote stock / customers
    registry = TpccWorkload(**DRILL_TPCC).registry()
    recovered = recover(tmp_path, create_tables, registry, workers=workers)
    assert recovered.db.dump() == reference
    assert check(recovered.db) == []


def test_partitioned_replay_detects_a_missing_value(tmp_path: Path) -> None:
    """Canary: drop the logged crossing values and the replayed state must differ."""
    _run(tmp_path, "dependency", partitions=2)
    blocks, _ = read_log(tmp_path, 0)
    payloads = [decode_payload(block) for block in blocks]
    crossing = [payload for payload in payloads if payload["remote_values"]]
    registry = TpccWorkload(**DRILL_TPCC).registry()
    initial = lambda: TpccWorkload(**DRILL_TPCC).build(SEED)  # noqa: E731
    for payload in crossing:
        payload["remote_values"] = {}
    with pytest.raises(DgccError, match=r"diverged|failed"):  # here (worker 0) or in a child
        parallel.replay_partitioned(initial, registry, payloads, workers=2, partitions=2)


def test_a_failed_replay_worker_is_named_with_its_reason(tmp_path: Path) -> None:
    import os

    _run(tmp_path, "dependency", partitions=2)
    payloads = [decode_payload(block) for block in read_log(tmp_path, 0)[0]]
    parent = os.getpid()

    def load():  # the forked worker cannot load its checkpoint
        if os.getpid() != parent:
            raise RuntimeError("no room for the checkpoint")
        return TpccWorkload(**DRILL_TPCC).build(SEED)

    registry = TpccWorkload(**DRILL_TPCC).registry()
    with pytest.raises(DgccError) as failed:
        parallel.replay_partitioned(load, registry, payloads, workers=2, partitions=2)
    assert "replay worker 1 (pid " in str(failed.value)
    assert "exit 1): RuntimeError: no room for the checkpoint" in str(failed.value)


@pytest.mark.parametrize("mode", ["command", "dependency"])
def test_a_malformed_request_replays_as_the_error_it_was(tmp_path: Path, mode: str) -> None:
    """A call that is no ``TxnRequest`` (here a look-alike tuple) is logged as None: it never
    ran, and must not run at replay either."""
    requests = batches(SEED, BATCH, 1, 1)[0]
    look_alike = (requests[0].procedure, requests[0].params)
    engine = open_engine(tmp_path, mode, SEED)
    outcomes = engine.run_epoch([look_alike, *requests])  # type: ignore[list-item]
    engine.close()
    assert outcomes[0].status.value == "error"
    blocks, _ = read_log(tmp_path, 0)
    assert decode_payload(blocks[0])["requests"][0] is None
    recovered = recover(tmp_path, create_tables, TpccWorkload(**DRILL_TPCC).registry())
    assert recovered.db.dump() == engine.db.dump()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json", "unreadable manifest"),
        ("{}", "bad manifest"),
        ("[1, 2]", "bad manifest"),
        ('{"epoch": -3, "snapshot": "ckpt--00000000003.snap"}', "bad manifest"),
        ('{"epoch": true, "snapshot": "ckpt-000000000001.snap"}', "bad manifest"),
        ('{"epoch": 4, "snapshot": "."}', "bad manifest"),
        ('{"epoch": 4, "snapshot": "ckpt-000000000005.snap"}', "bad manifest"),
    ],
)
def test_a_manifest_we_did_not_write_is_one_line_walcorrupt(
    tmp_path: Path, text: str, says: str
) -> None:
    (tmp_path / "MANIFEST").write_text(text)
    with pytest.raises(WalCorrupt, match=says) as error:
        read_manifest(tmp_path)
    assert "\n" not in str(error.value) and str(tmp_path / "MANIFEST") in str(error.value)
    (tmp_path / "MANIFEST").write_text('{"epoch": 4, "snapshot": "ckpt-000000000004.snap"}')
    assert read_manifest(tmp_path) == (4, tmp_path / "ckpt-000000000004.snap")


def test_a_cluster_node_block_names_the_way_to_recover_it() -> None:
    block = scan_bytes(encode_block(BlockKind.NODE, 1, {})).blocks[0]
    with pytest.raises(WalCorrupt, match="recover it with --cluster CONFIG --node ID"):
        replay_block(TpccWorkload(**DRILL_TPCC).schema(), None, block)  # type: ignore[arg-type]


def test_one_durable_engine_at_a_time_holds_its_directory(tmp_path: Path) -> None:
    """An engine locks its directory until it closes, as a node does: neither a second engine
    nor `dgcc recover` (which takes the same lock) can touch a log that is being written."""
    import os

    from dgcc.wal.dirlock import DirLock

    engine = open_engine(tmp_path, "command", SEED)
    message = rf"is in use by pid {os.getpid()} \(a DurableEngine\)"
    with pytest.raises(ConfigError, match=message):
        open_engine(tmp_path, "command", SEED)
    with pytest.raises(ConfigError, match=message):
        DirLock(tmp_path, "dgcc recover")
    engine.close()
    with DirLock(tmp_path, "dgcc recover"):
        pass  # free once the engine closed
    open_engine(tmp_path, "command", SEED).close()
    # a refused open (another workload's log) holds nothing afterwards
    with pytest.raises(ConfigError, match="holds the log of workload"):
        _reopen_other(tmp_path)
    open_engine(tmp_path, "command", SEED).close()


def _reopen_other(directory: Path) -> None:
    from dgcc.durable import DurableEngine

    workload = TpccWorkload(**{**DRILL_TPCC, "items": 77})
    config = DurableConfig(
        directory, mode="command", workload="tpcc", workload_options={**DRILL_TPCC, "items": 77}
    )
    DurableEngine(config, workload.registry(), create_tables, lambda: workload.build(SEED))


def test_an_epoch_that_fails_after_changing_the_tables_stops_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch 2 runs, then its log block cannot be made (as a value pickle cannot take, or a
    payload past the size limit): its changes are in the tables and not in the log. Later
    epochs used to be logged on top of them, so recovery diverged from what had been
    answered. The engine now refuses every later epoch; reopening recovers epoch 1."""
    from dgcc import durable

    engine = open_engine(tmp_path, "command", SEED)
    first, second, third = batches(SEED, BATCH, 1, 3)
    engine.run_epoch(first)
    real = durable.encode_block

    def refuse(*args: object) -> bytes:
        raise ValueError("payload too large")

    monkeypatch.setattr(durable, "encode_block", refuse)
    with pytest.raises(ValueError, match="payload too large"):
        engine.submit(second)
    monkeypatch.setattr(durable, "encode_block", real)
    with pytest.raises(DgccError, match=r"stopped at epoch 2 \(ValueError: payload too large\)"):
        engine.submit(third)
    engine.close()
    again = open_engine(tmp_path, "command", SEED)
    assert again.epoch == 1
    again.close()


def test_a_recovery_that_fails_leaves_the_torn_tail_on_disk(tmp_path: Path) -> None:
    # The torn tail is cut only once recovery succeeded: recovering with another workload's
    # schema is refused (one line naming the table) and the log stays byte for byte.
    from dgcc.wal.writer import list_segments
    from dgcc.workloads.ycsb import YcsbWorkload

    _run(tmp_path, "dependency", epochs=3)
    last = list_segments(tmp_path)[-1][1]
    torn = last.read_bytes() + encode_block(BlockKind.DEPENDENCY, 4, {"x": 1})[:30]
    last.write_bytes(torn)
    ycsb = YcsbWorkload(records=10)
    with pytest.raises(ConfigError, match=r"holds table '.*' unknown to the workload"):
        recover(tmp_path, ycsb.schema, ycsb.registry())
    assert last.read_bytes() == torn
    recovered = recover(tmp_path, create_tables, TpccWorkload(**DRILL_TPCC).registry())
    assert recovered.epoch == 3 and len(recovered.dropped) == 1
    assert last.read_bytes() == torn[: len(torn) - 30]  # now it goes
