"""Shared test set-up for dgcc: a fixture that turns invariants on.

The hypothesis profiles ("ci" by default, HYPOTHESIS_PROFILE=dev for a longer random search)
live in the repository's root conftest.py, shared with yatt's suite.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dgcc import debug


@pytest.fixture
def invariants() -> Iterator[None]:
    """Run the test with ``debug.check_invariants`` on (piece contract and graph checks)."""
    with debug.invariants():
        yield
