"""``dgcc recover``: recover a durability directory from the command line and check it.

Goal: the state the CLI recovers equals the live engine's state at its last epoch (TPC-C with
command and dependency logs, YCSB with a value log); the record reports the mode, epochs and
transactions replayed; a torn tail is reported and dropped; the workload a directory records
needs no flags and flags that disagree with it are refused; bad input, a 2PC node's directory
and a log that no longer replays exit 2 with one line, and a violated invariant exits 1.
Method: a small DurableEngine run in a temp directory, then ``dgcc.cli.main`` in-process with
``recover`` wrapped to keep the recovered database.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from dgcc import cli
from dgcc.cluster import local_config
from dgcc.durable import DurableConfig, DurableEngine
from dgcc.protocols.dist_placement import Router
from dgcc.wal.format import HEADER_BYTES, BlockKind, encode_block, scan_bytes
from dgcc.wal.node_log import LoggedEpochRun, NodeLog
from dgcc.wal.recovery import Recovered
from dgcc.wal.writer import WalWriter, list_segments
from dgcc.workloads import get_workload

SEED, BATCH, EPOCHS = 3, 20, 5
TPCC = {"warehouses": 1, "items": 200, "customers_per_district": 30, "orders_per_district": 30}
TPCC_FLAGS = ["--warehouses", "1", "--items", "200", "-o", "customers_per_district=30"]
TPCC_FLAGS += ["--orders-per-district", "30"]
YCSB = {"records": 500, "theta": 0.9}
YCSB_FLAGS = ["--records", "500", "--theta", "0.9"]


def _run_engine(
    directory: Path, name: str, options: dict, mode: str, *, record: bool = True
) -> list[dict]:
    """Run EPOCHS epochs durably; the state dump after each epoch (index 0: initial).

    ``record``: the directory records its workload (as a library user may leave out).
    """
    workload = get_workload(name, **options)
    recorded = {"workload": name, "workload_options": options} if record else {}
    config = DurableConfig(directory=directory, mode=mode, fork_checkpoint=False, **recorded)
    engine = DurableEngine(
        config, workload.registry(), workload.schema, lambda: workload.build(SEED)
    )
    stream = workload.requests(SEED + 1)
    dumps = [engine.db.dump()]
    for _ in range(EPOCHS):
        engine.run_epoch(list(itertools.islice(stream, BATCH)))
        dumps.append(engine.db.dump())
    engine.close()
    return dumps


def _recover_cli(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[int, list[Recovered]]:
    """Run ``dgcc.cli.main(argv)``; its exit status and what ``recover`` returned."""
    kept: list[Recovered] = []
    real = cli.recover

    def keeping(*args: object, **kwargs: object) -> Recovered:
        kept.append(real(*args, **kwargs))
        return kept[-1]

    monkeypatch.setattr(cli, "recover", keeping)
    return cli.main(argv), kept


@pytest.mark.parametrize(
    ("name", "options", "flags", "mode"),
    [
        ("tpcc", TPCC, TPCC_FLAGS, "dependency"),
        ("tpcc", TPCC, TPCC_FLAGS, "command"),
        ("ycsb", YCSB, YCSB_FLAGS, "value"),
    ],
)
def test_recover_equals_live_state(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    options: dict,
    flags: list[str],
    mode: str,
) -> None:
    dumps = _run_engine(tmp_path / "node", name, options, mode)
    report = tmp_path / "recover.json"
    argv = ["recover", str(tmp_path / "node"), "--workload", name, *flags, "--json", str(report)]
    status, kept = _recover_cli(monkeypatch, argv)
    assert status == 0
    assert len(kept) == 1 and kept[0].db.dump() == dumps[-1]
    record = json.loads(report.read_text())
    assert record["modes"] == [mode]
    assert (record["checkpoint_epoch"], record["epoch"]) == (0, EPOCHS)
    assert record["replayed_epochs"] == EPOCHS
    assert record["replayed_txns"] == (0 if mode == "value" else EPOCHS * BATCH)
    assert (record["replayed_images"] > 0) == (mode == "value")
    assert record["dropped"] == [] and record["violations"] == []


def test_torn_tail_is_reported_and_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dumps = _run_engine(tmp_path, "tpcc", TPCC, "dependency")
    _, segment = list_segments(tmp_path)[-1]
    with segment.open("r+b") as file:
        file.truncate(segment.stat().st_size - 7)
    report = tmp_path / "recover.json"
    argv = ["recover", str(tmp_path), "--workload", "tpcc", *TPCC_FLAGS, "--json", str(report)]
    status, kept = _recover_cli(monkeypatch, argv)
    assert status == 0
    assert kept[0].db.dump() == dumps[EPOCHS - 1]
    record = json.loads(report.read_text())
    assert record["epoch"] == EPOCHS - 1
    assert len(record["dropped"]) == 1 and "torn payload" in record["dropped"][0]


def test_damage_followed_by_intact_epochs_exits_2_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One flipped bit in an early epoch's block is no torn tail: recovery must not cut the
    acknowledged epochs after it off the log."""
    _run_engine(tmp_path, "ycsb", YCSB, "dependency")
    _, segment = list_segments(tmp_path)[-1]
    scan = scan_bytes(segment.read_bytes())
    assert len(scan.blocks) >= 3
    data = bytearray(segment.read_bytes())
    data[scan.blocks[1].offset + HEADER_BYTES + 3] ^= 0x10  # the second epoch's payload
    segment.write_bytes(bytes(data))
    argv = ["recover", str(tmp_path), "--workload", "ycsb", *YCSB_FLAGS]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"(offset {scan.blocks[2].offset})" in err and "no crash leaves" in err
    assert segment.read_bytes() == bytes(data), "recovery changed the damaged log"


