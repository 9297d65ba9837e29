"""Shared utilities with no dependency on the rest of yatt: logging, seeding, timers, metric sinks,
plots. Nothing here imports another yatt module."""

from yatt.common.logsetup import setup_logging
from yatt.common.metrics import JsonlSink, MetricsLogger, TensorBoardSink, read_metrics
from yatt.common.seeding import rng_state, seed_everything, set_rng_state
from yatt.common.timers import PhaseTimer

__all__ = [
    "JsonlSink",
    "MetricsLogger",
    "PhaseTimer",
    "TensorBoardSink",
    "read_metrics",
    "rng_state",
    "seed_everything",
    "set_rng_state",
    "setup_logging",
]
