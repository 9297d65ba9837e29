"""Reference role: the initial policy, frozen, used only for KL log-probs.

The trainer does not build it when the KL coefficient is 0 (no memory, no forward passes).
A policy with LoRA adapters is its own reference with the adapters off: its base weights never
train, so the role shares the policy's module instead of copying it.
"""

import contextlib
import copy

import torch
from torch import Tensor

from yatt.batch import RolloutBatch
from yatt.lora import adapters_off, has_lora
from yatt.roles.base import Role
from yatt.roles.policy import compute_logprobs, logprob_autocast

__all__ = ["ReferenceRole"]


class ReferenceRole(Role):
    """Frozen model; `logprobs(batch)` -> (B, R)."""

    name = "reference"

    def __init__(
        self, model: torch.nn.Module, *, micro_batch_size: int, temperature: float,
        shared_prefix: bool = True, bf16_autocast: bool = False,
    ) -> None:  # fmt: skip
        self.shares_policy = has_lora(model)
        if self.shares_policy:
            self.model = model
        else:
            self.model = copy.deepcopy(model).eval()
            for param in self.model.parameters():
                param.requires_grad_(False)
                param.grad = None
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.shared_prefix = shared_prefix
        self._autocast = logprob_autocast(self.model, bf16_autocast)  # as the policy's

    def logprobs(self, batch: RolloutBatch) -> Tensor:
        """Response log-probs (B, R) under the reference weights."""
        base = adapters_off(self.model) if self.shares_policy else contextlib.nullcontext()
        with base:
            return compute_logprobs(
                self.model,
                batch,
                self.micro_batch_size,
                self.temperature,
                self._autocast,
                shared_prefix=self.shared_prefix,
            )
