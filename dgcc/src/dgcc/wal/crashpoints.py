"""Named crash points for fault-injection tests: the process dies with ``os._exit`` at the point.

Select one with the environment variable ``DGCC_CRASHPOINT=name`` or ``name:n`` (die at the n-th
hit, default 1), or in-process with ``arm(name, hit)``. Diagnostics only, like the variables in
``dgcc.debug``; production runs never set it.
"""

from __future__ import annotations

import os

from dgcc.errors import ConfigError

__all__ = ["CRASHPOINTS", "CRASH_EXIT_CODE", "arm", "crashpoint", "disarm"]

CRASH_EXIT_CODE = 77
CRASHPOINTS = (
    "wal.mid_write",  # half of a log block written, no fsync
    "wal.before_fsync",  # the whole block written, not yet fsync'ed
    "wal.after_fsync",  # durable but not yet acknowledged
    "ckpt.mid_write",  # half of a snapshot written
    "ckpt.before_rename",  # snapshot and manifest tmp written, manifest not renamed
    "ckpt.after_rename",  # manifest renamed, old log segments not yet removed
    "recovery.mid_replay",  # recovery has replayed part of the log
    "twopc.after_decide",  # a 2PC coordinator's commit decision is durable, no commit sent
)

_armed: dict[str, int] = {}


def arm(name: str, hit: int = 1) -> None:
    """Make the ``hit``-th pass through crash point ``name`` kill the process."""
    if name not in CRASHPOINTS:
        raise ConfigError(f"unknown crash point {name!r}; choose one of: {', '.join(CRASHPOINTS)}")
    if not isinstance(hit, int) or hit < 1:
        raise ConfigError(f"crash point hit must be an integer >= 1, got {hit!r}")
    _armed[name] = hit


def disarm() -> None:
    _armed.clear()


def crashpoint(name: str) -> None:
    """Die here if ``name`` is armed and this is its chosen pass; otherwise do nothing."""
    assert name in CRASHPOINTS, f"unregistered crash point {name!r}"
    left = _armed.get(name)
    if left is None:
        return
    if left > 1:
        _armed[name] = left - 1
        return
    os._exit(CRASH_EXIT_CODE)


def _arm_from_env() -> None:
    spec = os.environ.get("DGCC_CRASHPOINT", "")
    if not spec:
        return
    name, _, hit = spec.partition(":")
    try:
        count = int(hit) if hit else 1
    except ValueError:
        raise ConfigError(f"DGCC_CRASHPOINT={spec!r}: the hit after ':' must be an int") from None
    arm(name, count)


_arm_from_env()
