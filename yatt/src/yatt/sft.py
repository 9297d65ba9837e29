"""Supervised fine-tuning (SFT) warm start: learn each example's reference answer after its prompt.

Reads these sections of the RL config tree: model, data, optim (lr, weight_decay, schedule,
warmup_steps, grad_clip), train (steps, seed, torch_threads) and logging (run_dir, overwrite):
`train.steps` optimizer steps of `algo.micro_batch_size` examples drawn with replacement, masked
NLL on the answer tokens only (+ EOS). It does not evaluate (score the result with `yatt eval`).
The result is a safetensors folder `<run_dir>/model` that `yatt train ... model.path=` can start
from.
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
from yatt.config import Config, save_config
from yatt.errors import DataError
from yatt.roles._forward import response_logits, token_logprobs_and_entropy, trim_columns
from yatt.roles.policy import lr_lambda

__all__ = ["run_sft"]

logger = logging.getLogger(__name__)


def _encode_pairs(examples: list[Any], tokenizer: Any, use_chat_template: bool):
    from yatt.data import render_prompt

    prompts, answers = [], []
    for index, example in enumerate(examples):
        if example.answer is None:
            where = example.source or f"example {index}"
            raise DataError(f"SFT needs an answer on every row; {where} has none")
        prompt = render_prompt(example, tokenizer, use_chat_template)
        prompts.append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        answer_ids = tokenizer(str(example.answer), add_special_tokens=False)["input_ids"]
        answers.append([*answer_ids, tokenizer.eos_token_id])
    return prompts, answers


def run_sft(config: Config, model: Any = None, tokenizer: Any = None) -> Path:
    """Fine-tune on (prompt, answer) pairs; returns the saved model folder."""
    from yatt.builders import build_data, build_model
    from yatt.models import save_checkpoint
    from yatt.run_dir import claim_run_dir
    from yatt.trainer import configure_threads

    run_dir = claim_run_dir(
        config.logging.run_dir,
        ("sft_metrics.jsonl", "model"),
        overwrite=config.logging.overwrite,
        resumable=False,
    )
    configure_threads(config.train.torch_threads)
    seed_everything(config.train.seed)
    if model is None:
        model, tokenizer = build_model(config.model)
    train_set, _ = build_data(config.data)
    prompts, answers = _encode_pairs(train_set, tokenizer, config.data.use_chat_template)
    save_config(config, run_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr, fused=True,
                                  weight_decay=config.optim.weight_decay)  # fmt: skip
    schedule = lr_lambda(config.optim.schedule, config.optim.warmup_steps, config.train.steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    metrics_logger = MetricsLogger([JsonlSink(run_dir / "sft_metrics.jsonl")])
    generator = torch.Generator().manual_seed(config.train.seed)
    batch_size = config.algo.micro_batch_size
    model.train()
    try:
        for step in range(1, config.train.steps + 1):
            start_s = time.perf_counter()
            rows = torch.randint(len(prompts), (batch_size,), generator=generator).tolist()
            batch = RolloutBatch.from_token_lists(
                [prompts[i] for i in rows], [answers[i] for i in rows]
            )
            ids, attention, mask, prompt_width = trim_columns(
                batch.input_ids, batch.attention_mask, batch.response_mask, batch.prompt_width
            )
            logits = response_logits(model, ids, attention, prompt_width)
            logp, _ = token_logprobs_and_entropy(logits, ids[:, prompt_width:], 1.0, False)
            loss = sft_loss(logp, mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
            optimizer.step()
            scheduler.step()
            metrics_logger.log(
                step,
                {"sft/loss": float(loss.detach()), "timing_s/step": time.perf_counter() - start_s},
            )
    finally:
        metrics_logger.close()
    model.eval()
    folder = save_checkpoint(model, tokenizer, run_dir / "model")
    logger.info("SFT done: %d steps, model saved in %s", config.train.steps, folder)
    return folder
