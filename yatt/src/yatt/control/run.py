"""Entry point for distributed training from a Config: picks the controller, writes the metrics
JSONL, a per-device timeline PNG and the controller's memory and data-movement numbers."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from yatt.config import Config, check_controller_settings
from yatt.control.config import ControlConfig, ignored_settings
from yatt.control.controller import RunResult
from yatt.control.segments import (
    SEGMENTS_FILE,
    Segment,
    coverage_text,
    cut_segments,
    load_segments,
    merged_spans,
    merged_summary,
    save_segments,
    settings_text,
)
from yatt.run_checks import (
    check_eval_data,
    check_job_settings,
    check_rewards_grade_task,
    try_rewards_once,
    warn_if_nothing_kept,
)
from yatt.run_dir import RunDirClaim

__all__ = ["fit_distributed"]

logger = logging.getLogger(__name__)
MODEL_FOLDER = "model"  # the trained policy, with checkpoint.at_end


def _check_run(config: Config, control: ControlConfig) -> None:
    """Refuse (ConfigError) what the controllers cannot run, before the run folder is claimed
    or any worker starts; log the settings they ignore."""
    from yatt.control.workers import require_backend

    check_controller_settings(config, control)
    require_backend(control.backend)
    check_eval_data(config)
    for note in ignored_settings(control):
        logger.warning("%s", note)
    check_job_settings(config, "yatt train")
    check_rewards_grade_task(config)
    if control.backend == "ray" and config.train.torch_threads:
        logger.info(
            "train.torch_threads=%d does not apply to Ray workers: each runs one thread per "
            "core of its device (control.cpu_mapping)",
            config.train.torch_threads,
        )


def _restore(
    controller: Any, config: Config, resume: Path, state: dict[str, Any], run_dir: Path
) -> list[Segment]:
    """Load checkpoint `resume` into the workers; resumed in place, drop the run's later
    checkpoints, metric rows and segment records. Returns the segments kept (the run's parts
    before this one)."""
    from yatt.checkpoint import checkpoint_run_dir, drop_later_checkpoints, truncate_metrics

    controller.restore(resume, state)
    if checkpoint_run_dir(resume) != run_dir.resolve():  # another run's: a new run here
        return []
    step = state["step"]
    drop_later_checkpoints(run_dir, resume, step, config.logging.overwrite)
    truncate_metrics(run_dir / "metrics.jsonl", step)
    if not (run_dir / SEGMENTS_FILE).is_file():
        return []
    earlier = cut_segments(load_segments(run_dir), step)  # the steps run again leave them now
    save_segments(run_dir, earlier)
    return earlier


def _save_policy(controller: Any, config: Config, control: ControlConfig, folder: Path) -> None:
    """The trained policy as a model folder `yatt eval` reads, with the run's config."""
    from yatt.checkpoint import write_folder
    from yatt.config import save_config

    def write(staging: Path) -> None:
        controller.save_policy(staging)
        save_config(recorded_config(config, control), staging / "config.yaml")

    saved = write_folder(folder, write)
    logger.info("saved the trained policy in %s (yatt eval %s)", saved, saved)


def fit_distributed(config: Config, control: ControlConfig, progress: Any = None) -> RunResult:
    """Train `config.train.steps` steps with the controller `control` selects, evaluating on
    held-out problems as `eval.*` asks; writes `metrics.jsonl` (a row per step as it ends, and
    a step-0 row for `eval.at_start`, rewritten at the end with the per-device idle
    fractions), TensorBoard logs with `logging.tensorboard`, `timeline.png`, `control.json`,
    a checkpoint every `checkpoint.every` steps (`checkpoints/step_<n>/`, yatt.checkpoint's
    layout) and, with `checkpoint.at_end`, the trained policy as the model folder `model/` into
    `config.logging.run_dir`.

    `checkpoint.resume` (a folder, `latest` or `auto`, as for the trainer) continues from a
    checkpoint the controllers wrote: every worker loads the weights (policy ranks also the
    optimizer and schedule), and each data-parallel group samples first the prompts that were
    still due. A synchronous run then continues exactly as an uninterrupted one; an async one
    samples the steps that were in flight again, with the checkpoint's weights. A checkpoint of
    this run folder continues the run in place (its later rows and checkpoints give way); one
    of another folder starts a new run here. `progress` first gets the resumed step (with its
    logged row), so a progress bar starts there. `timeline.png` and `control.json` cover every
    segment of a run resumed in place (`yatt.control.segments`: the records each part that
    ended left in the run folder) and name the steps they cover; steps of a part that crashed
    are named as not recorded.

    Raises ConfigError, before the run folder is claimed or any worker starts, for settings
    only the single-process trainer offers (see `check_controller_settings`: PPO and
    REINFORCE++, a KL term under re-placement), for control.backend=ray
    without Ray installed, for an evaluation with no held-out problems, and for a checkpoint
    the controllers did not write or whose data position does not fit this run."""
    from yatt.config import save_config
    from yatt.control import make_controller

    _check_run(config, control)
    resume, state, claim = _claim(config)
    run_dir = claim.path
    start_step = 0 if state is None else state["step"]
    with claim.removed_if_unused():  # workers that fail to load leave no empty folder
        controller = make_controller(config, control)
    controller.checkpoint_dir = run_dir
    earlier: list[Segment] = []  # the records of the run's parts before this one
    try:
        if state is not None:  # before anything in the folder changes: a misfit is refused
            earlier = _restore(controller, config, Path(resume), state, run_dir)
            if progress is not None:  # the bar starts at the resumed step, as the trainer's
                progress(start_step, config.train.steps, _logged_row(Path(resume), start_step))
        if claim.previous:  # logging.overwrite: the rewards work before the previous run goes
            _try_rewards_once(config)
        claim.clear()  # logging.overwrite: the previous run goes once this one's workers loaded
        save_config(recorded_config(config, control), run_dir)
        warn_if_nothing_kept(config)
        start_s = time.time()
        result, start_rows = _fit_logged(controller, config, run_dir, start_step, progress)
        n_devices = len(controller.cluster.devices)
        if config.checkpoint.at_end:
            _save_policy(controller, config, control, run_dir / MODEL_FOLDER)
    finally:
        controller.close()
    _rewrite_metrics(config, run_dir, start_step, start_rows, result.history)
    settings = settings_label(control, n_devices)
    segments = [*earlier, _segment(result, start_step, start_s, n_devices, settings)]
    save_segments(run_dir, segments)
    _write_run_outputs(run_dir, segments)
    result.run_dir = run_dir
    logger.info(
        "distributed run: %.1f s, driver peak %.0f MiB, %d bytes via the driver",
        result.wall_s,
        result.driver_peak_rss_mb,
        result.bytes_moved,
    )
    return result


