"""Reward-model training (`yatt rm`): a Bradley–Terry scalar-head model learned from preference
pairs, for `reward.model_path` (RLHF with a learned reward).

Reads these sections of the RL config tree: model (path: the causal LM whose decoder the
reward model starts from; its LM head gives way to a new scalar head), data (`path`: JSONL or
parquet rows with `prompt`, `chosen` and `rejected`, the two responses as strings; or `task`:
pairs made in-process from a task, `rejected` saying how: the reference answer over a
nearby wrong number, "slips"; the model's own worst completion under its best one or the
reference answer, "samples", sampled as `rollout.*` says and scored by `reward.fns`; or a pair
of each, "both"; `n_heldout` pairs held out, `n_train`, `seed`, `use_chat_template`),
algo.micro_batch_size (pairs per step), optim (lr, weight_decay, grad_clip), train (steps,
seed, torch_threads), eval (n: held-out prompts whose pairs are scored before and after
training; at_start, at_end), rollout and reward.fns (with sampled pairs) and logging
(run_dir, overwrite, progress, plots, tensorboard).

Each pair's texts are the prompt as the policy sees it (its chat template applied with
`data.use_chat_template`), followed by each response: what `reward.model_path` scores in a
run. The loss is -log sigmoid(s_chosen - s_rejected). Writes `<run_dir>/reward_model` (the
backbone, the head, the tokenizer and the run's config.yaml, whole or not at all),
`rm_metrics.jsonl` (per step: rm/loss and rm/accuracy over the step's pairs; at step 0 and at
the end: rm/heldout_accuracy, the share of held-out pairs scored the right way round, and
rm/heldout_margin, the mean s_chosen - s_rejected, over rm/heldout_pairs pairs, and with
"both" rm/heldout_accuracy_slips and rm/heldout_accuracy_samples, each kind's share; with
sampled pairs, at step 0 also rm/samples_best, the share of the samples scored as high as the
reference answer, and rm/sample_pairs, the pairs they gave) and `rm.png`. No checkpoints: a
run is short, and a stopped one starts again.

Why sample: a reward model learns only the differences its pairs show. Pairs of bare numbers
never show it what the policy writes (sentences, working, other numbers), so its scores there
say nothing; the policy's own completions, worst against best, show it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from yatt.common import MetricsLogger, seed_everything
from yatt.config import Config, save_config
from yatt.pairs import PreferencePair, check_sampling_settings, make_pairs, pair_examples

__all__ = ["run_reward_model"]

logger = logging.getLogger(__name__)

METRICS_FILE = "rm_metrics.jsonl"
MODEL_FOLDER = "reward_model"


def run_reward_model(config: Config, progress: Any = None) -> Path:
    """Train a reward model as the module docstring says; returns its folder.

    `progress(step, total, metrics)` is called after each step (the CLI's progress bar).
    Raises ConfigError for settings it does not read (`_check_settings`) and DataError for bad
    rows, before the run folder is claimed; a model that does not load, or sampled pairs that
    leave nothing to train on or to score (DataError), leave no run folder.
    """
    from yatt.builders import build_model
    from yatt.run_dir import RUN_OUTPUTS, claim_run_dir
    from yatt.trainer import configure_threads

    _check_settings(config)
    examples = pair_examples(config, "yatt rm")
    heldout_set = examples[1]
    claim = claim_run_dir(config, RUN_OUTPUTS, resume="", in_place=False)
    with claim.removed_if_unused():  # a failed set-up (or sampling) leaves no empty folder
        configure_threads(config.train.torch_threads)
        seed_everything(config.train.seed)
        causal_lm, tokenizer = build_model(config.model)
        pairs, heldout, row0 = make_pairs(causal_lm, tokenizer, examples, config, "rm/")
        model = _reward_model(causal_lm, config)
        del causal_lm  # its LM head, if untied, is not needed again
    run_dir = claim.clear()  # logging.overwrite: the previous run goes once the model loaded
    save_config(config, run_dir)
    board = run_dir / "tensorboard" if config.logging.tensorboard else None
    stream = MetricsLogger.to_files(run_dir / METRICS_FILE, board)
    try:
        heldout_slips = len(heldout_set) if config.data.rejected == "both" else 0
        if heldout and config.eval.at_start:
            row0.update(_heldout_metrics(model, tokenizer, heldout, heldout_slips))
        if row0:
            stream.log(0, row0)
        _train(model, tokenizer, pairs, heldout, heldout_slips, config, stream, progress)
    finally:
        stream.close()
    folder = _save(model, tokenizer, config, run_dir / MODEL_FOLDER)
    logger.info("reward model saved in %s (reward.model_path=%s)", folder, folder)
    return folder


# Settings of the sections `yatt rm` reads that it does not act on: refused when changed.
_UNREAD = ("train.time_limit_s", "train.gradient_checkpointing", "train.bf16_autocast",
           "eval.every", "optim.warmup_steps", "model.lora_rank")  # fmt: skip


def _check_settings(config: Config) -> None:
    """Refuse (ConfigError, one line) what `yatt rm` would otherwise ignore: control.*, the
    checkpoint settings (no checkpoints: a run is short, a stopped one starts again) and the
    `_UNREAD` ones, and bf16 training weights; and sampled pairs (`data.rejected`) with a
    data.path file, or without reward functions that can grade the task."""
    from yatt.run_checks import (
        check_job_settings,
        check_rewards_grade_task,
        check_short_job_settings,
    )

    check_job_settings(config, "yatt rm")
    if config.data.rejected != "slips":
        check_sampling_settings(config)
        check_rewards_grade_task(config, evaluate=None)
    check_short_job_settings(config, "yatt rm", _UNREAD,
                             "it trains the whole reward model at optim.lr, a constant rate, and "
                             "scores held-out pairs before and after")  # fmt: skip


def _reward_model(causal_lm: Any, config: Config) -> Any:
    """A ScalarHeadModel on the decoder of `causal_lm` (its weights, not a copy)."""
    from yatt.heads import ScalarHeadModel

    return ScalarHeadModel.from_causal_lm(causal_lm, seed=config.train.seed)


def _train(model: Any, tokenizer: Any, pairs: list[PreferencePair],
           heldout: list[PreferencePair], heldout_slips: int, config: Config,
           stream: MetricsLogger, progress: Any) -> None:  # fmt: skip
    from yatt.rewards.model import train_reward_model

    total = config.train.steps
    start_s = time.perf_counter()

    def step_done(step: int, metrics: dict[str, float]) -> None:
        row = {"rm/loss": metrics["loss"], "rm/accuracy": metrics["accuracy"],
               "timing_s/step": metrics["step_s"]}  # fmt: skip
        if step == total and heldout and config.eval.at_end:
            row.update(_heldout_metrics(model, tokenizer, heldout, heldout_slips))
        stream.log(step, row)
        if progress is not None:
            progress(step, total, row)

    optim = config.optim
    train_reward_model(
        model, tokenizer, [pair.texts() for pair in pairs], steps=total,
        batch_size=config.algo.micro_batch_size, lr=optim.lr, weight_decay=optim.weight_decay,
        max_grad_norm=optim.grad_clip, seed=config.train.seed, on_step=step_done,
    )  # fmt: skip
    logger.info("reward model: %d steps in %.1f s", total, time.perf_counter() - start_s)


def _heldout_metrics(
    model: Any, tokenizer: Any, heldout: list[PreferencePair], slips: int = 0
) -> dict:
    """The share of held-out pairs scored the right way round, and the mean score margin;
    with `slips` (data.rejected=both: the first `slips` pairs are of slips, the rest of
    samples), the share of each kind too."""
    from yatt.rewards.model import score_texts

    start_s = time.perf_counter()
    texts = [text for pair in heldout for text in pair.texts()]  # chosen, rejected, ...
    scores = score_texts(model, tokenizer, texts, groups=[k // 2 for k in range(len(texts))])
    chosen, rejected = scores[0::2], scores[1::2]
    right = ((chosen - rejected) > 0).float()
    row = {"rm/heldout_accuracy": float(right.mean()),
           "rm/heldout_margin": float((chosen - rejected).mean()),
           "rm/heldout_pairs": float(len(heldout))}  # fmt: skip
    if 0 < slips < len(heldout):
        row["rm/heldout_accuracy_slips"] = float(right[:slips].mean())
        row["rm/heldout_accuracy_samples"] = float(right[slips:].mean())
    return row | {"timing_s/eval": time.perf_counter() - start_s}


def _save(model: Any, tokenizer: Any, config: Config, folder: Path) -> Path:
    """The reward model, its tokenizer and the run's config, written whole or not at all."""
    from yatt.checkpoint import write_folder

    def write(staging: Path) -> None:
        model.save(staging, tokenizer)
        save_config(config, staging / "config.yaml")

    with torch.no_grad():
        return write_folder(folder, write)
