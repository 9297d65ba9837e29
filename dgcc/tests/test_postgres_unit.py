"""The PostgreSQL anchor's parts that need no server: request mapping, settings, bad input.

Method: map every TPC-C procedure of a seeded stream to its SQL call and check the argument
counts against the placeholders; reject durability-weakening settings and bad driver options.
"""

from __future__ import annotations

import importlib
import itertools

import pytest

from dgcc.api import TxnRequest
from dgcc.errors import ConfigError
from dgcc.pg import CALLS, call_parameters, run_closed_loop
from dgcc.pg.schema import COLUMNS, column_names
from dgcc.pg.server import check_settings
from dgcc.workloads.tpcc import TpccWorkload
from dgcc.workloads.tpcc.loader import load
from dgcc.workloads.tpcc.schema import TpccConfig


def test_every_request_maps_to_its_function() -> None:
    workload = TpccWorkload(warehouses=2, items=100, customers_per_district=30)
    seen = set()
    for request in itertools.islice(workload.requests(1), 300):
        query, parameters = call_parameters(request)
        assert query == CALLS[request.procedure]
        assert query.count("%s") == len(parameters), request
        seen.add(request.procedure)
    assert seen == set(CALLS)


def test_new_order_lines_become_three_arrays() -> None:
    request = TxnRequest(
        "new_order",
        {"w_id": 1, "d_id": 2, "c_id": 3, "lines": [(7, 1, 5), (9, 2, 1)], "entry_d": 10},
    )
    assert call_parameters(request)[1] == (1, 2, 3, [7, 9], [1, 2], [5, 1], 10)


def test_unknown_procedure_is_rejected() -> None:
    with pytest.raises(ConfigError, match="'amalgamate'"):
        call_parameters(TxnRequest("amalgamate", {}))


def test_copy_columns_match_dgcc_rows() -> None:
    db = load(
        TpccConfig(warehouses=1, items=20, customers_per_district=5, orders_per_district=5), 1
    )
    for table in COLUMNS:
        _pk, row = next(iter(db[table].items()))
        assert set(column_names(table)) == set(row), table


@pytest.mark.parametrize("name", ["fsync", "synchronous_commit", "full_page_writes"])
@pytest.mark.parametrize("off", ["off", "OFF", "of", "false", "f", "no", "N", "0", "'off'"])
def test_weaker_durability_is_refused(name: str, off: str) -> None:
    # Every spelling PostgreSQL reads as false (unique prefixes of off/false/no, any case).
    with pytest.raises(ConfigError, match=name):
        check_settings({name: off})
    assert check_settings({"shared_buffers": "256MB"}) == {"shared_buffers": "256MB"}
    assert check_settings({name: "on"}) == {name: "on"}
    assert check_settings({name: "yes"}) == {name: "yes"}


@pytest.mark.parametrize("clients", [0, -1, 10_000, True])
def test_bad_client_count_is_refused(clients: object) -> None:
    with pytest.raises(ConfigError, match="clients"):
        run_closed_loop("host=invalid", iter(()), clients=clients, warmup_s=0, seconds=1)


@pytest.mark.parametrize("module_name", ["dgcc.pg", "dgcc.report"])
def test_module_all_names_exist(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.__all__ lists missing {name}"


def test_a_cluster_rows_cpu_is_all_its_processes_and_a_recorded_run_rerenders(
    bench_script, tmp_path
) -> None:
    # The load generator reports node and client CPU per node: a 2-node row's CPU was half
    # its total, and its commits per CPU second doubled (7.38x over PostgreSQL, not 4.45x).
    import json
    import shutil
    from pathlib import Path

    bench = bench_script("postgres")
    metrics = {"txn/commits_per_s": 900.0, "node/cpu_s_per_s": 0.8, "client/cpu_s_per_s": 0.1}
    bench._cluster_cpu(metrics, 2)
    assert metrics["cpu/total_cores"] == pytest.approx(1.8)
    assert metrics["txn/commits_per_cpu_s"] == pytest.approx(500.0)
    recorded = Path(__file__).parents[2] / "docs" / "bench" / "dgcc_postgres.json"
    copy = tmp_path / "dgcc_postgres.json"
    shutil.copy(recorded, copy)
    assert bench.main(["--rerender", str(copy)]) == 0
    redone = json.loads(copy.read_text())
    two = next(r for r in redone["results"] if r["system"] == "distdgcc-2n")
    assert two["metrics"]["cpu/server_cores"] == pytest.approx(
        2 * two["metrics"]["node/cpu_s_per_s"]
    )
    assert (tmp_path / "dgcc_postgres.md").read_text().count("--rerender") == 1
