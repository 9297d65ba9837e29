"""Shared test set-up for yatt: offline hub, one torch thread, fixed seeds.

CI runs on two shared cores, so every test uses one intra-op thread and tiny models.
"""

import importlib.util
import os
import random
from pathlib import Path
from types import ModuleType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fixed_seeds() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench_script(monkeypatch):
    """Loads a bench script by name (``"placement"``) as a module; the scripts beside it can
    be imported, as when it runs."""
    monkeypatch.syspath_prepend(str(BENCH))

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"yatt_bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
