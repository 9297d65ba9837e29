"""Rollout role: wraps a RolloutEngine and turns completions into a RolloutBatch.

When the engine samples from the policy's own module (in-process colocation), weight sync is a
no-op; it is still timed so placements can be compared. With `rollout.dtype: bfloat16` the engine
samples with bf16 copies of the policy's weights (rebuilt whenever a parameter changed) and the
batch carries the sampler's log-probs as `behaviour_logp`, for the policy's importance weights.
"""

from __future__ import annotations

from typing import Any

import torch

from yatt.batch import RolloutBatch
from yatt.config import RolloutConfig
from yatt.lora import trained_state
from yatt.roles.base import Role

__all__ = ["RolloutRole"]

_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # None: the model's own weights


class RolloutRole(Role):
    """Samples `n_samples` completions per prompt with per-request seeds."""

    name = "rollout"

    def __init__(self, engine: Any, tokenizer: Any, config: RolloutConfig) -> None:
        from yatt.rollout import SamplingParams

        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.params = SamplingParams(
            max_new_tokens=config.max_new_tokens, temperature=config.temperature,
            top_p=config.top_p, top_k=config.top_k, stop=tuple(config.stop),
            ignore_eos=config.ignore_eos,
        )  # fmt: skip
        self.last_entropy_estimate = float("nan")

    @classmethod
    def build(cls, model: torch.nn.Module, tokenizer: Any, config: RolloutConfig) -> RolloutRole:
        """The role over a `config.backend` engine sampling `model` in `config.dtype`."""
        from yatt.rollout import make_engine

        dtype = _DTYPES[config.dtype]
        kwargs = {} if dtype is None else {"dtype": dtype}  # only the yatt backend takes a dtype
        return cls(make_engine(config.backend, model, tokenizer, **kwargs), tokenizer, config)

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of rendered prompt texts (the chat template already added its tokens)."""
        return [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]

    def generate(
        self, prompts: list[str], rows: list[dict], group_ids: list[int], seeds: list[int],
        sampler_logprobs: bool = False,
    ) -> RolloutBatch:  # fmt: skip
        """`n_samples` completions for each prompt; row i*n+j is sample j of prompt i.

        seeds: one per output row (B = len(prompts) * n_samples).
        sampler_logprobs: carry the engine's log-probs as `behaviour_logp` even when sampling
            is on-policy (async controllers use them as the behaviour policy's log-probs).
        """
        n_samples = self.config.n_samples
        assert len(prompts) == len(rows) == len(group_ids), "prompts/rows/group_ids differ"
        assert len(seeds) == len(prompts) * n_samples, f"{len(seeds)} seeds for {len(prompts)}"
        prompt_ids = [ids for ids in self.encode(prompts) for _ in range(n_samples)]
        completions = self.engine.generate(prompt_ids, self.params, seeds=seeds)
        assert len(completions) == len(prompt_ids), f"{len(completions)} != {len(prompt_ids)}"
        logprobs = [lp for c in completions for lp in c.logprobs]
        # -E[log p(sampled token)] is an unbiased estimate of the sampling entropy per token.
        self.last_entropy_estimate = -sum(logprobs) / max(len(logprobs), 1)
        batch = RolloutBatch.from_token_lists(prompt_ids, [c.token_ids for c in completions])
        batch.group_ids = torch.tensor([g for g in group_ids for _ in range(n_samples)])
        batch.prompts = [p for p in prompts for _ in range(n_samples)]
        batch.rows = [r for r in rows for _ in range(n_samples)]
        batch.completions = [c.text for c in completions]
        batch.finish_reasons = [c.finish_reason for c in completions]
        if self.config.samples_off_policy or sampler_logprobs:
            batch.behaviour_logp = _padded([c.logprobs for c in completions], batch.response_width)
        return batch.check()

    def sync_weights(self, policy_model: torch.nn.Module) -> None:
        """Copy the policy's weights into the engine (a no-op when it samples the module)."""
        if self.engine.shares_weights(policy_model):
            return
        self.engine.load_state_dict(trained_state(policy_model))  # LoRA: adapters alone


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    """Per-token values of each row, right-padded with 0 to (B, width) float32."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for index, values in enumerate(rows):
        assert len(values) <= width, f"row {index}: {len(values)} values > width {width}"
        out[index, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out