@pytest.mark.parametrize(
    ("name", "options", "flags", "said"),
    [
        ("ycsb", YCSB, ["--records", "400", "--theta", "0.9"], "usertable has 500 rows, expected"),
        # (the default scale: 100,000 items, 3,000 customers a district)
        ("tpcc", TPCC, ["--warehouses", "1"], "item has 200 rows, expected 100,000 (options"),
    ],
)
def test_wrong_workload_options_are_a_violation_that_exits_1(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    options: dict,
    flags: list[str],
    said: str,
) -> None:
    # Without a workload record, recovery takes the flags' word; the scale they give must
    # show in the recovered rows (it also decides which calls the replay refuses).
    _run_engine(tmp_path, name, options, "command", record=False)
    assert cli.main(["recover", str(tmp_path), "--workload", name, *flags]) == 1
    assert said in capsys.readouterr().out


def test_a_recorded_workload_needs_no_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dumps = _run_engine(tmp_path, "ycsb", YCSB, "command")
    status, kept = _recover_cli(monkeypatch, ["recover", str(tmp_path)])
    assert status == 0
    assert kept[0].db.dump() == dumps[-1]


def _one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``dgcc`` with ``argv``, which must exit 2 with one error line; that line."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dgcc: error: "), err
    return err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--records", "400"], "was written by ycsb with records=500, not 400 (it records"),
        (["--workload", "tpcc"], "was written by workload 'ycsb', not 'tpcc'"),
        (["--warehouses", "1"], "workload 'ycsb' rejects options"),
    ],
)
def test_flags_that_disagree_with_the_recorded_workload_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    _run_engine(tmp_path, "ycsb", YCSB, "command")
    assert message in _one_error_line(["recover", str(tmp_path), *flags], capsys)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "does not record its workload: recover needs --workload"),
        (["--workload", "ycsb", "--warehouses", "1"], "workload 'ycsb' rejects options"),
    ],
)
def test_an_unrecorded_workload_needs_right_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    _run_engine(tmp_path, "ycsb", YCSB, "command", record=False)
    assert message in _one_error_line(["recover", str(tmp_path), *flags], capsys)


