"""Policy (PPO clip / clip-higher / dual-clip), value, SFT, Bradley–Terry and preference (DPO,
conservative and robust DPO, SLiC hinge, IPO) losses, plus the loss aggregation modes and the
DAPO overlong penalty (pure torch).

Shapes: B rows, T response positions, mask (B, T) marks valid tokens. Every aggregation is
`numerator / normaliser`; pass the normaliser of the whole mini-batch (`loss_normalizer`) to each
micro-batch and sum the micro-batch losses to get exactly the full-batch loss and gradient.
References: PPO (Schulman et al. 2017), dual-clip (Ye et al. 2020), DAPO (Yu et al. 2025),
Dr. GRPO (Liu et al. 2025), truncated importance sampling for a sampler whose numerics differ
from the trainer's (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
RL training").
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from yatt.algos._masked import masked_mean, masked_sum
from yatt.errors import ConfigError

__all__ = [
    "AGG_MODES",
    "DPO_LOSSES",
    "aggregate_loss",
    "bradley_terry_loss",
    "dpo_loss",
    "loss_normalizer",
    "overlong_penalty",
    "policy_loss",
    "sft_loss",
    "truncated_is_weights",
    "value_loss",
]

# mode -> what the per-token loss matrix is divided by (B' = rows with at least one valid token):
#   token_mean:           sum of loss over valid tokens / number of valid tokens in the batch
#   seq_mean_token_sum:   sum over rows of (sum of the row's token losses)  / B'
#   seq_mean_token_mean:  sum over rows of (mean of the row's token losses) / B'
#   token_sum_norm:       sum of loss over valid tokens / (B' * norm_len), norm_len defaults to T
#                         (Dr. GRPO: a constant, so long and short answers weigh alike per token)
AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "token_sum_norm")


def _check_agg(agg: str) -> None:
    if agg not in AGG_MODES:
        raise ConfigError(f"unknown loss aggregation {agg!r}; valid: {list(AGG_MODES)}")


def loss_normalizer(
    mask: Tensor, agg: str, norm_len: int | None = None, *, least: float = 1.0
) -> float:
    """The denominator `aggregate_loss` uses for this mask (B, T) and mode (see AGG_MODES).

    Compute it once on the full mini-batch and pass it to every micro-batch's loss call. Its
    token or row count is at least `least`; a data-parallel rank passes 0 and floors the sum
    over ranks at 1 instead, so a rank with nothing to train adds nothing to the global count
    (the floors differ only when no rank has a token, where every loss is 0 anyway).
    """
    _check_agg(agg)
    if agg == "token_mean":
        return max(float(mask.sum()), least)
    rows = max(float(mask.bool().any(dim=-1).sum()), least)
    if agg == "token_sum_norm":
        return rows * float(norm_len if norm_len is not None else mask.shape[-1])
    return rows


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    agg: str = "token_mean",
    *,
    normalizer: float | None = None,
    norm_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar by mode `agg` (see AGG_MODES).

    normalizer: denominator override (the full mini-batch's `loss_normalizer` when micro-batching).
    Raises ConfigError for an unknown mode.
    """
    _check_agg(agg)
    if agg in ("token_mean", "token_sum_norm"):
        numerator = masked_sum(loss_mat, mask)
    elif agg == "seq_mean_token_sum":
        numerator = masked_sum(loss_mat, mask, dim=-1).sum()
    else:
        numerator = masked_mean(loss_mat, mask, dim=-1).sum()
    if normalizer is None:
        normalizer = loss_normalizer(mask, agg, norm_len)
    return numerator / normalizer


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token_mean",
    normalizer: float | None = None,
    norm_len: int | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate low/high clip (DAPO clip-higher) -> (loss, metrics).

    Per token: ratio = exp(logp - old_logp); loss = max(-A ratio, -A clip(ratio, 1-clip_low,
    1+clip_high)); with dual_clip = c > 1 the loss of tokens with A < 0 is capped at -A c;
    `is_weights` (B, T), constants (e.g. `truncated_is_weights`), multiply each token's loss.
    All of logp, old_logp, advantages, mask are (B, T). Metrics: actor/pg_clipfrac (tokens where
    the clipped branch is active), actor/pg_clipfrac_lower (dual clip active), actor/ppo_kl
    (mean old_logp - logp), actor/ratio_mean.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip must be > 1.0 (or None), got {dual_clip}")
    assert logp.shape == old_logp.shape == advantages.shape == mask.shape, (
        f"shapes {logp.shape} {old_logp.shape} {advantages.shape} {mask.shape}"
    )
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # exp overflow guard
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_active = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, cap), loss_mat)
    if is_weights is not None:
        assert is_weights.shape == mask.shape, f"is_weights {is_weights.shape} != {mask.shape}"
        assert not is_weights.requires_grad, "importance weights must be constants"
        loss_mat = loss_mat * is_weights
    loss = aggregate_loss(loss_mat, mask, agg, normalizer=normalizer, norm_len=norm_len)
    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
            "actor/pg_clipfrac_lower": float(masked_mean(dual_active.float(), mask)),
            "actor/ppo_kl": float(masked_mean(-log_ratio, mask)),
            "actor/ratio_mean": float(masked_mean(ratio, mask)),
        }
    return loss, metrics


