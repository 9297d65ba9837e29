"""KL estimators between the policy and a frozen reference, and the two ways to use them:
as a loss term or as a per-token reward penalty (pure torch).

Samples come from the policy; with log r = ref_logp - logp per token (Schulman, "Approximating
KL divergence", 2020): k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (unbiased, >= 0,
low variance). "low_var_kl" is k3 clamped to [0, 10] as verl does. Shapes: (B, T).
"""

from collections.abc import Callable

import torch
from torch import Tensor

from yatt.algos._masked import place_on_last_token
from yatt.algos.losses import aggregate_loss
from yatt.errors import ConfigError

__all__ = ["KL_ESTIMATORS", "kl_estimate", "kl_loss", "kl_mean", "kl_penalty_token_rewards"]


def _k1(log_ratio: Tensor) -> Tensor:
    return -log_ratio


def _k2(log_ratio: Tensor) -> Tensor:
    return 0.5 * log_ratio * log_ratio


def _k3(log_ratio: Tensor) -> Tensor:
    # clamp before exp so a far-off token gives a large finite value, not inf
    log_ratio = log_ratio.clamp(-20.0, 20.0)
    return torch.exp(log_ratio) - 1.0 - log_ratio


def _low_var_kl(log_ratio: Tensor) -> Tensor:
    return _k3(log_ratio).clamp(0.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "low_var_kl": _low_var_kl,
}


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(policy || reference) estimate (B, T) from sampled-token log-probs (B, T).

    Raises ConfigError for an unknown kind (valid: KL_ESTIMATORS).
    """
    if kind not in KL_ESTIMATORS:
        raise ConfigError(f"unknown KL estimator {kind!r}; valid: {sorted(KL_ESTIMATORS)}")
    assert logp.shape == ref_logp.shape, f"{logp.shape} != {ref_logp.shape}"
    return KL_ESTIMATORS[kind](ref_logp - logp)


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    *,
    kind: str = "low_var_kl",
    agg: str = "token_mean",
    normalizer: float | None = None,
) -> Tensor:
    """KL as a loss term: aggregated `kl_estimate` over valid tokens (add coef * this to the loss).

    Gradients flow through logp; ref_logp should be detached (it comes from a frozen model).
    """
    return aggregate_loss(kl_estimate(logp, ref_logp, kind), mask, agg, normalizer=normalizer)


def kl_penalty_token_rewards(
    rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    *,
    coef: float,
    kind: str = "k1",
) -> Tensor:
    """KL as a reward penalty -> token rewards (B, T) for reinforce_pp / gae.

    token_reward_t = -coef * KL_t on each valid token, plus the sequence reward (B,) on the last
    valid token. Computed without gradient (rewards are constants for the update).
    """
    with torch.no_grad():
        penalty = -coef * kl_estimate(logp, ref_logp, kind) * mask.to(logp.dtype)
        return penalty + place_on_last_token(rewards.to(logp.dtype), mask)


def kl_mean(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> float:
    """The mean k3 estimate of KL(policy || reference) over the tokens of `mask` (the
    `actor/kl` metric; `low_var_kl` clamps the same estimate)."""
    log_ratio = ref_logp - logp
    values = torch.exp(log_ratio) - 1 - log_ratio
    return float((values * mask).sum() / mask.sum().clamp(min=1))
