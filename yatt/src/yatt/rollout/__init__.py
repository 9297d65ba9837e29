"""Rollout: sampling completions from the policy. `RolloutEngine` is yatt's own batched
KV-cache sampler; `HFGenerateEngine` wraps HF `generate` as the reference backend;
`VLLMEngine` runs vLLM where it is installed. All share `SamplingParams` and return
`Completion`s."""

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from yatt.errors import ConfigError
from yatt.rollout.engine import Completion, RolloutEngine
from yatt.rollout.hf import HFGenerateEngine
from yatt.rollout.sampling import SamplingError, SamplingParams
from yatt.rollout.vllm import VLLMEngine

__all__ = [
    "BACKENDS",
    "Completion",
    "HFGenerateEngine",
    "RolloutEngine",
    "SamplingError",
    "SamplingParams",
    "VLLMEngine",
    "make_engine",
]

BACKENDS: dict[str, type] = {"yatt": RolloutEngine, "hf": HFGenerateEngine, "vllm": VLLMEngine}


def make_engine(
    backend: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, **kwargs
) -> RolloutEngine | HFGenerateEngine | VLLMEngine:
    """Build a rollout engine by backend name ("yatt", "hf" or "vllm").

    Raises ConfigError for an unknown name, or for "vllm" when vllm is not installed.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"rollout backend {backend!r} unknown; allowed: {sorted(BACKENDS)}")
    return BACKENDS[backend](model, tokenizer, **kwargs)