def _fit_logged(controller: Any, config: Config, run_dir: Path, start_step: int,
                progress: Any) -> tuple[RunResult, list[dict[str, float]]]:  # fmt: skip
    """`controller.fit` from `start_step`, each row in `metrics.jsonl` (and TensorBoard) as
    its step ends (a crash keeps the steps done) and passed on to `progress`; the result and
    the step-0 rows (the evaluation before training)."""
    from yatt.common import MetricsLogger

    board = run_dir / "tensorboard" if config.logging.tensorboard else None
    stream = MetricsLogger.to_files(run_dir / "metrics.jsonl", board, start_step)
    start_rows: list[dict[str, float]] = []

    def step_done(step: int, total: int, metrics: dict[str, float]) -> None:
        stream.log(step, metrics)
        if step == 0:
            start_rows.append(metrics)
        elif progress is not None:
            progress(step, total, metrics)

    try:
        return controller.fit(progress=step_done, start_step=start_step), start_rows
    finally:
        stream.close()


def recorded_config(config: Config, control: ControlConfig) -> Config:
    """The config a run folder records: with the Ray controllers, the `control` that ran (a
    Python caller may pass one apart from `config.control`). An in-process ControlConfig is
    no config a run could load (`control.*` settings need control.backend=ray), so the folder
    keeps `config` as given and `control.json` names the controller."""
    if control.backend != "ray":
        return config
    return dataclasses.replace(config, control=control)


def settings_label(control: ControlConfig, n_devices: int) -> str:
    """The `control.*` settings that shape a run's timeline, in a few words."""
    mode = "parallel" if control.replace_every else control.mode  # (see make_controller)
    parts = ["one controller" if mode == "single" else "parallel controllers", control.placement]
    if control.placement != "colocate" and control.n_sampler:
        parts[-1] += f" ({control.n_sampler} sampler devices)"
    parts.append(f"{n_devices} device{'s' if n_devices != 1 else ''}")
    if control.async_staleness:
        parts.append(f"async staleness {control.async_staleness}")
    if control.over_dispatch:
        parts.append(f"over-dispatch {control.over_dispatch:g}")
    if control.replace_every:
        every = control.replace_every
        parts.append(
            f"re-placement every {every} steps" if every > 1 else "re-placement every step"
        )
    return ", ".join(parts)


def _segment(
    result: RunResult, start_step: int, start_s: float, n_devices: int, settings: str
) -> Segment:
    """The record of the part of the run `result` describes (steps `start_step + 1` on)."""
    history = result.history
    per_step_bytes = all("control/bytes_moved" in row for row in history)
    return Segment(
        first_step=start_step,
        step_end_s=[row["control/step_end_s"] for row in history],
        start_s=start_s,
        wall_s=result.wall_s,
        n_devices=n_devices,
        driver_peak_rss_mb=result.driver_peak_rss_mb,
        bytes_moved=result.bytes_moved,
        step_bytes=[row["control/bytes_moved"] for row in history] if per_step_bytes else [],
        workers=result.workers,
        events=[tuple(event) for event in result.events],  # type: ignore[misc]
        settings=settings,
        decisions=result.decisions,
    )