def test_a_log_that_no_longer_replays_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replanning under fewer records fails a logged call: a DgccError, one line, exit 2."""
    _run_engine(tmp_path, "ycsb", YCSB, "dependency", record=False)
    argv = ["recover", str(tmp_path), "--workload", "ycsb", "--records", "400"]
    err = _one_error_line(argv, capsys)
    assert "no longer plans: ycsb_txn: key must be an int in [0, 400)" in err


def test_a_2pc_node_directory_says_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "node0"
    directory.mkdir()
    writer = WalWriter(directory, 1)  # a 2PC node's first block, as it starts
    writer.append(1, encode_block(BlockKind.TWOPC, 1, [("start",)]))
    writer.close()
    config = local_config(1, workload="ycsb", workload_options=YCSB, protocol="no_wait")
    config_path = tmp_path / "cluster.json"
    config_path.write_text(json.dumps(config.to_dict()))
    for flags in (["--cluster", str(config_path), "--node", "0"], ["--workload", "ycsb"]):
        err = _one_error_line(["recover", str(directory), *flags], capsys)
        assert f"{directory} is a 2PC node's log" in err
        assert "restart its whole cluster" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _one_error_line(["recover", str(empty), "--workload", "ycsb"], capsys)
    assert "no checkpoint manifest and no log (wal-*.log): not a dgcc data dir" in err
    assert not (empty / "LOCK").exists()  # refused before anything was written there


def test_missing_directory_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert cli.main(["recover", str(missing), "--workload", "tpcc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("dgcc: error: ") and str(missing) in err


def test_bad_directory_and_flags_are_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    err = _one_error_line(["recover", str(a_file), "--workload", "tpcc"], capsys)
    assert f"recovery directory {str(a_file)!r} is not a directory" in err
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps(local_config(2).to_dict()))
    err = _one_error_line(["recover", str(tmp_path), "--cluster", str(config)], capsys)
    assert f"--node is needed with --cluster: which node of {config} wrote it" in err
    err = _one_error_line(["recover", str(tmp_path), "--node", "1"], capsys)
    assert "--node 1 applies only with --cluster" in err
    node = ["recover", str(tmp_path), "--cluster", str(config), "--node", "1"]
    err = _one_error_line([*node, "--workers", "4", "-o", "records=10"], capsys)
    assert "--workers, workload options: not for a cluster node's directory" in err
    assert "--workload: not for" in _one_error_line([*node, "--workload", "ycsb"], capsys)
    with pytest.raises(SystemExit) as exited:  # argparse refuses it, in one line
        cli.main(["recover", str(tmp_path), "--workload", "tpcc", "--json", ""])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == "dgcc: error: argument --json: must name a file, got ''\n"


def test_damaged_checkpoint_exits_2_with_the_walcorrupt_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_engine(tmp_path, "ycsb", YCSB, "command")
    (snapshot,) = tmp_path.glob("*.snap")
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    assert cli.main(["recover", str(tmp_path), "--workload", "ycsb", *YCSB_FLAGS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    # The path once, and no "dropping": nothing is dropped from a snapshot.
    assert err.startswith(f"dgcc: error: checkpoint snapshot {snapshot}: damaged block at offset 0")
    assert err.count(str(snapshot)) == 1 and "dropping" not in err


def test_damage_before_the_last_segment_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_engine(tmp_path, "ycsb", YCSB, "command")
    ((_, segment),) = list_segments(tmp_path)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    (tmp_path / "wal-000000000099.log").write_bytes(b"")  # a later, empty segment
    assert cli.main(["recover", str(tmp_path), "--workload", "ycsb", *YCSB_FLAGS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("dgcc: error: damage before the log's end: ")
    # it names the block and says nothing changed, not the "dropping" of a torn tail it cuts
    assert f"{segment}: damaged block at offset" in err and "nothing was changed" in err, err
    assert "dropping" not in err


def test_a_segment_missing_or_out_of_place_names_the_file_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_engine(tmp_path, "ycsb", YCSB, "command")
    ((_, segment),) = list_segments(tmp_path)
    stray = tmp_path / "wal-000000000099.log"
    stray.write_bytes(segment.read_bytes())  # the same epochs again, under a later number

    def files() -> dict[str, bytes]:  # (the lock file names its holder: not the log's)
        return {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "LOCK"}

    before = files()
    assert cli.main(["recover", str(tmp_path), "--workload", "ycsb", *YCSB_FLAGS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{stray}: the log jumps to epoch 1 at offset 0, expected epoch" in err, err
    assert "a segment of" in err and "missing, or one out of place" in err
    assert "nothing was changed" in err
    assert files() == before


def test_recover_a_cluster_node_directory_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--cluster CONFIG --node N``: one node's log replayed alone equals that node's state."""
    config = local_config(1, workload="tpcc", workload_options=TPCC, seed=SEED)
    config_path = tmp_path / "cluster.json"
    config_path.write_text(json.dumps(config.to_dict()))
    workload = get_workload("tpcc", **TPCC)
    router = Router(workload, config.placement())
    registry = workload.registry()
    log = NodeLog(
        tmp_path / "node0", 0, registry, router, lambda: workload.build(SEED), workload.schema
    )
    stream = workload.requests(SEED + 1)
    for _ in range(EPOCHS):
        batch = list(itertools.islice(stream, BATCH))
        run = LoggedEpochRun(0, log.db, registry, router, [batch])
        while not run.finished:
            run.step(1000)
        log.record(run, lambda epoch: None)
    log.close()
    kept = []
    real = cli.recover_node
    monkeypatch.setattr(cli, "recover_node", lambda *a, **k: kept.append(real(*a, **k)) or kept[-1])
    out = tmp_path / "record.json"
    argv = ["recover", str(tmp_path / "node0"), "--cluster", str(config_path), "--node", "0"]
    assert cli.main([*argv, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["epoch"] == EPOCHS
    assert record["replayed_epochs"] == EPOCHS - record["checkpoint_epoch"]
    shown = capsys.readouterr().out  # labelled rows, as a single node's recovery shows them
    assert "epochs replayed" in shown and "torn tail" in shown and f"wrote {out}" in shown
    assert 0 < record["replay_s"] < record["recovery_s"]
    assert 0 < record["load_checkpoint_s"] < record["recovery_s"]
    assert kept[0].db.dump() == log.db.dump()
    assert cli.main([*argv[:-1], "3"]) == 2  # not a node of the config


def test_a_cluster_node_directory_is_recovered_only_as_its_own_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The directory's LAYOUT names its cluster and node: `--cluster C --node N` of another
    node or cluster, and a plain `recover` (as a single engine's), are refused."""
    from dgcc.wal.node_log import node_durability

    options = {"records": 200}
    config = local_config(2, workload="ycsb", workload_options=options, data_dir=str(tmp_path))
    node_durability(config, 1)  # the node's records: WORKLOAD and LAYOUT
    workload = get_workload("ycsb", **options)
    node1 = tmp_path / "node1"
    NodeLog(node1, 1, workload.registry(), Router(workload, config.placement()),
            lambda: workload.build(1), workload.schema).close()  # fmt: skip
    three = local_config(3, workload="ycsb", workload_options=options, data_dir=str(tmp_path))
    for name, cluster, node, said in (
        ("c2.json", config, 0, "holds the log of node 1 of this cluster, not of node 0"),
        ("c3.json", three, 2, "holds the log of another cluster: node 1 (not 2), nodes 2 (not 3)"),
    ):
        (tmp_path / name).write_text(json.dumps(cluster.to_dict()))
        argv = ["recover", str(node1), "--cluster", str(tmp_path / name), "--node", str(node)]
        assert cli.main(argv) == 2
        assert said in capsys.readouterr().err
    assert cli.main(["recover", str(node1), "--workload", "ycsb", "-o", "records=200"]) == 2
    assert "holds a cluster node's log (LAYOUT)" in capsys.readouterr().err
    (tmp_path / "c2.json").write_text(json.dumps(config.to_dict()))
    assert (
        cli.main(["recover", str(node1), "--cluster", str(tmp_path / "c2.json"), "--node", "1"])
        == 0
    )
