"""Logging set-up for entry points (library modules only call `logging.getLogger(__name__)`)."""

import logging
import os
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s [rank %(rank)s] %(message)s"


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = os.environ.get("RANK", "0")
        return True


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at emit time (test capture swaps it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_logging(level: str = "INFO") -> None:
    """Configure the root logger once: time, level, module and rank on stderr."""
    root = logging.getLogger()
    if any(getattr(h, "_yatt", False) for h in root.handlers):
        root.setLevel(level)
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    handler.addFilter(_RankFilter())
    handler._yatt = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
