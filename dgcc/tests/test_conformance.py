"""Conformance matrix: every registered protocol on every registered workload.

Method: for each (protocol, workload) pair, run a few batches of the workload's seeded stream at
a small scale with invariant checks on. Deterministic protocols must equal the serial executor
in every outcome and in the final state (under two executor settings where the protocol has
them); a protocol that can record its committed history (a ``record_history`` option) must
produce an acyclic conflict graph whose serial replay gives the same results and final state;
every protocol must keep the workload's invariants. New protocols and workloads are
picked up from the registries automatically.
"""

from __future__ import annotations

import inspect
import itertools

import pytest

from dgcc import PROTOCOLS, debug, get_protocol
from dgcc.protocols._history import replay
from dgcc.workloads import WORKLOADS, _load_builtin, get_workload

pytestmark = pytest.mark.usefixtures("invariants")

_load_builtin()

# Small scales so the matrix stays quick; a workload not listed runs with its defaults.
SMALL = {
    "tpcc": {
        "warehouses": 2,
        "items": 1000,
        "customers_per_district": 60,
        "orders_per_district": 60,
    },
    "ycsb": {"records": 300, "theta": 0.9, "read_ratio": 0.4},
    "smallbank": {"accounts": 200, "hot_accounts": 10, "hot_fraction": 0.5},
}
BATCHES = 4
BATCH_SIZE = 60


def _variants(protocol: str) -> list[dict]:
    """Option sets to try: defaults, plus a shuffled multi-executor order where supported."""
    parameters = inspect.signature(get_protocol(protocol)).parameters
    if "executors" in parameters and "shuffle_seed" in parameters:
        return [{}, {"executors": 3, "shuffle_seed": 11}]
    if "record_history" in parameters:
        return [{"record_history": True}]
    return [{}]


def _run(workload_name: str, protocol: str, options: dict):
    workload = get_workload(workload_name, **SMALL.get(workload_name, {}))
    db = workload.build(seed=5)
    engine = get_protocol(protocol)(db, workload.registry(), **options)
    stream = workload.requests(seed=6)
    outcomes = []
    by_batch = []
    for _ in range(BATCHES):
        batch = list(itertools.islice(stream, BATCH_SIZE))
        batch_outcomes = engine.run_batch(batch)
        assert len(batch_outcomes) == len(batch)
        workload.observe(batch, batch_outcomes)
        outcomes.extend(batch_outcomes)
        by_batch.append(batch_outcomes)
    if options.get("record_history"):  # conflict-serializable: acyclic, and replays equal
        fresh = workload.build(seed=5)
        replay(engine.history, fresh, workload.registry(), by_batch)
        assert fresh.dump() == db.dump(), f"{protocol}: serial replay gives a different state"
    return workload, db, outcomes


@pytest.fixture(scope="module")
def serial_runs() -> dict:
    """The serial oracle's outcomes and final state per workload, computed once."""
    runs = {}
    with debug.invariants():  # module-scoped: runs before the per-test fixture
        for name in sorted(WORKLOADS):
            workload, db, outcomes = _run(name, "serial", {})
            runs[name] = (workload.check(db), db.dump(), outcomes)
    return runs


@pytest.mark.parametrize("workload_name", sorted(WORKLOADS))
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_protocol_on_workload(protocol: str, workload_name: str, serial_runs: dict) -> None:
    serial_problems, serial_state, serial_outcomes = serial_runs[workload_name]
    assert serial_problems == []
    assert any(outcome.committed for outcome in serial_outcomes)
    for options in _variants(protocol):
        workload, db, outcomes = _run(workload_name, protocol, options)
        assert workload.check(db) == [], f"{protocol} {options} broke {workload_name} invariants"
        if get_protocol(protocol).deterministic:
            assert outcomes == serial_outcomes, f"{protocol} {options}: outcomes differ"
            assert db.dump() == serial_state, f"{protocol} {options}: state differs"


def test_matrix_covers_the_builtin_workloads_and_protocols() -> None:
    assert {"ycsb", "smallbank"} <= set(WORKLOADS)
    assert {"serial", "dgcc"} <= set(PROTOCOLS)
