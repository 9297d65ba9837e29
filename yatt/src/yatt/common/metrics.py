"""Metric sinks: a flat dict of floats per step to JSONL (always) and TensorBoard (optional)."""

import json
import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class JsonlSink:
    """Appends one JSON object per step (`{"step": n, **metrics}`) to a file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _jsonable(value: float) -> float | str:
    # JSON has no NaN/inf; keep them visible as strings rather than crashing the run.
    return value if math.isfinite(value) else str(value)


class TensorBoardSink:
    """Scalars to a TensorBoard event file (imported lazily: tensorboard is heavy)."""

    def __init__(self, log_dir: Path, resumed_at: int = 0) -> None:
        """``resumed_at``: the step a resumed run continues after; the folder's events of
        later steps (the run before it logged them, and this one logs them again) are purged,
        as the metrics file is cut back, so the curves show one history."""
        from torch.utils.tensorboard import SummaryWriter

        purge = resumed_at + 1 if resumed_at else None
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MetricsLogger:
    """Fans a step's metrics out to every sink and keeps the history for plots and summaries."""

    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks
        self.history: list[dict[str, float]] = []

    @classmethod
    def to_files(
        cls, jsonl: Path, tensorboard: Path | None, start_step: int = 0
    ) -> "MetricsLogger":
        """A run's logger: rows appended to `jsonl`, and scalars to TensorBoard event files
        in the folder `tensorboard` where one is given (a run resumed after `start_step`
        purges the later steps' events, see `TensorBoardSink`)."""
        sinks: list[Any] = [JsonlSink(jsonl)]
        if tensorboard is not None:
            sinks.append(TensorBoardSink(tensorboard, start_step))
        return cls(sinks)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            assert isinstance(value, float | int), f"metric {key} is {type(value).__name__}"
        self.history.append({"step": float(step), **metrics})
        for sink in self.sinks:
            sink.write(step, metrics)
        if logger.isEnabledFor(logging.DEBUG):  # logging.level=DEBUG: every metric, every step
            shown = " ".join(f"{key}={value:.4g}" for key, value in sorted(metrics.items()))
            logger.debug("step %d: %s", step, shown)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_metrics(path: Path) -> tuple[list[tuple[bytes, dict[str, Any]]], bool]:
    """The rows of a metrics JSONL file, each with its line as written, and whether a torn last
    line (a run stopped mid-write) was left out.

    Raises ValueError naming the row for a line before the last that is not a JSON object with
    a numeric `step`.
    """
    lines = [line for line in Path(path).read_bytes().split(b"\n") if line.strip()]
    rows: list[tuple[bytes, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            row = None
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, int | float) and not isinstance(step, bool):
            rows.append((line, row))  # type: ignore[arg-type]
        elif number == len(lines):
            return rows, True
        else:
            raise ValueError(f"{path}: row {number} is not a JSON metrics row with a step")
    return rows, False
