"""Shared test set-up for yatt: offline hub, one torch thread, fixed seeds.

CI runs on two shared cores, so every test uses one intra-op thread and tiny models.
"""

import os
import random

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
