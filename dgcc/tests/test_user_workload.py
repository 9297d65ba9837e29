"""A workload of one's own, named ``package.module:Class`` wherever dgcc takes a workload name.

The shared protocol suite (test_protocols_suite.py) runs the example (``dgcc/examples/
inventory.py``) under every protocol, in one process and on a 2-node cluster; here: the names
that cannot work are one-line errors, and the CLI runs and checks it.
"""

from __future__ import annotations

import pytest

from dgcc.cli import main
from dgcc.errors import ConfigError
from dgcc.net.loadgen import ClusterBenchConfig
from dgcc.workloads import get_workload


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nosuch_module_xyz:Thing", "cannot import 'nosuch_module_xyz': .* on PYTHONPATH"),
        ("dgcc.api:", "expected package.module:Class"),
        (":Inventory", "expected package.module:Class"),
        ("dgcc.api:NoSuchName", "module dgcc.api has no 'NoSuchName'"),
        ("dgcc.api:Piece", "is <class 'dgcc.api.Piece'>, not a dgcc Workload subclass"),
        ("dgcc.workloads:Workload", "Workload does not implement build, check, registry, "),
        ("nope", "or package.module:Class for your own"),
    ],
)
def test_names_that_cannot_work_are_config_errors(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_workload(name)


@pytest.mark.usefixtures("examples_importable")
def test_the_cli_runs_and_checks_a_user_workload(capsys) -> None:
    argv = ["bench", "--workload", "inventory:Inventory", "-o", "items=40", "-o", "units=8"]
    code = main([*argv, "--seconds", "0.3", "--warmup-s", "0.1", "--batch-size", "50"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = next(line for line in out.splitlines() if line.startswith("[summary]"))
    assert "workload=inventory:Inventory" in summary and "violations=0" in summary
    assert "errors=0" in summary


@pytest.mark.usefixtures("examples_importable")
def test_its_options_are_checked_and_a_cluster_load_runs_its_own_mix(capsys) -> None:
    with pytest.raises(ConfigError, match="inventory items must be an int >= 2, got 1"):
        get_workload("inventory:Inventory", items=1)
    with pytest.raises(ConfigError, match="needs a built-in workload"):
        ClusterBenchConfig("inventory:Inventory", 2, 0.1, {"items": 40})
    assert main(["bench", "--workload", "inventory:Inventory", "-o", "colour=3"]) == 2
    assert "rejects options {'colour': 3}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("workload", "options", "spans"),
    [
        ("ycsb", {"records": 1000}, lambda params: {k * 2 // 1000 for k in params["keys"]}),
        ("smallbank", {"accounts": 1000}, lambda params: {
            params[name] * 2 // 1000 for name in ("source", "target") if name in params}),
    ],
)  # fmt: skip
def test_no_distributed_fraction_keeps_the_built_in_workloads_own_mix(workload, options, spans):
    """`dgcc bench --nodes` without --distributed-fraction: YCSB's keys and Smallbank's
    customers come from the workload's own stream, drawn over the whole cluster (some calls
    span both nodes), not pinned to the calling node."""
    from dgcc.cluster import local_config
    from dgcc.net.loadgen import request_pool

    config = local_config(2, workload=workload, workload_options=options)
    pool = request_pool(config, 0, None, seed=3, count=200)
    crossing = sum(len(spans(request.params)) > 1 for request in pool)
    assert 0 < crossing < len(pool)
    assert request_pool(config, 0, 0.0, seed=3, count=200) != pool  # a fraction pins calls


@pytest.mark.usefixtures("examples_importable")
def test_a_cluster_bench_checks_the_end_state_of_its_nodes(capsys, monkeypatch) -> None:
    """`dgcc bench --nodes N` checks the workload's invariants over every node's rows once the
    clients stop, as the in-process bench does, and fails on a violation."""
    argv = ["bench", "--nodes", "2", "--workload", "inventory:Inventory", "-o", "items=40"]
    argv += ["--seconds", "0.5", "--warmup-s", "0.2", "--inflight", "10"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = next(line for line in out.splitlines() if line.startswith("[summary]"))
    assert "violations=0" in summary and "txn/errors=0" in summary
    inventory = get_workload("inventory:Inventory", items=40)
    # the check runs here, in the bench's process, over the rows the nodes hand back
    monkeypatch.setattr(type(inventory), "check_state", lambda self, db: [f"{len(db['stock'])}"])
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "violation: 40" in out  # every item's row, from both nodes
    assert "violations=1" in out


def test_a_second_workload_under_a_taken_name_is_refused() -> None:
    from dgcc.workloads import WORKLOADS, Workload, register_workload

    builtin = type(get_workload("ycsb", records=10))

    class Impostor(Workload):  # never instantiated: the name alone is refused
        name = "ycsb"

    taken = r"workload name 'ycsb' is taken by dgcc\.workloads\.ycsb\.YcsbWorkload"
    with pytest.raises(ConfigError, match=taken):
        register_workload(Impostor)
    assert WORKLOADS["ycsb"] is builtin and register_workload(builtin) is builtin
