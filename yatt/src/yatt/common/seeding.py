"""Seeding and RNG state capture, so a resumed run continues exactly."""

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from one integer."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """All global RNG states (for checkpoints)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():  # a process that never used CUDA has no state to keep
        state["cuda"] = torch.cuda.get_rng_state_all()  # (and asking would start CUDA on every GPU)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states captured by `rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        # a host with fewer GPUs than the one that saved: restore those it has
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)
