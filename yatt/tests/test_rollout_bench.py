"""yatt/bench/rollout.py's timing: what a cell's median is made of."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

_PATH = Path(__file__).resolve().parents[1] / "bench" / "rollout.py"
_spec = importlib.util.spec_from_file_location("rollout_bench", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


class _Engine:
    """Generates one token per prompt; counts its calls."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 1)
        self.calls = 0

    def generate(self, prompts, params, seeds):
        self.calls += 1
        return [SimpleNamespace(token_ids=[7]) for _ in prompts]


def test_every_engine_runs_a_cell_once_untimed_before_its_timed_runs():
    """Every cell used to time each engine's first call at its shape, which pays allocations
    a GRPO loop sampling that shape every step does not: with 2 repeats, half the median."""
    engines = {"hf": _Engine(), "yatt": _Engine()}
    advanced = []
    params = bench.SamplingParams(max_new_tokens=1)
    runs = bench._cell_runs(engines, [[1, 2]] * 4, params, 2, lambda: advanced.append(1))
    assert [engine.calls for engine in engines.values()] == [3, 3]
    assert len(runs) == 2 and len(advanced) == 2
    assert all(run[name]["tokens"] == 4 for run in runs for name in engines)
