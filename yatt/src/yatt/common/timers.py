"""Phase timers: `with timer.phase("gen"): ...` accumulates wall seconds per named phase."""

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)


class PhaseTimer:
    """Accumulates wall-clock seconds per phase for one step; `pop` returns and resets them."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start_s = time.perf_counter()
        try:
            yield
        finally:
            elapsed_s = time.perf_counter() - start_s
            self._seconds[name] = self._seconds.get(name, 0.0) + elapsed_s

    def pop(self, prefix: str = "timing_s/") -> dict[str, float]:
        """Metrics `{prefix + phase: seconds}` for the phases timed since the last pop."""
        out = {f"{prefix}{name}": seconds for name, seconds in self._seconds.items()}
        self._seconds = {}
        return out


def time_limit_reached(limit_s: float, start_s: float, done: int, total: int) -> bool:
    """Whether a run started at `start_s` (perf_counter) has used up `limit_s` (`train.
    time_limit_s`; 0 = no limit) after `done` of `total` steps with steps left; logged."""
    if not limit_s or done >= total or time.perf_counter() - start_s < limit_s:
        return False
    logger.warning(
        "train.time_limit_s=%g reached: stopping after step %d of %d", limit_s, done, total
    )
    return True
