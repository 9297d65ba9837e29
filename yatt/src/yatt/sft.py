"""Supervised fine-tuning (SFT) warm start: learn each example's reference answer after its prompt.

Reads these sections of the RL config tree: model, data, optim (lr, betas, eps, weight_decay,
schedule, warmup_steps, grad_clip), train (steps, seed, torch_threads, time_limit_s,
shared_prefix: the start all of a step's prompts share, a chat template's system turn, runs
once; gradient_checkpointing: each layer recomputed in the backward pass, whole rows), eval (n,
every, at_end), checkpoint (every, at_end, keep_last, resume) and logging (run_dir, overwrite,
tensorboard, progress). `train.steps` optimizer steps of `algo.micro_batch_size` examples,
walking a reshuffled permutation of the training set each epoch (the RL trainer's order, seeded
by `data.seed + train.seed`), masked NLL on the answer tokens only (+ EOS). The held-out loss
(`sft/heldout_loss`, the same NLL on the first `eval.n` held-out examples, or `eval.n_periodic`
of them mid-run, no gradient) is logged every `eval.every` steps and after the last one
(`eval.at_end`), or after the step that used up `train.time_limit_s`, which ends the run early
with its model saved.

Checkpoints (`checkpoint.every` steps, at the end with `checkpoint.at_end`, and where the time
limit stops the run when `every` is set) have the RL trainer's layout (`yatt.checkpoint`, marked
as SFT's): the model, the optimizer and schedule, the data position and the RNG states.
`checkpoint.resume` (a folder, `latest` or `auto`) continues from one exactly, as the steps
would have run without the stop (in place, or into a new run folder). The result is a
safetensors folder `<run_dir>/model` (with the run's config.yaml, which `yatt eval` reads) that
`yatt train ... model.path=` can start from; `sft_metrics.jsonl` (and `tensorboard/`) hold the
curves. Accuracy is `yatt eval`'s job.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from yatt.algos.losses import sft_loss
from yatt.checkpoint import (
    SFT,
    OptimizedModel,
    checkpoint_due,
    drop_later_checkpoints,
    load_trainer_state,
    resume_target,
    truncate_metrics,
)
from yatt.common import MetricsLogger
from yatt.common.seeding import rng_state, seed_everything
from yatt.common.timers import time_limit_reached
from yatt.config import Config, save_config
from yatt.data import check_draw_order, draw_order
from yatt.errors import DataError
from yatt.roles._forward import checkpoint_layers, response_token_logprobs
from yatt.roles.policy import (
    FiniteSteps,
    adamw_with_schedule,
    step_schedule,
)
from yatt.run_checks import check_job_settings, check_unread_settings

__all__ = ["run_sft"]

logger = logging.getLogger(__name__)


def _encode_pairs(examples: list[Any], tokenizer: Any, use_chat_template: bool):
    from yatt.data import render_prompt

    prompts, answers = [], []
    for example in examples:
        assert example.answer is not None, "run_sft refuses rows without answers first"
        prompt = render_prompt(example, tokenizer, use_chat_template)
        prompts.append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        answer_ids = tokenizer(str(example.answer), add_special_tokens=False)["input_ids"]
        answers.append([*answer_ids, tokenizer.eos_token_id])
    return prompts, answers


def _pair_loss(
    model: Any, prompts: list[list[int]], answers: list[list[int]], common_start: bool
) -> torch.Tensor:
    """Mean masked NLL of `answers` after `prompts` (one batch); with `common_start` the start
    every prompt shares (a chat template's system turn) runs once for the batch."""
    return sft_loss(*response_token_logprobs(model, prompts, answers, common_start=common_start))


@torch.no_grad()
def heldout_loss(model: Any, prompts: list[list[int]], answers: list[list[int]],
                 batch_size: int, common_start: bool = True) -> float:  # fmt: skip
    """The answer-token NLL over every held-out pair (each batch weighted by its answer
    tokens), without gradients; the model's train/eval mode is kept."""
    training = model.training
    model.eval()
    try:
        total, tokens = 0.0, 0
        for start in range(0, len(prompts), batch_size):
            chunk = slice(start, start + batch_size)
            count = sum(len(answer) for answer in answers[chunk])
            loss = _pair_loss(model, prompts[chunk], answers[chunk], common_start)
            total += float(loss) * count
            tokens += count
        return total / tokens
    finally:
        model.train(training)


class _Trained(OptimizedModel):
    """The model, optimizer and schedule of an SFT run, and its training step."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, common_start: bool) -> None:
        super().__init__(model, optimizer, scheduler, SFT)
        self.common_start = common_start  # the prompts' shared start once a step
        self.finite_steps = FiniteSteps("sft")  # a non-finite gradient skips its step

    @classmethod
    def build(cls, model: Any, optim: Any, train: Any, total_steps: int) -> _Trained:
        """AdamW over the trainable parameters (LoRA: the adapters) with `optim`'s schedule;
        `train.gradient_checkpointing` recomputes each layer in the backward pass (whole rows
        then: a checkpointed layer drops a KV cache), else `train.shared_prefix` runs the
        prompts' shared start once a step."""
        if train.gradient_checkpointing:
            checkpoint_layers(model)
        common_start = train.shared_prefix and not train.gradient_checkpointing
        optimizer, scheduler = adamw_with_schedule(model, optim, optim.lr, total_steps, fused=True)
        return cls(model, optimizer, scheduler, common_start)

    def step(
        self, prompts: list[list[int]], answers: list[list[int]], grad_clip: float
    ) -> dict[str, float]:
        """One optimizer step on the answers' loss; its loss, learning rate and time."""
        start_s = time.perf_counter()
        loss = _pair_loss(self.model, prompts, answers, self.common_start)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = self.optimizer.param_groups[0]["lr"]  # this step's rate, before the schedule moves
        params = self.optimizer.param_groups[0]["params"]
        self.finite_steps.clip_and_step(self.optimizer, params, grad_clip)
        step_schedule(self.scheduler)
        return {
            "sft/loss": float(loss.detach()),
            "sft/lr": lr,
            "timing_s/step": time.perf_counter() - start_s,
        }


def run_sft(config: Config, model: Any = None, tokenizer: Any = None, progress: Any = None) -> Path:
    """Fine-tune on (prompt, answer) pairs; returns the saved model folder.

    `progress(step, total, metrics)` is called after each step (the CLI's progress bar).
    Raises DataError for a row without an answer, or an evaluation (`eval.n` > 0 with
    `eval.every` or `eval.at_end`) with no held-out rows, and ConfigError for bf16 training
    weights (`check_training_dtype`), a `checkpoint.resume` that names no SFT checkpoint or one
    of other data, or a run folder holding another run, before any step.
    """
    from yatt.data import PromptSampler
    from yatt.evaluate import examples_due
    from yatt.run_dir import RUN_OUTPUTS, claim_run_dir
    from yatt.trainer import configure_threads

    _check_settings(config)
    resume, in_place = resume_target(config, SFT)
    eval_cfg, total = config.eval, config.train.steps
    train_set, heldout_set = _sft_data(config)
    claim = claim_run_dir(config, RUN_OUTPUTS, resume=resume, in_place=in_place)
    configure_threads(config.train.torch_threads)
    seed_everything(config.train.seed)
    model, tokenizer = _sft_model(config, model, tokenizer, resume)
    prompts, answers = _encode_pairs(train_set, tokenizer, config.data.use_chat_template)
    heldout = _encode_pairs(heldout_set[: eval_cfg.n], tokenizer, config.data.use_chat_template)
    trained = _Trained.build(model, config.optim, config.train, total)
    sampler = PromptSampler(len(prompts), config.data.seed + config.train.seed)
    order = draw_order(config, train_set)  # what the data position depends on
    done = 0  # steps taken before this process (a resumed run's)
    if resume:
        done = _resume(Path(resume), trained, sampler, order, config)
    run_dir = claim.clear()  # logging.overwrite: the previous run goes once the model loaded
    if in_place:
        drop_later_checkpoints(run_dir, Path(resume), done, config.logging.overwrite)
        truncate_metrics(run_dir / "sft_metrics.jsonl", done)
    if resume:  # (said once nothing can refuse it any more)
        logger.info("resumed SFT from %s at step %d", resume, done)
    save_config(config, run_dir)
    metrics_logger = _metrics_logger(config, run_dir, done)
    model.train()
    batch_size = config.algo.micro_batch_size
    run_start_s, step = time.perf_counter(), done
    try:
        for step in range(done + 1, total + 1):
            rows = sampler.take(batch_size)
            batch = [prompts[i] for i in rows], [answers[i] for i in rows]
            metrics = trained.step(*batch, config.optim.grad_clip)
            metrics["sft/epoch"] = sampler.data_epoch + sampler.position / len(prompts)
            out_of_time = time_limit_reached(config.train.time_limit_s, run_start_s, step, total)
            due = examples_due(eval_cfg, step, total, out_of_time)  # n, or n_periodic mid-run
            if due:
                start_s = time.perf_counter()
                first = [pairs[:due] for pairs in heldout]
                metrics["sft/heldout_loss"] = heldout_loss(model, *first, batch_size,
                                                           config.train.shared_prefix)  # fmt: skip
                metrics["timing_s/eval"] = time.perf_counter() - start_s
            metrics_logger.log(step, metrics)
            if progress is not None:
                progress(step, total, metrics)
            if checkpoint_due(config, step, out_of_time):
                state = {"sampler": {**sampler.state_dict(), **order}, "rng": rng_state()}
                trained.save(run_dir, step, config, tokenizer, state)
            if out_of_time:
                break
    finally:
        metrics_logger.close()
    model.eval()
    folder = trained.save_model(run_dir / "model", tokenizer, config)
    logger.info("SFT done: %d of %d steps, model saved in %s", step, total, folder)
    return folder


def _check_settings(config: Config) -> None:
    """Refuse (ConfigError, one line) what `yatt sft` would ignore or get wrong: the training
    jobs' checks (`check_job_settings`), and `train.bf16_autocast`, which it does not act on."""
    check_job_settings(config, "yatt sft")
    check_unread_settings(config, "yatt sft", ("train.bf16_autocast",),
                          "it trains and scores held out at full precision")  # fmt: skip


def _sft_model(config: Config, model: Any, tokenizer: Any, resume: str) -> tuple[Any, Any]:
    """The model to fine-tune: built from `model` settings (or the checkpoint resumed), or a
    caller's own with LoRA as configured and the checkpoint's weights loaded."""
    from yatt.builders import adapt_model, build_model, resume_into

    if model is None:
        return build_model(config.model, resume_from=resume or None)
    adapt_model(model, config.model)
    if resume:
        resume_into(model, config.model, resume)
    return model, tokenizer


def _metrics_logger(config: Config, run_dir: Path, done: int) -> MetricsLogger:
    """sft_metrics.jsonl, and TensorBoard where `logging.tensorboard` (from step `done`)."""
    board = run_dir / "tensorboard" if config.logging.tensorboard else None
    return MetricsLogger.to_files(run_dir / "sft_metrics.jsonl", board, done)


def _sft_data(config: Config) -> tuple[list[Any], list[Any]]:
    """The training and held-out examples, refused (DataError) before the run folder is
    claimed when there are no training rows, an evaluation has no held-out rows, or a row
    it reads has no answer."""
    from yatt.builders import build_data

    eval_cfg = config.eval
    train_set, heldout_set = build_data(config.data)
    if not train_set:
        raise DataError("SFT needs training rows; the data has none")
    evaluates = eval_cfg.n > 0 and (eval_cfg.every > 0 or eval_cfg.at_end)
    if evaluates and not heldout_set:
        raise DataError(
            f"SFT's held-out loss (eval.n={eval_cfg.n}) needs held-out rows; data has none "
            "(set data.n_heldout, or eval.n=0)"
        )
    for index, example in enumerate([*train_set, *heldout_set[: eval_cfg.n]]):
        if example.answer is None:
            where = example.source or f"example {index}"
            raise DataError(f"SFT needs an answer on every row; {where} has none")
    return train_set, heldout_set


def _resume(checkpoint: Path, trained: _Trained, sampler: Any, order: dict, config: Config) -> int:
    """Load an SFT checkpoint's optimizer, schedule, data position and RNG states (the model
    came from its folder); returns its step. ConfigError (one line) for one of other data or
    one whose state does not fit this run."""
    state = load_trainer_state(checkpoint, writer=SFT)
    if isinstance(state.get("sampler"), dict):  # (else: the error below names it)
        check_draw_order(state["sampler"], order, str(checkpoint), draw_size=False)
    return trained.restore(state, sampler, config, checkpoint)
