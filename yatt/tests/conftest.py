"""Shared test set-up for yatt: offline hub, one torch thread, fixed seeds.

CI runs on two shared cores, so every test uses one intra-op thread and tiny models.
"""

import contextlib
import importlib.util
import os
import random
import sys
from collections.abc import Iterator
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


@pytest.fixture
def same_weights():
    """Asserts that two saved model folders hold the same tensors, name by name."""
    from safetensors.torch import load_file

    def check(folder: Path, other: Path) -> None:
        mine = load_file(folder / "model.safetensors")
        theirs = load_file(other / "model.safetensors")
        assert mine.keys() == theirs.keys()
        for name, tensor in mine.items():
            assert torch.equal(tensor, theirs[name]), name

    return check


@pytest.fixture
def layer_passes():
    """A context manager recording (rows, columns) of every pass through a model's first
    decoder layer (how a forward shares prompt passes)."""

    @contextlib.contextmanager
    def record(model: torch.nn.Module) -> Iterator[list[tuple[int, int]]]:
        widths: list[tuple[int, int]] = []

        def seen(module, args, kwargs) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            widths.append(tuple(hidden.shape[:2]))

        hook = model.model.layers[0].register_forward_pre_hook(seen, with_kwargs=True)
        try:
            yield widths
        finally:
            hook.remove()

    return record
