"""Phase timers: `with timer.phase("gen"): ...` accumulates wall seconds per named phase."""

import time
from collections.abc import Iterator
from contextlib import contextmanager


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
