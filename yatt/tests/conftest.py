"""Shared test set-up for yatt: offline hub, one torch thread, fixed seeds.

CI runs on two shared cores, so every test uses one intra-op thread and tiny models.
"""

import importlib.util
import os
import random
import sys
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


def load_bench(name: str) -> ModuleType:
    """A bench script by name (``"placement"``) as a module, registered in ``sys.modules`` (its
    dataclasses look their module up); the scripts beside it import as when it runs."""
    spec = importlib.util.spec_from_file_location(f"yatt_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


@pytest.fixture
def bench_script():
    """Loads a bench script by name (``"placement"``) as a module (``load_bench``)."""
    return load_bench


@pytest.fixture(scope="module")
def bench_module():
    """``bench_script`` for a module-scoped fixture: a test module's one copy of its script."""
    return load_bench
