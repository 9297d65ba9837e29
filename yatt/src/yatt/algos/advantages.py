"""Advantage estimators: GRPO, RLOO, REINFORCE++ and GAE, behind one registry (pure torch).

Shapes: B rows (one sampled response each), T response positions. `rewards` (B,) are sequence
rewards; `group_ids` (B,) int say which rows answer the same prompt; `mask` (B, T) marks valid
response tokens. Every estimator returns `(advantages (B, T), returns (B, T) | None)`, 0 on padding.
References: GRPO (Shao et al. 2024), RLOO (Ahmadian et al. 2024), REINFORCE++ (Hu 2025),
GAE (Schulman et al. 2016), DAPO dynamic sampling (Yu et al. 2025).
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from yatt.algos._masked import masked_whiten, place_on_last_token
from yatt.errors import ConfigError

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "compute_advantages",
    "dynamic_sampling_mask",
    "group_all_equal",
    "signal_of",
    "without_signal",
]

AdvantageFn = Callable[..., tuple[Tensor, Tensor | None]]


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row statistics of the row's group -> (reward - group mean, count, unbiased
    variance), each (B,).

    Two passes (mean, then squared deviations) keep float32 accurate; no float64, so the
    functions also run on devices without it. Rewards are first taken relative to their
    group's least, so a group whose rewards are all equal has deviations of exactly 0: a
    float32 mean of equal values can miss them by an ulp, which GRPO's division by a std of
    the same size would blow up to an advantage near +-1 on every row.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    zeros = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device)
    counts = zeros.index_add(0, inverse, torch.ones_like(rewards))
    least = torch.full_like(zeros, torch.inf).scatter_reduce(0, inverse, rewards, "amin")
    shifted = rewards - least[inverse]
    deviations = shifted - (zeros.index_add(0, inverse, shifted) / counts)[inverse]
    variances = zeros.index_add(0, inverse, deviations**2) / (counts - 1.0).clamp(min=1.0)
    return deviations, counts[inverse], variances[inverse]


def _broadcast(per_row: Tensor, mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    """Spread a (B,) advantage over the valid tokens of a (B, T) mask -> (B, T) (or (B, 1))."""
    per_row = per_row.to(dtype)
    if mask is None:
        return per_row[:, None]
    return per_row[:, None] * mask.to(dtype)


def _grpo(rewards, group_ids, mask, norm_std, eps, **_unused):
    """GRPO: A_i = (r_i - mean_group) / (std_group + eps), std unbiased; 0 for 1-row groups."""
    deviation, count, variance = _group_stats(rewards, group_ids)
    advantage = deviation
    if norm_std:
        advantage = advantage / (variance.sqrt() + eps)
    advantage = torch.where(count > 1, advantage, 0.0)
    return _broadcast(advantage, mask, rewards.dtype), None


def _rloo(rewards, group_ids, mask, **_unused):
    """RLOO: A_i = r_i - mean of the other rows of its group = n / (n - 1) (r_i - mean_group);
    0 for 1-row groups; no std normalisation."""
    deviation, count, _ = _group_stats(rewards, group_ids)
    advantage = count / (count - 1.0).clamp(min=1.0) * deviation
    advantage = torch.where(count > 1, advantage, 0.0)
    return _broadcast(advantage, mask, rewards.dtype), None


def _discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t'} where t' is the next valid token; 0 on padding. (B, T)."""
    valid = mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])  # (B,)
    for t in reversed(range(token_rewards.shape[1])):
        updated = token_rewards[:, t] + gamma * running
        running = torch.where(valid[:, t] > 0, updated, running)
        returns[:, t] = running * valid[:, t]
    return returns


def _token_rewards_or_last(rewards: Tensor, mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """Token-level rewards (B, T): the given ones, else the sequence reward on the last token."""
    if token_rewards is not None:
        assert token_rewards.shape == mask.shape, f"{token_rewards.shape} != {mask.shape}"
        return token_rewards * mask.to(token_rewards.dtype)
    return place_on_last_token(rewards, mask)


def _reinforce_pp(rewards, group_ids, mask, gamma, eps, token_rewards=None, **_unused):
    """REINFORCE++: discounted returns of token rewards, whitened over all valid batch tokens.

    Token rewards may carry a per-token KL penalty (see `kl.kl_penalty_token_rewards`).
    """
    if mask is None:
        raise ConfigError("advantage 'reinforce_pp' needs a response mask (B, T); got None")
    per_token = _token_rewards_or_last(rewards, mask, token_rewards)
    returns = _discounted_returns(per_token, mask, gamma)
    return masked_whiten(returns, mask, eps), returns


def _gae(rewards, group_ids, mask, values, gamma, lam, norm_std, eps, token_rewards=None, **_):
    """GAE over valid tokens: delta_t = r_t + gamma V_{t'} - V_t; A_t = delta_t + gamma lam A_{t'}.

    t' is the next valid token (value 0 after the last one). Returns = A + V (unwhitened); the
    advantages are whitened over all valid tokens when norm_std is True (as in PPO practice).
    """
    if values is None or mask is None:
        raise ConfigError("advantage 'gae' needs values (B, T) and a mask (B, T) from the critic")
    per_token = _token_rewards_or_last(rewards, mask, token_rewards)
    valid = mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = per_token[:, t] + gamma * next_value - values[:, t]
        current = delta + gamma * lam * next_advantage
        is_valid = valid[:, t] > 0
        next_value = torch.where(is_valid, values[:, t], next_value)
        next_advantage = torch.where(is_valid, current, next_advantage)
        advantages[:, t] = current * valid[:, t]
    returns = (advantages + values) * valid
    if norm_std:
        advantages = masked_whiten(advantages, mask, eps)
    return advantages, returns


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": _grpo,
    "rloo": _rloo,
    "reinforce_pp": _reinforce_pp,
    "gae": _gae,
}


