"""Policy/value/SFT/BT losses, aggregation modes, KL estimators and the overlong penalty.

Method: hand-computed per-token cases that hit each clip branch; each aggregation mode's
normaliser on a padded batch; properties (micro-batch invariance with the global normaliser,
KL of identical policies is zero, k3 >= 0, k1 and k3 are unbiased under exact expectation).
"""

import math

import pytest
import torch

from yatt.algos import (
    AGG_MODES,
    aggregate_loss,
    bradley_terry_loss,
    kl_estimate,
    kl_loss,
    kl_penalty_token_rewards,
    loss_normalizer,
    overlong_penalty,
    policy_loss,
    sft_loss,
    value_loss,
)
from yatt.errors import ConfigError


def _policy_case():
    # clip_low 0.2, clip_high 0.28, dual clip 3. Per token (A, ratio) -> loss (branch):
    # (1, 1.1) -> -1.1 (inside); (1, 1.5) -> -1.28 (clipped high);
    # (-1, 0.5) -> max(0.5, 0.8) = 0.8 (clipped low); (-1, 4) -> max(4, 1.28) = 4, capped at 3
    # (dual clip); (2, 0.5) -> max(-1, -1.6) = -1 (unclipped side of the max).
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0]])
    ratios = torch.tensor([[1.1, 1.5, 0.5, 4.0, 0.5]])
    old_logp = torch.full((1, 5), -1.0)
    logp = (old_logp + ratios.log()).requires_grad_(True)
    return logp, old_logp, advantages, torch.ones(1, 5)


def test_policy_loss_hits_each_branch():
    logp, old_logp, advantages, mask = _policy_case()
    loss, metrics = policy_loss(
        logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0
    )
    # (-1.1 - 1.28 + 0.8 + 3 - 1) / 5 = 0.084
    assert math.isclose(loss.item(), 0.084, abs_tol=1e-6)
    assert math.isclose(metrics["actor/pg_clipfrac"], 0.4, abs_tol=1e-6)
    assert math.isclose(metrics["actor/pg_clipfrac_lower"], 0.2, abs_tol=1e-6)
    loss.backward()
    # d(-A ratio)/dlogp = -A ratio on unclipped tokens, 0 on clipped and dual-clipped ones
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.1, 0.0, 0.0, 0.0, -1.0]]) / 5)


def test_clip_higher_differs_from_symmetric_clip():
    # A = 1, ratio 1.25: symmetric 0.2 clips to 1.2; clip_high 0.28 leaves 1.25
    old_logp = torch.zeros(1, 1)
    logp = torch.tensor([[math.log(1.25)]])
    advantages, mask = torch.ones(1, 1), torch.ones(1, 1)
    symmetric, _ = policy_loss(logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.2)
    higher, _ = policy_loss(logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.28)
    assert math.isclose(float(symmetric), -1.2, rel_tol=1e-6)
    assert math.isclose(float(higher), -1.25, rel_tol=1e-6)


def test_bad_dual_clip_is_config_error():
    logp, old_logp, advantages, mask = _policy_case()
    with pytest.raises(ConfigError, match="dual_clip"):
        policy_loss(logp, old_logp, advantages, mask, dual_clip=0.5)


# rows: [1, 2, 3, pad], [4, pad, pad, pad], [pad x 4] (an empty row is not counted)
LOSS_MAT = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
AGG_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("agg", "expected", "normaliser"),
    [
        ("token_mean", 10 / 4, 4.0),  # valid tokens
        ("seq_mean_token_sum", (6 + 4) / 2, 2.0),  # non-empty rows
        ("seq_mean_token_mean", (2 + 4) / 2, 2.0),  # non-empty rows, of row means
        ("token_sum_norm", 10 / (2 * 4), 8.0),  # non-empty rows x T
    ],
)
def test_aggregation_modes_and_normalisers(agg, expected, normaliser):
    assert loss_normalizer(AGG_MASK, agg) == normaliser
    assert math.isclose(float(aggregate_loss(LOSS_MAT, AGG_MASK, agg)), expected, rel_tol=1e-6)


def test_token_sum_norm_uses_given_length_and_unknown_mode_errors():
    assert math.isclose(
        float(aggregate_loss(LOSS_MAT, AGG_MASK, "token_sum_norm", norm_len=10)), 0.5
    )
    with pytest.raises(ConfigError, match=r"'mean'.*token_mean"):
        aggregate_loss(LOSS_MAT, AGG_MASK, "mean")


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batch_split_matches_full_batch(agg):
    generator = torch.Generator().manual_seed(0)
    rows, length = 8, 7
    old_logp = -torch.rand(rows, length, generator=generator)
    logp = (old_logp + 0.3 * torch.randn(rows, length, generator=generator)).requires_grad_(True)
    advantages = torch.randn(rows, length, generator=generator)
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    full, _ = policy_loss(logp, old_logp, advantages, mask, agg=agg)
    (full_grad,) = torch.autograd.grad(full, logp)
    normaliser = loss_normalizer(mask, agg)
    total = torch.zeros(())
    for part in [slice(0, 3), slice(3, 4), slice(4, 8)]:
        piece, _ = policy_loss(
            logp[part], old_logp[part], advantages[part], mask[part], agg=agg,
            normalizer=normaliser, norm_len=length,
        )  # fmt: skip
        total = total + piece
    (split_grad,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(split_grad, full_grad)


def test_value_loss_clipping():
    # old 0, returns 1, clip 0.2: V = 0.5 -> clipped 0.2; errors 0.25 vs 0.64 -> 0.5 * 0.64
    #                             V = 0.1 -> inside the clip; error 0.81 -> 0.5 * 0.81
    values = torch.tensor([[0.5, 0.1]])
    old, returns, mask = torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    loss, metrics = value_loss(values, old, returns, mask, clip=0.2)
    assert math.isclose(loss.item(), (0.32 + 0.405) / 2, rel_tol=1e-6)
    assert metrics["critic/vf_clipfrac"] == 0.5
    unclipped, _ = value_loss(values, old, returns, mask, clip=None)
    assert math.isclose(float(unclipped), (0.125 + 0.405) / 2, rel_tol=1e-6)


def test_sft_loss_is_masked_mean_nll():
    token_logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])
    assert math.isclose(
        float(sft_loss(token_logp, mask)), (math.log(2) + math.log(4)) / 2, rel_tol=1e-6
    )


