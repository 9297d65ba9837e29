"""Shared test set-up for dgcc: the hypothesis profiles and a fixture that turns invariants on.

The "ci" profile (the default) bounds examples and is derandomized, so CI runs are reproducible
and fit the time budget; set HYPOTHESIS_PROFILE=dev locally for a longer random search.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from dgcc import debug

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def invariants() -> Iterator[None]:
    """Run the test with ``debug.check_invariants`` on (piece contract and graph checks)."""
    with debug.invariants():
        yield