def compute_advantages(
    name: str,
    *,
    rewards: Tensor,
    group_ids: Tensor,
    values: Tensor | None = None,
    mask: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_std: bool = True,
    eps: float = 1e-6,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Advantages (B, T) and returns (B, T) (None for grpo/rloo) by the named estimator.

    Args:
        name: one of ADVANTAGE_ESTIMATORS ("grpo", "rloo", "reinforce_pp", "gae").
        rewards: (B,) sequence rewards. group_ids: (B,) int, rows of one prompt share an id.
        values: (B, T) critic values, needed by "gae". mask: (B, T) valid response tokens
            (needed by "reinforce_pp" and "gae"; without it grpo/rloo return (B, 1)).
        gamma, lam: discount and GAE lambda. norm_std: grpo divides by the group std; gae
            whitens advantages over the batch (rloo ignores it; reinforce_pp always whitens).
        token_rewards: (B, T) per-token rewards for reinforce_pp/gae (default: the sequence
            reward on the last valid token).
    Raises:
        ConfigError: unknown name, or an input the estimator needs is missing.
    """
    if name not in ADVANTAGE_ESTIMATORS:
        valid = sorted(ADVANTAGE_ESTIMATORS)
        raise ConfigError(f"unknown advantage estimator {name!r}; valid: {valid}")
    assert rewards.dim() == 1, f"rewards must be (B,), got {tuple(rewards.shape)}"
    assert group_ids.shape == rewards.shape, f"{tuple(group_ids.shape)} != {tuple(rewards.shape)}"
    if mask is not None:
        assert mask.shape[0] == rewards.shape[0], f"mask rows {mask.shape[0]} != {rewards.shape[0]}"
    estimator = ADVANTAGE_ESTIMATORS[name]
    advantages, returns = estimator(
        rewards=rewards.float(), group_ids=group_ids, mask=mask, values=values, gamma=gamma,
        lam=lam, norm_std=norm_std, eps=eps, token_rewards=token_rewards,
    )  # fmt: skip
    assert torch.isfinite(advantages).all(), "non-finite advantages"
    return advantages, returns


def group_all_equal(rewards: Tensor, group_ids: Tensor, atol: float = 1e-8) -> Tensor:
    """(n_groups,) bool: True where every reward of the group is equal (no learning signal).

    Entry i is the group `torch.unique(group_ids)[i]` (ids sorted ascending). Used by DAPO
    dynamic sampling, which drops such groups and samples new prompts to refill the batch.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    values = rewards.float()
    highest = torch.full((n_groups,), -torch.inf, device=rewards.device)
    lowest = torch.full((n_groups,), torch.inf, device=rewards.device)
    highest = highest.scatter_reduce(0, inverse, values, reduce="amax")
    lowest = lowest.scatter_reduce(0, inverse, values, reduce="amin")
    return (highest - lowest) <= atol


def signal_of(batch: Any) -> Tensor:
    """(B,) what DAPO's dynamic sampling filters groups on: the scores (accuracy), not the
    rewards, which add the overlong penalty (a group all right or all wrong whose lengths
    differ in the penalty zone has no correctness signal; DAPO and verl's recipe filter on
    accuracy). Rewards where a batch carries no scores."""
    signal = batch.scores if batch.scores is not None else batch.rewards
    assert signal is not None, "dynamic sampling needs scores"
    return signal


def without_signal(batch: Any) -> Any:
    """`batch` (no group kept by the filter) with its rewards set to the scores `signal_of`
    judged, equal within each group, so its update trains no row: the overlong penalty alone
    would otherwise train it."""
    if batch.scores is not None:
        batch.rewards = batch.scores.clone()
    return batch


def dynamic_sampling_mask(rewards: Tensor, group_ids: Tensor, atol: float = 1e-8) -> Tensor:
    """(B,) bool: True for rows whose group has differing values (`signal_of`: the rows DAPO
    keeps)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return ~group_all_equal(rewards, group_ids, atol)[inverse]
