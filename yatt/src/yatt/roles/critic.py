"""Critic role (PPO): a ScalarHeadModel giving a value per response token, trained on returns.

Value t is read at column P+t-1, the state just before response token t is sampled, so values
align with the response log-probs (B, R).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from yatt.algos.losses import loss_normalizer, value_loss
from yatt.batch import RolloutBatch
from yatt.config import AlgoConfig, OptimConfig
from yatt.roles._forward import checkpoint_layers, chunks, trim_columns
from yatt.roles.base import Role
from yatt.roles.policy import (
    FiniteSteps,
    adamw_with_schedule,
    load_optimizer_state,
    step_schedule,
)

__all__ = ["CriticRole"]


class CriticRole(Role):
    """Values (B, R) and a clipped value-loss update with its own AdamW (``optim.critic_lr``,
    the other ``optim.*`` settings shared with the policy)."""

    name = "critic"

    def __init__(
        self, model: Any, *, algo: AlgoConfig, optim: OptimConfig, total_updates: int,
        norm_len: int | None = None, gradient_checkpointing: bool = False,
        shared_prefix: bool = True,
    ) -> None:  # fmt: skip
        """``norm_len``: the response budget ``token_sum_norm`` divides by, as the policy's
        (None: the batch's widest response, which changes the loss scale step by step);
        ``gradient_checkpointing``: the update recomputes each backbone layer in the backward
        pass (``checkpoint_layers``), whole rows, as HF drops a cache passed to a checkpointed
        layer; ``shared_prefix``: each prompt runs once per group (``shared_prefix_values``) in
        the values pass and, without checkpointing, in the update."""
        self.model = model
        self.shared_prefix = shared_prefix
        self._update_shares_prefix = shared_prefix and not gradient_checkpointing
        if gradient_checkpointing:
            checkpoint_layers(model.backbone)
        self.algo = algo
        self.optim = optim
        self.norm_len = norm_len
        self.finite_steps = FiniteSteps("critic")
        self.optimizer, self.scheduler = adamw_with_schedule(
            model, optim, optim.critic_lr, total_updates, fused=False
        )

    @classmethod
    def from_policy(cls, policy_model: torch.nn.Module, **kwargs: Any) -> CriticRole:
        """A critic whose backbone starts as a copy of the policy's decoder, with a new head
        (a policy's LoRA adapters merged: the critic trains its whole backbone)."""
        from yatt.heads import ScalarHeadModel
        from yatt.lora import plain_copy

        return cls(ScalarHeadModel.from_causal_lm(plain_copy(policy_model)), **kwargs)

    def _values(self, micro: RolloutBatch, shared: bool) -> tuple[Tensor, Tensor]:
        ids, attention, mask, prompt_width = trim_columns(
            micro.input_ids, micro.attention_mask, micro.response_mask, micro.prompt_width
        )
        width = mask.shape[1]
        if shared and micro.group_ids is not None:
            return self.model.shared_prefix_values(
                ids, attention, prompt_width, micro.group_ids
            ), mask
        scalars = self.model(ids, attention)  # (b, W)
        return scalars[:, prompt_width - 1 : prompt_width - 1 + width], mask

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> Tensor:
        """Values (B, R) of the states before each response token; 0 on padding."""
        self.model.eval()
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        for rows in chunks(list(range(batch.size)), self.algo.micro_batch_size):
            values, mask = self._values(batch.select(rows).to(self.device), self.shared_prefix)
            out[rows, : mask.shape[1]] = (values.float() * mask).cpu()
        return out

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """`algo.ppo_passes` steps of the clipped value loss; returns critic/* metrics."""
        batch.check("values", "returns")
        self.model.train()
        normalizer = loss_normalizer(batch.response_mask, self.algo.loss_agg, self.norm_len)
        metrics: dict[str, float] = {}
        for _ in range(self.algo.ppo_passes):
            self.optimizer.zero_grad(set_to_none=False)
            total = 0.0
            for rows in chunks(list(range(batch.size)), self.algo.micro_batch_size):
                micro = batch.select(rows).to(self.device)
                values, mask = self._values(micro, self._update_shares_prefix)
                width = mask.shape[1]
                loss, _ = value_loss(
                    values, micro.values[:, :width], micro.returns[:, :width], mask,
                    clip=self.algo.value_clip, agg=self.algo.loss_agg, normalizer=normalizer,
                )  # fmt: skip
                loss.backward()
                total += float(loss.detach())
            params = [p for p in self.model.parameters() if p.requires_grad]
            _, stepped = self.finite_steps.clip_and_step(
                self.optimizer, params, self.optim.grad_clip
            )
            metrics = {"critic/vf_loss": total}
            if not stepped:  # the later passes would see the same gradient
                break
        step_schedule(self.scheduler)
        self.model.eval()
        mask = batch.response_mask
        metrics["critic/values/mean"] = float((batch.values * mask).sum() / mask.sum().clamp(min=1))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        optim = self.optim
        load_optimizer_state(
            self.optimizer, self.scheduler, state, lr=optim.critic_lr,
            betas=(optim.beta1, optim.beta2), eps=optim.eps, weight_decay=optim.weight_decay,
            role="critic",
        )  # fmt: skip

    def save_pretrained(self, folder: Path) -> Path:
        return self.model.save(folder)

    def load_pretrained(self, folder: Path) -> None:
        """Load weights saved by `save_pretrained` into this critic in place."""
        from yatt.heads import ScalarHeadModel

        loaded = ScalarHeadModel.from_pretrained(folder)
        self.model.load_state_dict(loaded.state_dict())
