"""yatt/bench/rollout.py's timing: what a cell's median is made of."""

from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("rollout")


class _Engine:
    """Generates one token per prompt; counts its calls."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 1)
        self.calls = 0

    def generate(self, prompts, params, seeds):
        self.calls += 1
        return [SimpleNamespace(token_ids=[7]) for _ in prompts]


def test_every_engine_runs_a_cell_once_untimed_before_its_timed_runs(bench):
    """Every cell used to time each engine's first call at its shape, which pays allocations
    a GRPO loop sampling that shape every step does not: with 2 repeats, half the median."""
    engines = {"hf": _Engine(), "yatt": _Engine()}
    advanced = []
    params = bench.SamplingParams(max_new_tokens=1)
    runs = bench._cell_runs(engines, [[1, 2]] * 4, params, 2, lambda: advanced.append(1))
    assert [engine.calls for engine in engines.values()] == [3, 3]
    assert len(runs) == 2 and len(advanced) == 2
    assert all(run[name]["tokens"] == 4 for run in runs for name in engines)
