"""Builders shared by the trainer and the CLI: the policy model and the prompt datasets."""

from __future__ import annotations

import logging
from typing import Any

import torch

from yatt.config import DataConfig, ModelConfig
from yatt.errors import ConfigError

__all__ = ["adapt_model", "build_data", "build_model", "check_adapters_fit", "resume_into"]

logger = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_TINY_ARCHS = {"tiny": "llama", "tiny-llama": "llama", "tiny-qwen2": "qwen2"}  # model.path names


def build_model(config: ModelConfig, resume_from: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from `model.path` ('tiny', 'tiny-qwen2', a known name or a folder), or
    from a checkpoint folder when resuming; with `model.lora_rank`, adapters on it (a resume
    loads the checkpoint's adapters onto the base model of `model.path`). Raises ModelError
    for a missing/unloadable folder, ConfigError for a checkpoint trained otherwise."""
    from yatt.checkpoint import policy_folder
    from yatt.models import load_model, load_tokenizer, tiny_model

    dtype = _DTYPES[config.dtype]
    if resume_from:
        if not config.lora_rank:
            check_adapters_fit(config, resume_from)
            folder = policy_folder(resume_from)
            return load_model(folder, dtype=dtype), load_tokenizer(folder)
        model, tokenizer = build_model(config)
        resume_into(model, config, resume_from)  # the checkpoint's adapters on the base
        return model, tokenizer
    if config.path in _TINY_ARCHS:
        model, tokenizer = tiny_model(_TINY_ARCHS[config.path], seed=config.tiny_seed)
        model = model.to(dtype)
    else:
        model, tokenizer = load_model(config.path, dtype=dtype), load_tokenizer(config.path)
    return adapt_model(model, config), tokenizer


def resume_into(model: Any, config: ModelConfig, resume_from: str) -> None:
    """Give a caller's own model (already through ``adapt_model``) the trained weights of the
    checkpoint a run resumes, as ``build_model`` gives the configured one: its adapters with
    LoRA, else every weight. Left with its own, it trained on from the checkpoint's optimizer
    state and data position as if it were the checkpoint's. Raises as ``build_model`` does."""
    from yatt.checkpoint import policy_folder
    from yatt.lora import check_same_base, load_adapters
    from yatt.models import load_model

    folder = policy_folder(resume_from)
    check_adapters_fit(config, resume_from)
    if config.lora_rank:
        load_adapters(model, folder)
        check_same_base(model, folder, config.path)
        return
    trained = load_model(folder, dtype=next(model.parameters()).dtype)
    try:
        model.load_state_dict(trained.state_dict())
    except RuntimeError as error:  # another architecture or shape
        first = " ".join(str(error).split())[:300]
        raise ConfigError(
            f"checkpoint.resume={resume_from}: its weights do not fit the model given ({first})"
        ) from None


def check_adapters_fit(config: ModelConfig, checkpoint: str) -> None:
    """Refuse, in one line (ConfigError), resuming `checkpoint` with other LoRA settings than
    it was trained with: adapters or none, rank and alpha (before any worker starts)."""
    from yatt.checkpoint import policy_folder
    from yatt.lora import read_adapter_meta

    saved = read_adapter_meta(policy_folder(checkpoint))
    if (saved is not None) != bool(config.lora_rank):
        raise ConfigError(
            f"checkpoint.resume={checkpoint} was trained "
            f"{'with' if saved else 'without'} LoRA adapters, and this run has "
            f"model.lora_rank={config.lora_rank}: resume it with the model.lora_* it ran with"
        )
    wanted = (config.lora_rank, config.lora_alpha)
    if saved is not None and (saved["rank"], saved["alpha"]) != wanted:
        raise ConfigError(
            f"checkpoint.resume={checkpoint} has adapters of rank {saved['rank']}, alpha "
            f"{saved['alpha']:g}; this run has model.lora_rank={config.lora_rank}, "
            f"model.lora_alpha={config.lora_alpha:g}: resume it with the settings it ran with"
        )


def adapt_model(model: Any, config: ModelConfig) -> Any:
    """`model` with the adapters `model.lora_rank` asks for (put on once: a caller's own model
    may have them already); returns it."""
    from yatt.lora import adapter_settings, apply_lora, has_lora

    if not config.lora_rank:
        return model
    if not has_lora(model):
        return apply_lora(model, config.lora_rank, config.lora_alpha, config.lora_targets)
    have = adapter_settings(model)
    if (have["rank"], have["alpha"]) != (config.lora_rank, config.lora_alpha):
        raise ConfigError(
            f"the model given has adapters of rank {have['rank']}, alpha {have['alpha']:g}; "
            f"the config asks model.lora_rank={config.lora_rank}, "
            f"model.lora_alpha={config.lora_alpha:g}"
        )
    return model


def build_tokenizer(config: ModelConfig) -> Any:
    """The tokenizer `build_model` would give, without loading the model's weights (a tiny
    model's tokenizer comes with the tiny model)."""
    from yatt.models import load_tokenizer, tiny_model

    if config.path in _TINY_ARCHS:
        return tiny_model(_TINY_ARCHS[config.path], seed=config.tiny_seed)[1]
    return load_tokenizer(config.path)


def build_data(config: DataConfig) -> tuple[list[Any], list[Any]]:
    """(train, heldout) prompt examples from a file (`data.path`) or a task generator."""
    from yatt.data import generate_task, load_prompts, split_heldout

    if config.path:
        examples = load_prompts(config.path)
    else:
        examples = generate_task(config.task, config.n_train + config.n_heldout, config.seed)
    if len(examples) <= config.n_heldout:
        raise ConfigError(
            f"data has {len(examples)} examples, not more than data.n_heldout={config.n_heldout}"
        )
    if config.n_heldout == 0:
        return list(examples), []
    train, heldout = split_heldout(examples, config.n_heldout, config.seed)
    logger.info("data: %d train, %d held-out prompts", len(train), len(heldout))
    return train, heldout
