"""Advantage estimators and DAPO dynamic-sampling helpers.

Method: tiny tensors whose expected values are worked out by hand in the comments; GAE is also
checked against a plain per-row Python loop; group-normalised advantages must have zero group mean.
"""

import math

import pytest
import torch

from yatt.algos import compute_advantages, dynamic_sampling_mask, group_all_equal
from yatt.errors import ConfigError

# group 7: rewards [1, 0, 0, 0]; group 3: [2, 4]; group 9: [5] (a single row)
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0, 5.0])
GROUPS = torch.tensor([7, 7, 7, 7, 3, 3, 9])


def test_grpo_hand_values_with_std():
    # group 7: mean 0.25, unbiased var (0.75^2 + 3 * 0.25^2) / 3 = 0.25 -> std 0.5
    #   -> (1 - 0.25) / 0.5 = 1.5 and (0 - 0.25) / 0.5 = -0.5
    # group 3: mean 3, var (1 + 1) / 1 = 2 -> -1/sqrt(2), +1/sqrt(2); group 9: one row -> 0
    advantages, returns = compute_advantages("grpo", rewards=REWARDS, group_ids=GROUPS, eps=0.0)
    root_half = 1 / math.sqrt(2)
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, -root_half, root_half, 0.0])
    torch.testing.assert_close(advantages[:, 0], expected)
    assert returns is None


def test_grpo_without_std_and_broadcast_over_mask():
    # mean only: group 7 -> [0.75, -0.25, -0.25, -0.25]; group 3 -> [-1, 1]; group 9 -> 0
    mask = torch.ones(7, 3)
    mask[0, 2] = 0
    advantages, _ = compute_advantages(
        "grpo", rewards=REWARDS, group_ids=GROUPS, mask=mask, norm_std=False
    )
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, -1.0, 1.0, 0.0])
    torch.testing.assert_close(advantages, expected[:, None] * mask)
    assert advantages[0, 2] == 0


def test_rloo_hand_values():
    # group 7: row 0 baseline (0+0+0)/3 = 0 -> 1; rows 1-3 baseline (1+0+0)/3 -> -1/3
    # group 3: 2 - 4 = -2, 4 - 2 = 2; group 9 (single row): 0
    advantages, _ = compute_advantages("rloo", rewards=REWARDS, group_ids=GROUPS)
    third = 1 / 3
    expected = torch.tensor([1.0, -third, -third, -third, -2.0, 2.0, 0.0])
    torch.testing.assert_close(advantages[:, 0], expected)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_advantages_have_zero_mean_per_group(name):
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=generator)
    groups = torch.arange(6).repeat_interleave(4)[torch.randperm(24, generator=generator)]
    advantages, _ = compute_advantages(name, rewards=rewards, group_ids=groups)
    for group in groups.unique():
        assert abs(float(advantages[groups == group, 0].mean())) < 1e-5


def test_reinforce_pp_returns_and_global_whitening():
    # gamma 0.5, reward on the last valid token:
    # row 0 mask [1, 1, 0], reward 1 -> returns [0.5, 1, 0]; row 1 mask [1, 1, 1], reward 2
    # -> [0.5, 1, 2]. Valid returns {0.5, 1, 0.5, 1, 2}: mean 1.0, unbiased var
    # (0.25 + 0 + 0.25 + 0 + 1) / 4 = 0.375 -> advantages (G - 1) / sqrt(0.375).
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    advantages, returns = compute_advantages(
        "reinforce_pp", rewards=torch.tensor([1.0, 2.0]), group_ids=torch.tensor([0, 0]),
        mask=mask, gamma=0.5, eps=0.0,
    )  # fmt: skip
    torch.testing.assert_close(returns, torch.tensor([[0.5, 1.0, 0.0], [0.5, 1.0, 2.0]]))
    std = math.sqrt(0.375)
    expected = torch.tensor([[-0.5, 0.0, 0.0], [-0.5, 0.0, 1.0]]) / std
    torch.testing.assert_close(advantages, expected)


def test_reinforce_pp_uses_token_rewards():
    # token rewards [-0.1, -0.2, 1.0] with gamma 1 -> returns [0.7, 0.8, 1.0]
    mask = torch.ones(1, 3)
    token_rewards = torch.tensor([[-0.1, -0.2, 1.0]])
    _, returns = compute_advantages(
        "reinforce_pp", rewards=torch.tensor([1.0]), group_ids=torch.tensor([0]), mask=mask,
        token_rewards=token_rewards,
    )  # fmt: skip
    torch.testing.assert_close(returns, torch.tensor([[0.7, 0.8, 1.0]]))


def test_gae_hand_values():
    # values [0.5, 0.2, 0.1], reward 1 on the last token, gamma 0.9, lambda 0.8:
    # t=2: delta = 1 - 0.1 = 0.9,                 A2 = 0.9
    # t=1: delta = 0.9 * 0.1 - 0.2 = -0.11,       A1 = -0.11 + 0.72 * 0.9 = 0.538
    # t=0: delta = 0.9 * 0.2 - 0.5 = -0.32,       A0 = -0.32 + 0.72 * 0.538 = 0.06736
    advantages, returns = compute_advantages(
        "gae", rewards=torch.tensor([1.0]), group_ids=torch.tensor([0]),
        values=torch.tensor([[0.5, 0.2, 0.1]]), mask=torch.ones(1, 3), gamma=0.9, lam=0.8,
        norm_std=False,
    )  # fmt: skip
    torch.testing.assert_close(advantages, torch.tensor([[0.06736, 0.538, 0.9]]))
    torch.testing.assert_close(returns, torch.tensor([[0.56736, 0.738, 1.0]]))


