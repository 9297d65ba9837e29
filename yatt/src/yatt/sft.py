"""Supervised fine-tuning (SFT) warm start: learn each example's reference answer after its prompt.

Reads these sections of the RL config tree: model, data, optim (lr, betas, eps, weight_decay,
schedule, warmup_steps, grad_clip), train (steps, seed, torch_threads, time_limit_s), eval (n,
every, at_end) and logging (run_dir, overwrite, tensorboard, progress). It keeps no resumable
checkpoints, only the model at the end: `checkpoint.resume` is refused (`auto` starts afresh)
and `checkpoint.every` warned about (an SFT run is short; rerun it). `train.steps` optimizer
steps of `algo.micro_batch_size` examples, walking a reshuffled permutation of the training set each
epoch (as the RL trainer walks its prompts), masked NLL on the answer tokens only (+ EOS). The
held-out loss (`sft/heldout_loss`, the same NLL on the first `eval.n` held-out examples, or
`eval.n_periodic` of them mid-run, no gradient) is logged every `eval.every` steps and after
the last one (`eval.at_end`), or after the step that used up `train.time_limit_s`, which
ends the run early with its model saved. The result
is a safetensors folder `<run_dir>/model` (with the run's config.yaml, which `yatt eval` reads)
that `yatt train ... model.path=` can start from; `sft_metrics.jsonl` (and `tensorboard/`) hold
the curves. Accuracy is `yatt eval`'s job.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from yatt.algos.losses import sft_loss
from yatt.batch import RolloutBatch
from yatt.common import JsonlSink, MetricsLogger
from yatt.common.seeding import seed_everything
from yatt.common.timers import time_limit_reached
from yatt.config import Config, save_config
from yatt.errors import ConfigError, DataError
from yatt.roles._forward import response_logits, token_logprobs_and_entropy, trim_columns
from yatt.roles.policy import lr_lambda
from yatt.run_checks import check_training_dtype

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


def _pair_loss(model: Any, prompts: list[list[int]], answers: list[list[int]]) -> torch.Tensor:
    """Mean masked NLL of `answers` after `prompts` (one batch)."""
    batch = RolloutBatch.from_token_lists(prompts, answers)
    ids, attention, mask, prompt_width = trim_columns(
        batch.input_ids, batch.attention_mask, batch.response_mask, batch.prompt_width
    )
    logits = response_logits(model, ids, attention, prompt_width)
    logp, _ = token_logprobs_and_entropy(logits, ids[:, prompt_width:], 1.0, False)
    return sft_loss(logp, mask)


@torch.no_grad()
def heldout_loss(model: Any, prompts: list[list[int]], answers: list[list[int]],
                 batch_size: int) -> float:  # fmt: skip
    """The answer-token NLL over every held-out pair (each batch weighted by its answer
    tokens), without gradients; the model's train/eval mode is kept."""
    training = model.training
    model.eval()
    try:
        total, tokens = 0.0, 0
        for start in range(0, len(prompts), batch_size):
            chunk = slice(start, start + batch_size)
            count = sum(len(answer) for answer in answers[chunk])
            total += float(_pair_loss(model, prompts[chunk], answers[chunk])) * count
            tokens += count
        return total / tokens
    finally:
        model.train(training)


def run_sft(config: Config, model: Any = None, tokenizer: Any = None, progress: Any = None) -> Path:
    """Fine-tune on (prompt, answer) pairs; returns the saved model folder.

    `progress(step, total, metrics)` is called after each step (the CLI's progress bar).
    Raises DataError for a row without an answer, or an evaluation (`eval.n` > 0 with
    `eval.every` or `eval.at_end`) with no held-out rows, and ConfigError for bf16 training
    weights (`check_training_dtype`), `checkpoint.resume`, or a run folder holding another
    run, before any step.
    """
    from yatt.builders import build_data, build_model
    from yatt.common import TensorBoardSink
    from yatt.evaluate import examples_due
    from yatt.models import save_checkpoint
    from yatt.run_dir import check_run_dir
    from yatt.trainer import PromptSampler, configure_threads

    check_training_dtype(config)
    if config.checkpoint.resume not in ("", "auto"):  # auto: a fresh start where none is kept
        raise ConfigError(
            f"checkpoint.resume={config.checkpoint.resume!r}: SFT keeps no resumable "
            "checkpoints (only its final model); rerun it, or start RL from that model"
        )
    if config.checkpoint.every:
        logger.warning(
            "checkpoint.every=%d is ignored by SFT: it saves only its final model",
            config.checkpoint.every,
        )
    eval_cfg, total = config.eval, config.train.steps
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
        if example.answer is None:  # refused before the run folder is claimed
            where = example.source or f"example {index}"
            raise DataError(f"SFT needs an answer on every row; {where} has none")
    # An RL run's outputs too (yatt.trainer, yatt.control): its folder is refused, not mixed
    outputs = ("sft_metrics.jsonl", "model", "tensorboard", "metrics.jsonl", "checkpoints")
    claim = check_run_dir(
        config.logging.run_dir, outputs, overwrite=config.logging.overwrite, resumable=False,
        model_path=config.model.path,
    )  # fmt: skip
    configure_threads(config.train.torch_threads)
    seed_everything(config.train.seed)
    if model is None:
        model, tokenizer = build_model(config.model)
    prompts, answers = _encode_pairs(train_set, tokenizer, config.data.use_chat_template)
    heldout = _encode_pairs(heldout_set[: eval_cfg.n], tokenizer, config.data.use_chat_template)
    run_dir = claim.clear()  # logging.overwrite: the previous run goes once the model loaded
    save_config(config, run_dir)
    optim = config.optim
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
        weight_decay=optim.weight_decay, fused=True,
    )  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(optim.schedule, optim.warmup_steps, total)
    )
    sinks: list[Any] = [JsonlSink(run_dir / "sft_metrics.jsonl")]
    if config.logging.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    metrics_logger = MetricsLogger(sinks)
    sampler = PromptSampler(len(prompts), config.train.seed)
    batch_size = config.algo.micro_batch_size
    model.train()
    run_start_s, step = time.perf_counter(), 0
    try:
        for step in range(1, total + 1):
            start_s = time.perf_counter()
            rows = sampler.take(batch_size)
            loss = _pair_loss(model, [prompts[i] for i in rows], [answers[i] for i in rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
            lr = optimizer.param_groups[0]["lr"]  # this step's rate, before the schedule moves
            optimizer.step()
            scheduler.step()
            metrics = {
                "sft/loss": float(loss.detach()),
                "sft/epoch": sampler.data_epoch + sampler.position / len(prompts),
                "sft/lr": lr,
                "timing_s/step": time.perf_counter() - start_s,
            }
            out_of_time = time_limit_reached(config.train.time_limit_s, run_start_s, step, total)
            due = examples_due(eval_cfg, step, total, out_of_time)  # n, or n_periodic mid-run
            if due:
                start_s = time.perf_counter()
                first = [pairs[:due] for pairs in heldout]
                metrics["sft/heldout_loss"] = heldout_loss(model, *first, batch_size)
                metrics["timing_s/eval"] = time.perf_counter() - start_s
            metrics_logger.log(step, metrics)
            if progress is not None:
                progress(step, total, metrics)
            if out_of_time:
                break
    finally:
        metrics_logger.close()
    model.eval()
    folder = save_checkpoint(model, tokenizer, run_dir / "model")
    save_config(config, folder / "config.yaml")  # `yatt eval <folder>` evaluates on this data
    logger.info("SFT done: %d of %d steps, model saved in %s", step, total, folder)
    return folder
