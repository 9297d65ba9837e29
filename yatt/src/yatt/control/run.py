"""Entry point for distributed training from a Config: picks the controller, writes the metrics
JSONL, a per-device timeline PNG and the controller's memory and data-movement numbers."""

from __future__ import annotations

import json
import logging
from typing import Any

from yatt.config import Config
from yatt.control.config import ControlConfig
from yatt.control.controller import RunResult

__all__ = ["fit_distributed"]

logger = logging.getLogger(__name__)


def fit_distributed(config: Config, control: ControlConfig, progress: Any = None) -> RunResult:
    """Train `config.train.steps` steps with the controller `control` selects; writes
    `metrics.jsonl`, `timeline.png` and `control.json` into `config.logging.run_dir`."""
    from yatt.common import JsonlSink, MetricsLogger
    from yatt.control import make_controller
    from yatt.control.timeline import plot_timeline, spans_from_events
    from yatt.run_dir import claim_run_dir

    outputs = ("metrics.jsonl", "timeline.png", "control.json")
    run_dir = claim_run_dir(
        config.logging.run_dir, outputs, overwrite=config.logging.overwrite, resumable=False
    )

    controller = make_controller(config, control)
    try:
        result = controller.fit(progress=progress)
        n_devices = len(controller.cluster.devices)
    finally:
        controller.close()
    sink = MetricsLogger([JsonlSink(run_dir / "metrics.jsonl")])
    for step, metrics in enumerate(result.history, start=1):
        sink.log(step, metrics)
    sink.close()
    plot_timeline(spans_from_events(result.events), n_devices, run_dir / "timeline.png",
                  f"{control.mode} controllers, {control.placement}")  # fmt: skip
    summary = {"wall_s": result.wall_s, "driver_peak_rss_mb": result.driver_peak_rss_mb,
               "bytes_moved": result.bytes_moved, "workers": result.workers}  # fmt: skip
    (run_dir / "control.json").write_text(json.dumps(summary, indent=1))
    logger.info(
        "distributed run: %.1f s, driver peak %.0f MiB, %d bytes via the driver",
        result.wall_s,
        result.driver_peak_rss_mb,
        result.bytes_moved,
    )
    return result
