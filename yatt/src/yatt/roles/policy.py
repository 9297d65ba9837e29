"""Policy role: the trained model, its AdamW optimizer and LR schedule, log-probs and the update.

The update accumulates gradients over micro-batches with every micro-batch's loss divided by the
normaliser of the whole batch (`loss_normalizer`), so the gradient equals the full-batch one.
Rows whose advantages are all exactly zero carry exactly zero policy gradient when there is no KL
or entropy term in the loss; they are skipped (no forward, no backward) while the normaliser still
counts them, so the result is unchanged (tested in test_roles_policy.py).
When the batch carries behaviour log-probs (a sampler whose numerics differ, e.g. bf16 rollouts),
each token's loss is weighted by min(p_old / p_behaviour, algo.tis_cap), p_old being the fp32
policy's (`old_logp`, or the detached current log-probs for one on-policy pass).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.autograd.graph import increment_version

from yatt.algos.kl import kl_loss
from yatt.algos.losses import (
    aggregate_loss,
    loss_normalizer,
    policy_loss,
    truncated_is_weights,
)
from yatt.batch import RolloutBatch
from yatt.config import AlgoConfig, OptimConfig
from yatt.errors import ModelError
from yatt.roles._forward import (
    checkpoint_layers,
    chunks,
    response_logits,
    shared_prefix_logits,
    token_logprobs_and_entropy,
    trim_columns,
)
from yatt.roles.base import Role

__all__ = ["FiniteSteps", "PolicyRole", "adamw_with_schedule", "lr_lambda", "step_schedule"]

logger = logging.getLogger(__name__)
NONFINITE_STEPS_MAX = 3  # updates in a row whose gradient is not finite before a run stops


class FiniteSteps:
    """Keeps a non-finite gradient out of the weights: an update whose gradient norm is NaN or
    infinite is skipped (gradients zeroed, no optimizer step), as verl's actor does; too many
    such updates in a row mean the loss diverged, and raise."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.in_a_row = 0

    def clip_and_step(
        self, optimizer: torch.optim.Optimizer, params: list[Tensor], grad_clip: float
    ) -> tuple[float, bool]:
        """The gradient norm over `params` (clipped to `grad_clip` when > 0) and whether the
        optimizer stepped; ModelError after NONFINITE_STEPS_MAX skipped updates in a row."""
        grads = [p.grad for p in params if p.grad is not None]
        if grad_clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
        if math.isfinite(grad_norm):
            self.in_a_row = 0
            optimizer.step()
            return grad_norm, True
        self.in_a_row += 1
        if self.in_a_row >= NONFINITE_STEPS_MAX:
            raise ModelError(
                f"{self.name}: the gradient norm was {grad_norm} in {self.in_a_row} updates in "
                "a row (the loss diverged: check the rewards and advantages, lower optim.lr)"
            )
        for grad in grads:
            grad.zero_()
        logger.warning("%s: gradient norm %s, update skipped (%d in a row)",
                       self.name, grad_norm, self.in_a_row)  # fmt: skip
        return grad_norm, False


def step_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Advance the LR schedule one update, whether or not `FiniteSteps` let the optimizer step
    (the schedule counts updates; torch warns when the first one had no optimizer step)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()


def adamw_with_schedule(
    model: torch.nn.Module, optim: Any, lr: float, total_steps: int, *, fused: bool
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `model`'s trainable parameters (LoRA: the adapters) at base rate `lr`,
    `optim`'s betas, eps and weight decay, and its schedule over `total_steps` steps (the
    policy's, the critic's and SFT's optimizers)."""
    params = [param for param in model.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
        weight_decay=optim.weight_decay, fused=fused,
    )  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(optim.schedule, optim.warmup_steps, total_steps)
    )
    return optimizer, scheduler


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int):
    """Multiplier of the base LR at optimizer step s (linear: 1 -> 0 at `total_steps`)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
        progress = min(progress, 1.0)
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def load_optimizer_state(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    state: dict[str, Any],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    role: str = "policy",
) -> None:
    """Load a checkpoint's optimizer and schedule state, keeping this run's settings: the
    moments and the step count come from the checkpoint, lr, betas, eps and
    weight decay from the config (a checkpoint stores its own, which a resume with changed
    settings would silently keep). The LR is this run's schedule at the resumed step."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    wanted = {"initial_lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
    saved = optimizer.param_groups[0]
    changed = [f"{key}={value} (was {saved.get(key)})" for key, value in wanted.items()
               if _plain(saved.get(key)) != _plain(value)]  # fmt: skip
    if changed:
        logger.info("resumed the %s optimizer with this run's %s", role, ", ".join(changed))
    for group in optimizer.param_groups:
        group.update(wanted)
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    step = scheduler.last_epoch
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["lr"] = lr * factor(step)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


