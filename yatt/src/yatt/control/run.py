"""Entry point for distributed training from a Config: picks the controller, writes the metrics
JSONL, a per-device timeline PNG and the controller's memory and data-movement numbers."""

from __future__ import annotations

import json
import logging
from typing import Any

from yatt.config import Config, check_controller_settings, check_eval_data
from yatt.control.config import ControlConfig
from yatt.control.controller import RunResult

__all__ = ["fit_distributed"]

logger = logging.getLogger(__name__)
MODEL_FOLDER = "model"  # the trained policy, with checkpoint.at_end


def fit_distributed(config: Config, control: ControlConfig, progress: Any = None) -> RunResult:
    """Train `config.train.steps` steps with the controller `control` selects, evaluating on
    held-out problems as `eval.*` asks; writes `metrics.jsonl` (a row per step as it ends, and
    a step-0 row for `eval.at_start`, rewritten at the end with the per-device idle
    fractions), TensorBoard logs with `logging.tensorboard`, `timeline.png`, `control.json`
    and, with `checkpoint.at_end`, the trained policy as the model folder `model/` into
    `config.logging.run_dir`.

    Raises ConfigError, before the run folder is claimed or any worker starts, for settings
    only the single-process trainer offers (see `check_controller_settings`: periodic
    checkpoints, resuming, PPO and REINFORCE++, a KL term under re-placement, the overlong
    penalty), for control.backend=ray without Ray installed, and for an evaluation with no
    held-out problems."""
    from yatt.common import JsonlSink, MetricsLogger, TensorBoardSink
    from yatt.config import save_config
    from yatt.control import make_controller
    from yatt.control.timeline import plot_timeline, spans_from_events
    from yatt.control.workers import require_backend
    from yatt.run_dir import claim_run_dir

    check_controller_settings(config, control)
    require_backend(control.backend)
    check_eval_data(config)
    if control.backend == "ray" and config.train.torch_threads:
        logger.info(
            "train.torch_threads=%d does not apply to Ray workers: each runs one thread per "
            "core of its device (control.cpu_mapping)",
            config.train.torch_threads,
        )
    outputs = ("metrics.jsonl", "timeline.png", "control.json", "tensorboard", MODEL_FOLDER)
    run_dir = claim_run_dir(
        config.logging.run_dir, outputs, overwrite=config.logging.overwrite, resumable=False
    )
    metrics_path = run_dir / "metrics.jsonl"
    controller = make_controller(config, control)
    try:
        sinks: list[Any] = [JsonlSink(metrics_path)]
        if config.logging.tensorboard:
            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        stream = MetricsLogger(sinks)

        start_rows: list[dict[str, float]] = []  # step 0: the evaluation before training

        def step_done(step: int, total: int, metrics: dict[str, float]) -> None:
            stream.log(step, metrics)  # on disk as each step ends: a crash keeps the steps done
            if step == 0:
                start_rows.append(metrics)
            elif progress is not None:
                progress(step, total, metrics)

        try:
            result = controller.fit(progress=step_done)
        finally:
            stream.close()
        n_devices = len(controller.cluster.devices)
        if config.checkpoint.at_end:
            saved = controller.save_policy(run_dir / MODEL_FOLDER)
            save_config(config, saved / "config.yaml")
            logger.info("saved the trained policy in %s (yatt eval %s)", saved, saved)
    finally:
        controller.close()
    staging = metrics_path.with_name(metrics_path.name + ".tmp")  # rows with the idle metrics
    staging.unlink(missing_ok=True)
    sink = MetricsLogger([JsonlSink(staging)])
    for metrics in start_rows:
        sink.log(0, metrics)
    for step, metrics in enumerate(result.history, start=1):
        sink.log(step, metrics)
    sink.close()
    staging.replace(metrics_path)
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