def test_bradley_terry_loss_values():
    # difference 0 -> log 2; difference 2 with margin 2 -> log 2 too
    zero = bradley_terry_loss(torch.tensor([1.0]), torch.tensor([1.0]))
    assert math.isclose(float(zero), math.log(2), rel_tol=1e-6)
    margin = bradley_terry_loss(torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor([2.0]))
    assert math.isclose(float(margin), math.log(2), rel_tol=1e-6)
    confident = bradley_terry_loss(torch.tensor([10.0]), torch.tensor([0.0]))
    assert float(confident) < 1e-4


def test_overlong_penalty_ramp():
    # max 10, buffer 4 -> the ramp starts after 6 tokens: 8 -> -0.5, 10 and beyond -> -1
    lengths = torch.tensor([5, 6, 8, 10, 12])
    torch.testing.assert_close(
        overlong_penalty(lengths, max_len=10, buffer_len=4, penalty=1.0),
        torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]),
    )
    with pytest.raises(ConfigError, match="buffer_len"):
        overlong_penalty(lengths, max_len=10, buffer_len=11, penalty=1.0)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_is_zero_for_identical_policies(kind):
    logp = -torch.rand(3, 4)
    assert (kl_estimate(logp, logp.clone(), kind) == 0).all()


def test_kl_known_values_and_k3_non_negative():
    # p = 0.5, q = 0.25: log r = log(q / p) = -log 2
    # k1 = log 2; k2 = (log 2)^2 / 2; k3 = 0.5 - 1 + log 2
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    log2 = math.log(2)
    assert math.isclose(float(kl_estimate(logp, ref, "k1")), log2, rel_tol=1e-6)
    assert math.isclose(float(kl_estimate(logp, ref, "k2")), log2**2 / 2, rel_tol=1e-6)
    assert math.isclose(float(kl_estimate(logp, ref, "k3")), log2 - 0.5, rel_tol=1e-6)
    generator = torch.Generator().manual_seed(0)
    random_k3 = kl_estimate(torch.randn(50, generator=generator), torch.randn(50), "k3")
    assert (random_k3 >= 0).all()
    assert (kl_estimate(torch.zeros(1), torch.tensor([30.0]), "low_var_kl") == 10.0).all()


def test_k1_and_k3_are_unbiased_under_exact_expectation():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    exact = float((p * (p / q).log()).sum())
    for kind in ("k1", "k3"):
        expectation = float((p * kl_estimate(p.log(), q.log(), kind)).sum())
        assert math.isclose(expectation, exact, rel_tol=1e-5), kind


def test_kl_loss_and_reward_penalty():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.25]]))
    mask = torch.tensor([[1, 1, 0]])
    # k1 per token [log 2, 0, log 2]; masked mean over the first two -> log 2 / 2
    assert math.isclose(float(kl_loss(logp, ref, mask, kind="k1")), math.log(2) / 2, rel_tol=1e-6)
    # penalty -0.1 * k1 on valid tokens, sequence reward 1 on the last valid token (index 1)
    token_rewards = kl_penalty_token_rewards(torch.tensor([1.0]), logp, ref, mask, coef=0.1)
    torch.testing.assert_close(token_rewards, torch.tensor([[-0.1 * math.log(2), 1.0, 0.0]]))


def test_unknown_kl_kind_lists_valid_names():
    with pytest.raises(ConfigError, match=r"'k4'.*k1.*k2.*k3.*low_var_kl"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


@pytest.mark.parametrize("agg", AGG_MODES)
def test_ranks_normalisers_sum_to_the_whole_batchs_even_with_an_empty_rank(agg) -> None:
    """Data-parallel ranks sum their normalisers; a rank with no token to train (all its rows
    masked) must add nothing, or every rank would divide by one more than a single process."""
    mask = (torch.rand(6, 5, generator=torch.Generator().manual_seed(3)) > 0.3).float()
    mask[:, 0] = 1.0
    empty = torch.zeros(2, 5)
    whole = loss_normalizer(torch.cat([mask, empty]), agg, norm_len=5)
    shards = [loss_normalizer(part, agg, norm_len=5, least=0.0) for part in (mask, empty)]
    assert shards[1] == 0.0
    assert max(sum(shards), 1.0) == whole