def _write_run_outputs(run_dir: Path, segments: list[Segment]) -> None:
    """`timeline.png` and `control.json` over every segment of the run, each naming the steps
    it covers (`coverage_text`, `merged_summary`'s `steps` and `not_recorded`) and the settings
    each part ran with."""
    from yatt.control.timeline import plot_timeline

    spans, marks = merged_spans(segments)
    n_devices = max(segment.n_devices for segment in segments)
    title = ", ".join(filter(None, (settings_text(segments), coverage_text(segments))))
    plot_timeline(spans, n_devices, run_dir / "timeline.png", title, marks)
    (run_dir / "control.json").write_text(json.dumps(merged_summary(segments), indent=1))


def _try_rewards_once(config: Config) -> None:
    """`try_rewards_once` on the driver for the rule functions of `reward.fns` (not a batch
    scorer, a reward model or `control.extra_rewards`, which may need a worker's device or
    services), on the first training prompt rendered as the workers render it."""
    from yatt.builders import build_data, build_tokenizer
    from yatt.data import render_prompt
    from yatt.rewards import CombinedReward, is_batch_scorer

    rules = [
        (name, weight)
        for name, weight in zip(config.reward.fns, config.reward.weights, strict=True)
        if not is_batch_scorer(name)
    ]
    if not rules:
        return
    first = build_data(config.data)[0][0]
    tokenizer = build_tokenizer(config.model) if config.data.use_chat_template else None
    prompt = render_prompt(first, tokenizer, config.data.use_chat_template)
    try_rewards_once(CombinedReward(rules), prompt, first)


def _logged_row(checkpoint: Path, step: int) -> dict[str, float]:
    """The metrics row the run that wrote `checkpoint` logged for `step` (without `step`), or
    {} when its run folder holds no readable one."""
    from yatt.checkpoint import checkpoint_run_dir
    from yatt.common import read_metrics

    folder = checkpoint_run_dir(checkpoint)
    try:
        rows = read_metrics(folder / "metrics.jsonl")[0] if folder is not None else []
    except (OSError, ValueError):  # missing, or damaged before its last line
        return {}
    logged = [row for _, row in rows if row["step"] == step and "timing_s/step" in row]
    return {k: v for k, v in logged[-1].items() if k != "step"} if logged else {}


def _claim(config: Config) -> tuple[str, dict[str, Any] | None, RunDirClaim]:
    """The checkpoint `checkpoint.resume` names ("" for none) with its checked data position,
    and the run folder, checked (in place for a checkpoint of its own); a previous run there
    that `logging.overwrite` replaces is deleted by the claim's `clear()`."""
    from yatt.builders import check_adapters_fit
    from yatt.checkpoint import (
        checkpoint_run_dir,
        load_control_state,
        resolve_resume,
        warn_changed_scoring,
    )
    from yatt.run_dir import RUN_OUTPUTS, claim_run_dir

    resume = resolve_resume(config.checkpoint.resume, config.logging.run_dir, config.train.steps)
    state = None
    if resume:
        state = load_control_state(Path(resume))
        check_resume_fits(config, state, resume)
        check_adapters_fit(config.model, resume)
        warn_changed_scoring(Path(resume), config)
    run_dir = Path(config.logging.run_dir).resolve()
    in_place = bool(resume) and checkpoint_run_dir(Path(resume)) == run_dir
    claimed = claim_run_dir(config, RUN_OUTPUTS, resume=resume, in_place=in_place)
    return resume, state, claimed


def _rewrite_metrics(config: Config, run_dir: Path, start_step: int,
                     start_rows: list[dict[str, float]], history: list[dict[str, float]]
                     ) -> None:  # fmt: skip
    """Rewrite metrics.jsonl with the per-device idle fractions (known only now), keeping a
    resumed run's earlier rows as written; add the fractions to TensorBoard too."""
    from yatt.common import JsonlSink, TensorBoardSink, read_metrics

    metrics_path = run_dir / "metrics.jsonl"
    staging = metrics_path.with_name(metrics_path.name + ".tmp")
    earlier = read_metrics(metrics_path)[0] if start_step else []
    kept = [line + b"\n" for line, row in earlier if row["step"] <= start_step]  # as written
    staging.write_bytes(b"".join(kept))
    sink = JsonlSink(staging)  # (not a MetricsLogger: the rows were logged when they came)
    for metrics in start_rows:
        sink.write(0, metrics)
    for step, metrics in enumerate(history, start=start_step + 1):
        sink.write(step, metrics)
    sink.close()
    staging.replace(metrics_path)
    if config.logging.tensorboard:
        board = TensorBoardSink(run_dir / "tensorboard")
        for step, metrics in enumerate(history, start=start_step + 1):
            board.write(step, {k: v for k, v in metrics.items() if k.startswith("perf/idle_frac")})
        board.close()


def check_resume_fits(config: Config, state: dict[str, Any], checkpoint: str) -> None:
    """Raise ConfigError (one line) when a controllers' checkpoint's data position does not fit
    `config`: its queues count draws of another size, in another prompt order (seed), or over
    another training set (size, or prompts and answers)."""
    from yatt.builders import build_data
    from yatt.data import check_draw_order, draw_order

    check_draw_order(state, draw_order(config, build_data(config.data)[0]), checkpoint)
