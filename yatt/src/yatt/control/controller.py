"""The controller interface both modes implement, and the loop that drives them."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yatt.common.timers import time_limit_reached
from yatt.config import Config
from yatt.control.cluster import Cluster
from yatt.control.config import ControlConfig
from yatt.control.rank import peak_rss_mb

__all__ = ["Controller", "RunResult", "add_idle_metrics"]

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """Metric history, per-worker stats and the phase events of a run."""

    history: list[dict[str, float]]
    workers: dict[str, dict[str, float]] = field(default_factory=dict)
    events: list[tuple[int, str, str, float, float]] = field(default_factory=list)
    driver_peak_rss_mb: float = 0.0
    bytes_moved: int = 0
    wall_s: float = 0.0


def add_idle_metrics(history: list[dict[str, float]], events: list, n_devices: int) -> None:
    """Per step, `perf/idle_frac/dev{i}` and their mean `perf/idle_frac` from the phase events
    inside the step's window (moves count as idle)."""
    from yatt.control.timeline import Span, idle_fractions

    spans = [Span(*event) for event in events if event[2] != "move"]
    start_s = min((s.start_s for s in spans), default=0.0)
    for row in history:
        end_s = row["control/step_end_s"]
        if end_s > start_s:
            idle = idle_fractions(spans, n_devices, (start_s, end_s))
            row.update({f"perf/idle_frac/dev{d}": f for d, f in enumerate(idle)})
            row["perf/idle_frac"] = sum(idle) / n_devices
        start_s = end_s


class Controller(ABC):
    """Runs RL steps on a Cluster; `fit` returns the run's metrics and observability data."""

    mode = "controller"

    def __init__(self, config: Config, control: ControlConfig, cluster: Cluster) -> None:
        self.config, self.control, self.cluster = config, control, cluster

    @abstractmethod
    def step(self, step: int) -> dict[str, float]:
        """One RL step over the global batch; returns the step's reduced metrics."""

    def fit(self, steps: int | None = None, progress: Any = None) -> RunResult:
        total = steps or self.config.train.steps
        history = []
        start_s = time.perf_counter()
        for step in range(total):
            step_start_s = time.perf_counter()
            metrics = self.step(step)
            metrics["timing_s/step"] = time.perf_counter() - step_start_s
            metrics["perf/throughput"] = metrics["batch/tokens"] / metrics["timing_s/step"]
            metrics["control/bytes_moved"] = float(self.bytes_moved())
            metrics["control/step_end_s"] = time.time()
            history.append(metrics)
            if progress is not None:
                progress(step + 1, total, metrics)
            if time_limit_reached(self.config.train.time_limit_s, start_s, step + 1, total):
                break  # steps generated ahead are dropped
        result = RunResult(history=history, wall_s=time.perf_counter() - start_s)
        handles = self.cluster.all_handles()
        for handle, stats in zip(handles, [h.submit("stats") for h in handles]):
            result.workers[handle.name] = stats.result()
        for handle in handles:
            result.events.extend(handle.call("drain_events"))
        result.driver_peak_rss_mb = peak_rss_mb()
        result.bytes_moved = self.bytes_moved()
        add_idle_metrics(result.history, result.events, len(self.cluster.devices))
        return result

    def close(self) -> None:
        """Release the workers."""
        self.cluster.shutdown()

    def bytes_moved(self) -> int:
        """Bytes the driver process sent to or received from workers so far."""
        return sum(h.bytes_moved for h in self.cluster.all_handles())

    def save_policy(self, folder: Path) -> Path:
        """Rank 0 writes the trained policy (with the tokenizer) into `folder`."""
        return Path(self.cluster.ranks.handles[0].call("save_policy", str(folder)))

    def weights(self) -> dict:
        """The policy weights of rank 0 (all ranks hold the same after each update)."""
        return self.cluster.ranks.handles[0].call("weights")