def _gae_reference(token_rewards, values, mask, gamma, lam):
    """Textbook GAE per row over the compacted list of valid positions."""
    advantages = torch.zeros_like(values)
    for row in range(values.shape[0]):
        positions = [t for t in range(values.shape[1]) if mask[row, t]]
        running = 0.0
        for index in reversed(range(len(positions))):
            t = positions[index]
            next_value = values[row, positions[index + 1]] if index + 1 < len(positions) else 0.0
            delta = token_rewards[row, t] + gamma * next_value - values[row, t]
            running = delta + gamma * lam * running
            advantages[row, t] = running
    return advantages


def test_gae_matches_reference_loop_with_padding_and_gaps():
    generator = torch.Generator().manual_seed(1)
    values = torch.randn(4, 6, generator=generator)
    token_rewards = torch.randn(4, 6, generator=generator)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 1, 0], [0] * 6])
    token_rewards = token_rewards * mask
    advantages, returns = compute_advantages(
        "gae", rewards=torch.zeros(4), group_ids=torch.arange(4), values=values, mask=mask,
        gamma=0.95, lam=0.9, norm_std=False, token_rewards=token_rewards,
    )  # fmt: skip
    expected = _gae_reference(token_rewards, values, mask, 0.95, 0.9)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, (expected + values) * mask)


def test_gae_whitening_gives_zero_mean_unit_std_on_valid_tokens():
    generator = torch.Generator().manual_seed(2)
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    advantages, _ = compute_advantages(
        "gae", rewards=torch.randn(3, generator=generator), group_ids=torch.arange(3),
        values=torch.randn(3, 5, generator=generator), mask=mask, eps=0.0,
    )  # fmt: skip
    valid = advantages[mask.bool()]
    assert abs(float(valid.mean())) < 1e-5
    assert abs(float(valid.std()) - 1.0) < 1e-5
    assert (advantages[~mask.bool()] == 0).all()


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ConfigError, match=r"'ppo'.*gae.*grpo.*reinforce_pp.*rloo"):
        compute_advantages("ppo", rewards=REWARDS, group_ids=GROUPS)


def test_gae_without_values_is_a_config_error():
    with pytest.raises(ConfigError, match="gae"):
        compute_advantages("gae", rewards=REWARDS, group_ids=GROUPS, mask=torch.ones(7, 2))


def test_group_all_equal_and_dynamic_sampling_mask():
    # groups 0: [1, 1] equal; 1: [0, 1] mixed; 2: [0, 0] equal (ids given out of order)
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([1, 1, 0, 0, 2, 2])
    assert group_all_equal(rewards, groups).tolist() == [True, False, True]
    keep = dynamic_sampling_mask(rewards, groups)
    assert keep.tolist() == [True, True, False, False, False, False]


@pytest.mark.parametrize("name", ["grpo", "rloo"])
@pytest.mark.parametrize(("value", "rows"), [(0.9, 8), (5.3, 8), (10.7, 8), (2.3, 16), (0.9, 16)])
def test_a_group_of_equal_rewards_has_advantages_of_exactly_zero(name, value, rows):
    """A float32 mean of equal rewards can miss them by an ulp; GRPO divided that miss by a
    std of the same size, so such a group (no signal at all) pushed every row by up to +-0.5
    (5.3 x 8 rows: +0.32), and skip_zero_adv trained on it. Beside a mixed group."""
    rewards = torch.cat([torch.full((rows,), value), torch.tensor([0.0, 1.0])])
    groups = torch.tensor([0] * rows + [1, 1])
    advantages, _ = compute_advantages(name, rewards=rewards, group_ids=groups)
    assert torch.equal(advantages[:rows, 0], torch.zeros(rows))
    assert advantages[rows, 0] < 0 < advantages[rows + 1, 0]


def test_reinforce_pp_with_equal_returns_has_no_advantage():
    """Every valid return equal (all rewards 0.1, one token each): a float32 mean missed them
    by an ulp and the whitening blew that up to the same advantage on every token."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 38, (64,), generator=generator)
    mask = (torch.arange(37)[None, :] < lengths[:, None]).float()
    advantages, _ = compute_advantages(
        "reinforce_pp", rewards=torch.full((64,), 0.1), group_ids=torch.arange(64), mask=mask,
        gamma=1.0,
    )  # fmt: skip
    assert torch.count_nonzero(advantages) == 0


def test_dynamic_sampling_filters_on_scores_not_the_penalised_rewards():
    """Group 0 is all right but two rows differ by the overlong penalty: DAPO filters on
    accuracy, so it has no signal; group 1 has differing scores and is kept."""
    from types import SimpleNamespace

    from yatt.algos.advantages import signal_of

    batch = SimpleNamespace(scores=torch.tensor([1.0, 1.0, 0.0, 1.0]),
                            rewards=torch.tensor([1.0, 0.7, 0.0, 1.0]))  # fmt: skip
    keep = dynamic_sampling_mask(signal_of(batch), torch.tensor([0, 0, 1, 1]))
    assert keep.tolist() == [False, False, True, True]
    assert signal_of(SimpleNamespace(scores=None, rewards=batch.rewards)) is batch.rewards
