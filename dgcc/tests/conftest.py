"""Shared test set-up for dgcc: fixtures that turn invariants on and that make the example user
workload (``dgcc/examples``) importable, an in-process cluster
simulator shared by the DistDGCC and Calvin node-schedule tests, and a loader for the bench
scripts whose bookkeeping the tests check.

The hypothesis profiles ("ci" by default, HYPOTHESIS_PROFILE=dev for a longer random search)
live in the repository's root conftest.py, shared with yatt's suite.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dgcc import debug
from dgcc.api import TxnRequest
from dgcc.net.wire import decode, encode
from dgcc.protocols.dist_placement import Placement, Router, global_batch, owned_rows
from dgcc.protocols.dist_results import ResultAssembler

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def cli_error(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], str]:
    """Run ``dgcc`` with ``argv``; check it exits 2 with one ``dgcc: error:`` line; that line."""
    from dgcc.cli import main

    def error_line(argv: list[str]) -> str:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith("dgcc: error: ")
        return err

    return error_line


@pytest.fixture
def examples_importable(monkeypatch) -> None:
    """``dgcc/examples`` importable here and in the node processes a test starts (as a user
    puts their own workload module on ``PYTHONPATH``)."""
    monkeypatch.syspath_prepend(str(EXAMPLES_DIR))
    paths = [str(EXAMPLES_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def _load_bench(name: str) -> ModuleType:
    """``dgcc/bench/<name>.py`` as a module; the scripts it imports from beside it load too."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"no bench script {name!r}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


@pytest.fixture(scope="session")
def bench_script() -> Callable[[str], ModuleType]:
    """Loads a bench script by name (``"protocols"``) as a module."""
    return _load_bench


@pytest.fixture
def invariants() -> Iterator[None]:
    """Run the test with ``debug.check_invariants`` on (piece contract and graph checks)."""
    with debug.invariants():
        yield


def _wire(message: Any) -> Any:
    return decode(encode(("m", message)))[1]


def _routed_only(batches: list[list[TxnRequest]], router: Router, node: int) -> list:
    """What ``node`` receives as a node sends inputs: peers' calls not routed to it are None."""
    out = []
    for origin, batch in enumerate(batches):
        if origin == node:
            out.append(batch)
            continue
        routes = [router.route(request) for request in batch]
        out.append([r if n is None or node in n else None for r, n in zip(batch, routes)])
    return out


def simulate_cluster(
    run_class: type, workload: Any, nodes: int, epochs: int, per_node: int, seed: int,
    *, sparse: bool = False,
) -> tuple[list, list, dict]:  # fmt: skip
    """N nodes' epoch runs (``EpochRun`` or ``CalvinEpochRun``) in one process.

    Value messages and reports go through the real wire codec and are delivered in a seeded
    random order, so a node often runs out of ready pieces and waits. ``sparse``: each node gets
    only the peers' calls routed to it. Returns (global order per epoch, every outcome in that
    order, the union of the nodes' owned rows).
    """
    registry = workload.registry()
    router = Router(workload, Placement.round_robin(nodes))
    dbs = [workload.build(seed) for _ in range(nodes)]
    stream = workload.requests(seed + 1)
    rng = random.Random(seed)
    outcomes: list = []
    order: list = []
    for _ in range(epochs):
        batches = []
        for _ in range(nodes):
            wired = [_wire((r.procedure, r.params)) for r in itertools.islice(stream, per_node)]
            batches.append([TxnRequest(procedure, dict(params)) for procedure, params in wired])
        order.append(global_batch(batches))
        if sparse:  # as a node does: route its batch once, for its peers and its own plan
            for batch in batches:
                router.routes(batch, keep=True)
        inputs = [_routed_only(batches, router, n) if sparse else batches for n in range(nodes)]
        runs = [run_class(n, dbs[n], registry, router, inputs[n]) for n in range(nodes)]
        inflight: list = []  # (destination, entries)
        while not all(run.finished for run in runs) or inflight:
            for run in runs:
                run.step(rng.randint(1, 20))
                inflight.extend((t, _wire(e)) for t, e in run.take_outbox().items())
            stuck = all(run.finished or not run.has_ready for run in runs)
            done = all(run.finished for run in runs)
            assert inflight or done or not stuck, "every node waits and no message is in flight"
            if inflight and (rng.random() < 0.7 or stuck):
                target, entries = inflight.pop(rng.randrange(len(inflight)))
                runs[target].deliver(entries)
        assemblers = [ResultAssembler(registry, batches[n], nodes) for n in range(nodes)]
        for source in rng.sample(range(nodes), nodes):
            reports = runs[source].reports()
            for origin in range(nodes):
                assemblers[origin].add(source, _wire(reports.get(origin, [])))
        for assembler in assemblers:
            outcomes.extend(assembler.outcomes())
    merged: dict = {}
    for node in range(nodes):
        for table, rows in owned_rows(dbs[node], router, node).items():
            merged.setdefault(table, {}).update(rows)
    return order, outcomes, merged


@pytest.fixture(scope="session")
def cluster_sim() -> Callable[..., tuple[list, list, dict]]:
    """``simulate_cluster``, for the tests of DistDGCC's and Calvin's node schedules."""
    return simulate_cluster
