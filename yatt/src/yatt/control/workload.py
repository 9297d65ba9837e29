"""Synthetic workload pieces for tests and benchmarks of the distributed controllers.

A random-init tiny model never answers arithmetic, so rule rewards are all zero and every update
is a no-op. `char_mix_reward` scores any text continuously (and deterministically), so GRPO
groups have distinct rewards and updates move the weights: a comparison of controller modes
then checks real training arithmetic, not a sequence of zeros.
"""

from __future__ import annotations

from typing import Any

__all__ = ["char_mix_reward", "parity_reward"]

_VOWELS = frozenset("aeiouAEIOU")


def char_mix_reward(prompt: str, completion: str, **_fields: Any) -> float:
    """Fraction of the completion's characters that are vowels (0 for an empty completion)."""
    if not completion:
        return 0.0
    return sum(ch in _VOWELS for ch in completion) / len(completion)


def parity_reward(prompt: str, completion: str, **_fields: Any) -> float:
    """1 when the completion has an odd number of characters, else 0: a binary reward, so some
    GRPO groups score all-equal and DAPO dynamic sampling has groups to drop and refill."""
    return float(len(completion) % 2)
