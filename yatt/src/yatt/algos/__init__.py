"""RL algorithms as pure torch functions: advantage estimators, policy/value/SFT/BT losses with
their aggregation modes, KL estimators, and next-token log-probs. No transformers or Ray here.

Trainer recipe (micro-batching): `norm = loss_normalizer(mini_batch_mask, agg)`, then for each
micro-batch `policy_loss(..., agg=agg, normalizer=norm)` and backward; the summed micro-batch
losses equal the full mini-batch loss for every aggregation mode.
"""

from yatt.algos._masked import masked_mean, masked_whiten
from yatt.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    dynamic_sampling_mask,
    group_all_equal,
)
from yatt.algos.kl import KL_ESTIMATORS, kl_estimate, kl_loss, kl_penalty_token_rewards
from yatt.algos.logprobs import position_ids_from_mask, token_logprobs
from yatt.algos.losses import (
    AGG_MODES,
    aggregate_loss,
    bradley_terry_loss,
    loss_normalizer,
    overlong_penalty,
    policy_loss,
    sft_loss,
    truncated_is_weights,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "aggregate_loss",
    "bradley_terry_loss",
    "compute_advantages",
    "dynamic_sampling_mask",
    "group_all_equal",
    "kl_estimate",
    "kl_loss",
    "kl_penalty_token_rewards",
    "loss_normalizer",
    "masked_mean",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss",
    "position_ids_from_mask",
    "sft_loss",
    "token_logprobs",
    "truncated_is_weights",
    "value_loss",
]
