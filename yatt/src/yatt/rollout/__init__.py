"""Rollout: sampling completions from the policy. `RolloutEngine` is yatt's own batched
KV-cache sampler; `HFGenerateEngine` wraps HF `generate` as the reference backend. Both share
`SamplingParams` and return `Completion`s."""

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from yatt.errors import ConfigError
from yatt.rollout.engine import Completion, RolloutEngine
from yatt.rollout.hf import HFGenerateEngine
from yatt.rollout.sampling import SamplingParams

__all__ = [
    "BACKENDS",
    "Completion",
    "HFGenerateEngine",
    "RolloutEngine",
    "SamplingParams",
    "make_engine",
]

BACKENDS: dict[str, type] = {"yatt": RolloutEngine, "hf": HFGenerateEngine}


def make_engine(
    backend: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, **kwargs
) -> RolloutEngine | HFGenerateEngine:
    """Build a rollout engine by backend name ("yatt" or "hf"); raises ConfigError otherwise."""
    if backend not in BACKENDS:
        raise ConfigError(f"rollout backend {backend!r} unknown; allowed: {sorted(BACKENDS)}")
    return BACKENDS[backend](model, tokenizer, **kwargs)