def truncated_is_weights(
    old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance-sampling weights min(p_old / p_behaviour, cap) -> (weights, metrics).

    old_logp: (B, T) log-probs of the sampled tokens under the trainer's (fp32) old policy;
    behaviour_logp: (B, T) under the distribution that actually sampled them (e.g. bf16 weights).
    Weights are detached and 0 on padding. Metrics: actor/tis_mean (mean weight over valid
    tokens), actor/tis_capped_frac (tokens whose weight was capped).
    Raises ConfigError for cap < 1.
    """
    if not cap >= 1.0:
        raise ConfigError(f"importance-sampling cap must be >= 1, got {cap}")
    assert old_logp.shape == behaviour_logp.shape == mask.shape, (
        f"shapes {old_logp.shape} {behaviour_logp.shape} {mask.shape}"
    )
    with torch.no_grad():
        log_ratio = (old_logp - behaviour_logp).clamp(max=math.log(cap))  # exp overflow guard
        weights = torch.exp(log_ratio) * mask.to(log_ratio.dtype)
        metrics = {
            "actor/tis_mean": float(masked_mean(weights, mask)),
            "actor/tis_capped_frac": float(masked_mean((log_ratio >= math.log(cap)).float(), mask)),
        }
    return weights, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token_mean",
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss 0.5 max((V - R)^2, (V_clip - R)^2) -> (loss, metrics); all (B, T).

    V_clip = old_values + clamp(values - old_values, -clip, clip); clip None disables clipping.
    Metrics: critic/vf_loss, critic/vf_clipfrac (tokens where the clipped error is larger).
    """
    error = (values - returns) ** 2
    if clip is None:
        loss_mat = 0.5 * error
        clipfrac = torch.zeros((), device=values.device)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped_error = (clipped_values - returns) ** 2
        loss_mat = 0.5 * torch.maximum(error, clipped_error)
        clipfrac = masked_mean((clipped_error > error).float(), mask)
    loss = aggregate_loss(loss_mat, mask, agg, normalizer=normalizer)
    return loss, {"critic/vf_loss": float(loss.detach()), "critic/vf_clipfrac": float(clipfrac)}


def sft_loss(
    token_logp: Tensor,
    mask: Tensor,
    *,
    agg: str = "token_mean",
    normalizer: float | None = None,
) -> Tensor:
    """Masked negative log-likelihood of target tokens.

    token_logp: (B, T) log-prob of each target token (`token_logprobs` output); mask (B, T) is 1
    on the tokens to learn (the response), 0 on prompt and padding.
    """
    return aggregate_loss(-token_logp, mask, agg, normalizer=normalizer)


def bradley_terry_loss(
    chosen_scores: Tensor, rejected_scores: Tensor, margin: Tensor | None = None
) -> Tensor:
    """Bradley–Terry loss mean(-log sigmoid(s_chosen - s_rejected - margin)); inputs (N,)."""
    assert chosen_scores.shape == rejected_scores.shape, (
        f"{chosen_scores.shape} != {rejected_scores.shape}"
    )
    difference = chosen_scores - rejected_scores
    if margin is not None:
        difference = difference - margin
    return -F.logsigmoid(difference).mean()


DPO_LOSSES = ("sigmoid", "hinge", "ipo", "robust")


def dpo_loss(
    chosen_logp: Tensor,
    rejected_logp: Tensor,
    ref_chosen_logp: Tensor,
    ref_rejected_logp: Tensor,
    beta: float,
    kind: str = "sigmoid",
    label_smoothing: float = 0.0,
    lengths: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """A preference loss over the log-ratios h = (log pi - log pi_ref)(chosen) - (...)(rejected),
    from sequence log-probs (N,) under the policy and the reference; the mean over pairs.

    `kind`: "sigmoid", DPO's Bradley-Terry loss -log sigmoid(beta h) (Rafailov et al. 2023),
    with `label_smoothing` e > 0 the conservative DPO that takes each label to be wrong with
    probability e: -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h); "robust", the
    unbiased loss under such label noise, (-(1 - e) log sigmoid(beta h) + e log sigmoid(-beta
    h)) / (1 - 2e) (Chowdhury et al. 2024); "hinge", SLiC's max(0, 1 - beta h) (Zhao et al.
    2023); "ipo", IPO's (h' - 1 / (2 beta))^2 (Azar et al. 2023), h' with each response's
    log-ratio divided by its token count (`lengths`: the chosen and rejected counts, (N,)
    each), as TRL computes it. Returns (loss, the chosen implicit rewards beta * (log pi - log
    pi_ref), the rejected ones), the rewards detached.
    """
    if kind not in DPO_LOSSES:
        raise ConfigError(f"unknown DPO loss {kind!r}: one of {DPO_LOSSES}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ConfigError(f"DPO label smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_ratio = chosen_logp - ref_chosen_logp
    rejected_ratio = rejected_logp - ref_rejected_logp
    logits = beta * (chosen_ratio - rejected_ratio)
    if kind == "hinge":
        losses = torch.relu(1.0 - logits)
    elif kind == "ipo":
        if lengths is None:
            raise ValueError("the ipo loss needs the responses' token counts (lengths)")
        chosen_tokens, rejected_tokens = (n.to(chosen_ratio.dtype).clamp(min=1) for n in lengths)
        per_token = chosen_ratio / chosen_tokens - rejected_ratio / rejected_tokens
        losses = (per_token - 1.0 / (2.0 * beta)) ** 2
    else:
        right, wrong = -F.logsigmoid(logits), -F.logsigmoid(-logits)
        if kind == "robust":
            losses = ((1.0 - label_smoothing) * right - label_smoothing * wrong) / (
                1.0 - 2.0 * label_smoothing
            )
        else:
            losses = (1.0 - label_smoothing) * right + label_smoothing * wrong
    return losses.mean(), beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, penalty: float) -> Tensor:
    """DAPO soft overlong punishment -> (B,) rewards to add (<= 0).

    lengths: (B,) response lengths in tokens. 0 up to max_len - buffer_len, then falls linearly
    to -penalty at max_len, and -penalty beyond it.
    """
    if not 0 < buffer_len <= max_len:
        raise ConfigError(f"overlong buffer_len must be in (0, {max_len}], got {buffer_len}")
    if penalty < 0:
        raise ConfigError(f"overlong penalty must be >= 0, got {penalty}")
    start = max_len - buffer_len
    excess = (lengths.to(torch.float32) - start).clamp(min=0.0)
    return -(excess / buffer_len).clamp(max=1.0) * penalty
