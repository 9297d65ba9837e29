"""Switches for costly self-checks, and the environment variables dgcc reads.

``check_invariants`` turns on the piece-contract checks of ``dgcc.api`` (declared keys,
read-only rows, abort-before-write) and graph assertions in the protocols. Tests turn it on;
benchmarks leave it off. Environment variables (diagnostics only, all listed here):

    DGCC_CHECK_INVARIANTS=1   start with check_invariants on
    DGCC_LOG_LEVEL=DEBUG      log level for the CLI entry points
    DGCC_CRASHPOINT=name[:n]  die at the n-th pass of a named crash point (``wal.crashpoints``;
                              crash tests only)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

check_invariants: bool = os.environ.get("DGCC_CHECK_INVARIANTS", "") == "1"
log_level: str = os.environ.get("DGCC_LOG_LEVEL", "INFO")


def frozen(row: dict[str, Any]) -> Mapping[str, Any]:
    """A read-only view of a row, so an in-place write without ``ctx.update`` fails loudly."""
    return MappingProxyType(row)


@contextmanager
def invariants(enabled: bool = True) -> Iterator[None]:
    """Turn ``check_invariants`` on (or off) for the duration of a block."""
    global check_invariants
    previous = check_invariants
    check_invariants = enabled
    try:
        yield
    finally:
        check_invariants = previous
