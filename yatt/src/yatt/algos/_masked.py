"""Masked tensor reductions shared by the advantage, loss and KL modules (pure torch).

Shapes: B = rows (sequences), T = response token positions. A mask is (B, T) with 1 on valid
tokens and 0 on padding; it may be bool or float and is converted to the values' dtype.
"""

import torch
from torch import Tensor


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of values where mask is 1; over all elements when dim is None."""
    weighted = values * mask.to(values.dtype)
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of values where mask is 1 (0 when no element is valid)."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def masked_whiten(values: Tensor, mask: Tensor, eps: float, shift_mean: bool = True) -> Tensor:
    """(values - mean) / (std + eps) over the valid elements of the whole tensor; 0 on padding.

    The std is the unbiased one (Bessel's correction) when more than one element is valid.
    Values are first taken relative to the least valid one, so equal values have deviations of
    exactly 0 (a float32 mean of equal values can miss them by an ulp, which the division by a
    std of the same size would blow up to the same nonzero advantage on every token).
    """
    valid = mask.bool()
    least = values[valid].min() if valid.any() else values.new_zeros(())
    shifted = values - least
    mean = masked_mean(shifted, mask)
    count = mask.to(values.dtype).sum()
    variance = masked_sum((shifted - mean) ** 2, mask) / (count - 1.0).clamp(min=1.0)
    whitened = (shifted - mean) if shift_mean else values
    return whitened / (variance.sqrt() + eps) * mask.to(values.dtype)


def last_valid_index(mask: Tensor) -> Tensor:
    """Index of the last valid position in each row of a (B, T) mask -> (B,) long.

    Rows with no valid position get index 0 (callers mask them out).
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    return torch.where(mask.bool(), positions, -1).amax(dim=-1).clamp(min=0)


def place_on_last_token(rewards: Tensor, mask: Tensor) -> Tensor:
    """Scatter sequence rewards (B,) onto the last valid token of a (B, T) mask -> (B, T)."""
    token_rewards = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    has_tokens = mask.bool().any(dim=-1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    token_rewards[rows, last_valid_index(mask)] = torch.where(has_tokens, rewards, 0.0)
    return token_rewards