class PolicyRole(Role):
    """The trained policy (an HF causal LM), updated in place."""

    name = "policy"

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        algo: AlgoConfig,
        optim: OptimConfig,
        total_updates: int,
        temperature: float = 1.0,
        norm_len: int | None = None,
        bf16_autocast: bool = False,
        shared_prefix: bool = True,
        gradient_checkpointing: bool = False,
    ) -> None:
        """`shared_prefix`: each prompt goes through the model once per group (log-probs and
        updates); `gradient_checkpointing`: the update recomputes each decoder layer in the
        backward pass (`checkpoint_layers`), and its forward runs whole rows."""
        self.model = model
        self.shared_prefix = shared_prefix
        self._update_shares_prefix = shared_prefix and not gradient_checkpointing
        if gradient_checkpointing:
            checkpoint_layers(model)
        self.algo = algo
        self.optim = optim
        self.temperature = temperature
        self.norm_len = norm_len
        self.bf16_autocast = bf16_autocast
        # Set by a data-parallel controller: an object with sum_scalar(float) and
        # sum_grads(params) over the policy ranks; None on a single process.
        self.collective: Any = None
        self.metric_weights: dict[str, float] = {}  # set by each update, see there
        self.finite_steps = FiniteSteps("policy")
        self.optimizer, self.scheduler = adamw_with_schedule(
            model, optim, optim.lr, total_updates, fused=True
        )
        # Gradients live as zero tensors, never None: AdamW skips a None-grad parameter but
        # updates a zero-grad one (momentum), and skipping must not change the result.
        for param in self.optimizer.param_groups[0]["params"]:
            param.grad = torch.zeros_like(param)

    def _autocast(self) -> contextlib.AbstractContextManager:
        return logprob_autocast(self.model, self.bf16_autocast)()

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch) -> Tensor:
        """Log-probs (B, R) of the batch's response tokens under the current weights."""
        return compute_logprobs(
            self.model,
            batch,
            self.algo.micro_batch_size,
            self.temperature,
            self._autocast,
            self.shared_prefix,
        )

    def _trained_rows(self, batch: RolloutBatch) -> list[int]:
        needs_every_row = (self.algo.kl_coef > 0 and not self.algo.kl_in_reward) or (
            self.algo.entropy_coef != 0
        )
        if needs_every_row or not self.algo.skip_zero_adv:
            return list(range(batch.size))
        assert batch.advantages is not None
        nonzero = (batch.advantages * batch.response_mask).abs().sum(dim=1) > 0  # (B,)
        return nonzero.nonzero().flatten().tolist()

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """`algo.ppo_passes` optimizer steps on the batch; returns actor/* metrics.

        Needs batch.advantages; uses batch.old_logp when set (else the detached current
        log-probs: exact for one on-policy pass) and batch.ref_logp for a KL loss term.
        """
        batch.check("advantages")
        mask = batch.response_mask
        trained = self._trained_rows(batch)
        # What this update's metrics are means over, for a reduction across data-parallel
        # ranks (yatt.control.shards.reduce_actor_metrics).
        self.metric_weights = {
            "tokens": float(mask.sum()),
            "rows": float(batch.size),
            "trained_tokens": float(mask[trained].sum()) if trained else 0.0,
        }
        # The mask and advantages stay put over the passes: one normaliser (one collective
        # round on data-parallel ranks) and one set of trained rows per update.
        if self.collective is None:
            normalizer = loss_normalizer(mask, self.algo.loss_agg, self.norm_len)
        else:  # every rank divides by the global batch's normaliser, floored once summed
            local = loss_normalizer(mask, self.algo.loss_agg, self.norm_len, least=0.0)
            normalizer = max(self.collective.sum_scalar(local), 1.0)
        self.model.train()
        totals: dict[str, float] = {}
        for _ in range(self.algo.ppo_passes):
            totals, stepped = self._one_pass(batch, normalizer, trained)
            if not stepped:  # the later passes would see the same gradient: the update ends
                break
        step_schedule(self.scheduler)
        self.model.eval()
        return totals

    def _one_pass(
        self, batch: RolloutBatch, normalizer: float, rows: list[int]
    ) -> tuple[dict[str, float], bool]:
        """One optimizer step over the batch's trained ``rows``, each micro-batch's loss over
        ``normalizer``: its metrics, and whether the step was taken."""
        mask = batch.response_mask
        total_tokens = max(float(mask.sum()), 1.0)
        trained_tokens = max(float(mask[rows].sum()), 1.0)
        # Reported key -> (micro-step metric, tokens it is a mean over): clip metrics count the
        # skipped rows (ratio 1); importance weights exist only on trained rows (if any).
        weighted = {"actor/clipfrac": ("actor/pg_clipfrac", total_tokens),
                    "actor/ppo_kl": ("actor/ppo_kl", total_tokens)}  # fmt: skip
        if self.algo.dual_clip:  # the share of tokens the dual clip capped
            weighted["actor/clipfrac_lower"] = ("actor/pg_clipfrac_lower", total_tokens)
        if batch.behaviour_logp is not None:  # 0 with no trained row: every rank, same keys
            for key in ("actor/tis_mean", "actor/tis_capped_frac"):
                weighted[key] = (key, trained_tokens)
        sums = {"actor/pg_loss": 0.0, **dict.fromkeys(weighted, 0.0)}
        for param_group in self.optimizer.param_groups:
            for param in param_group["params"]:
                param.grad.zero_()
        for micro_rows in chunks(rows, self.algo.micro_batch_size):
            micro = batch.select(micro_rows).to(self.device)
            micro_metrics = self._micro_step(micro, normalizer)
            micro_tokens = float(batch.response_mask[micro_rows].sum())
            sums["actor/pg_loss"] += micro_metrics["pg_loss"]
            for key, (source, tokens) in weighted.items():
                sums[key] += micro_metrics[source] * micro_tokens / tokens
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.collective is not None:
            self.collective.sum_grads(params)
        sums["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        sums["actor/trained_rows_frac"] = len(rows) / max(batch.size, 1)
        grad_norm, stepped = self.finite_steps.clip_and_step(
            self.optimizer, params, self.optim.grad_clip
        )
        sums["actor/grad_norm"] = grad_norm
        if not stepped:
            return sums, False
        # The fused AdamW kernel writes the weights without bumping their autograd version
        # counters; a rollout engine sharing this module detects weight changes by them.
        increment_version(params)
        return sums, True

    def probe_pass(self, batch: RolloutBatch) -> None:
        """An update's forward and backward passes over every row of `batch` (advantages
        set), with no optimizer step, the gradients zeroed after: the policy is left as it
        was. A timing probe (runtime re-placement's, see `RankWorker.update_scaling`)."""
        batch.check("advantages")
        normalizer = loss_normalizer(batch.response_mask, self.algo.loss_agg, self.norm_len)
        self.model.train()
        try:
            for micro_rows in chunks(list(range(batch.size)), self.algo.micro_batch_size):
                self._micro_step(batch.select(micro_rows).to(self.device), normalizer)
        finally:
            self.model.eval()
            for param_group in self.optimizer.param_groups:
                for param in param_group["params"]:
                    param.grad.zero_()

    def _micro_step(self, micro: RolloutBatch, normalizer: float) -> dict[str, float]:
        ids, attention, mask, prompt_width = trim_columns(
            micro.input_ids, micro.attention_mask, micro.response_mask, micro.prompt_width
        )
        width = mask.shape[1]
        with self._autocast():
            logits = _logits(
                self.model, ids, attention, prompt_width, micro.group_ids,
                self._update_shares_prefix,
            )  # fmt: skip
        logp, _ = token_logprobs_and_entropy(logits, ids[:, prompt_width:], self.temperature, False)
        old_logp = logp.detach() if micro.old_logp is None else micro.old_logp[:, :width]
        assert micro.advantages is not None
        is_weights, is_metrics = None, {}
        if micro.behaviour_logp is not None:
            is_weights, is_metrics = truncated_is_weights(
                old_logp, micro.behaviour_logp[:, :width], mask, self.algo.tis_cap
            )
        loss, metrics = policy_loss(
            logp, old_logp, micro.advantages[:, :width], mask,
            clip_low=self.algo.clip_low, clip_high=self.algo.clip_high,
            dual_clip=self.algo.dual_clip or None, agg=self.algo.loss_agg,
            normalizer=normalizer, norm_len=self.norm_len, is_weights=is_weights,
        )  # fmt: skip
        metrics.update(is_metrics)
        metrics["pg_loss"] = float(loss.detach())
        if self.algo.kl_coef > 0 and not self.algo.kl_in_reward:
            assert micro.ref_logp is not None, "KL loss needs reference log-probs"
            loss = loss + self.algo.kl_coef * kl_loss(
                logp, micro.ref_logp[:, :width], mask, kind=self.algo.kl_kind,
                agg=self.algo.loss_agg, normalizer=normalizer,
            )  # fmt: skip
        if self.algo.entropy_coef != 0:
            entropy = _entropy_with_grad(logits, self.temperature)
            loss = loss - self.algo.entropy_coef * aggregate_loss(
                entropy, mask, self.algo.loss_agg, normalizer=normalizer, norm_len=self.norm_len
            )
        loss.backward()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        optim = self.optim
        load_optimizer_state(
            self.optimizer, self.scheduler, state, lr=optim.lr, betas=(optim.beta1, optim.beta2),
            eps=optim.eps, weight_decay=optim.weight_decay,
        )  # fmt: skip

    def save_pretrained(self, folder: Path, tokenizer: Any) -> Path:
        """Weights + tokenizer as a safetensors folder `from_pretrained` reads."""
        from yatt.models import save_checkpoint

        return save_checkpoint(self.model, tokenizer, folder)


def _entropy_with_grad(logits: Tensor, temperature: float) -> Tensor:
    """Per-token entropy (B, R) of the distribution the sampler draws from, softmax(logits /
    temperature), the one the log-probs score, with gradient (only built when entropy_coef
    != 0); the loss aggregates it as it does the policy-gradient term."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def _logits(
    model, ids: Tensor, attention: Tensor, prompt_width: int, group_ids: Tensor, shared_prefix: bool
) -> Tensor:
    if shared_prefix:
        return shared_prefix_logits(model, ids, attention, prompt_width, group_ids)
    return response_logits(model, ids, attention, prompt_width)


def logprob_autocast(model: torch.nn.Module, bf16: bool) -> Any:
    """``compute_logprobs``' ``autocast``: bf16 autocast on the device the model is on when
    the call runs (colocation moves it), or none. The policy, the reference and the sampler's
    behaviour log-probs all take the same one, so the log-probs a KL or a ratio compares come
    from the same arithmetic (fp32 beside bf16 made a KL of rounding noise at step 0)."""
    if not bf16:
        return contextlib.nullcontext

    def autocast() -> contextlib.AbstractContextManager:
        device_type = next(model.parameters()).device.type
        return torch.autocast(device_type, dtype=torch.bfloat16)

    return autocast


def compute_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    micro_batch_size: int,
    temperature: float,
    autocast: Any = contextlib.nullcontext,
    shared_prefix: bool = True,
) -> Tensor:
    """Response log-probs (B, R) under `model`, micro-batched, without gradient; 0 on padding."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    device = next(model.parameters()).device
    for rows in chunks(list(range(batch.size)), micro_batch_size):
        micro = batch.select(rows).to(device)
        ids, attention, mask, prompt_width = trim_columns(
            micro.input_ids, micro.attention_mask, micro.response_mask, micro.prompt_width
        )
        with torch.no_grad(), autocast():
            logits = _logits(model, ids, attention, prompt_width, micro.group_ids, shared_prefix)
        logp, _ = token_logprobs_and_entropy(logits, ids[:, prompt_width:], temperature, False)
        out[rows, : mask.shape[1]] = (logp.float() * mask).cpu()
    return out
