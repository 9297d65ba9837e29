"""bf16 rollouts with fp32 training: the `rollout.dtype` key, the truncated importance-sampling
weight, and a GRPO step whose sampler runs bf16 copies of the policy that follow every update.

Method: config round trips and one-line errors; IS weights and the weighted policy loss checked
against hand-computed values; a real Trainer step on a tiny random-init Llama with a fake reward,
comparing the sampler's fused bf16 weights with the policy's fp32 weights after the update.
"""

import math
import re

import pytest
import torch

from yatt.algos.losses import policy_loss, truncated_is_weights
from yatt.config import config_from_dict, load_config, to_dict
from yatt.errors import ConfigError
from yatt.models import tiny_model
from yatt.roles.policy import compute_logprobs
from yatt.trainer import Trainer


class EvenTokenReward:
    """Fake reward role: the fraction of response tokens with an even id (varies within groups)."""

    def score(self, batch):
        even = (batch.response_ids % 2 == 0).float() * batch.response_mask
        return even.sum(1) / batch.response_mask.sum(1).clamp(min=1), {}


def test_rollout_dtype_round_trips_and_defaults_to_float32() -> None:
    assert load_config().rollout.dtype == "float32"
    config = load_config("grpo_addition", ["rollout.dtype=bfloat16", "algo.tis_cap=3"])
    assert (config.rollout.dtype, config.algo.tis_cap) == ("bfloat16", 3.0)
    assert config.rollout.samples_off_policy
    assert config_from_dict(to_dict(config)) == config


@pytest.mark.parametrize(("overrides", "message"), [
    (["rollout.dtype=float16"], "invalid value 'float16' for 'rollout.dtype'"),
    (["rollout.dtype=bfloat16", "rollout.backend=hf"], "'float32' unless rollout.backend"),
    (["algo.tis_cap=0.5"], "invalid value 0.5 for 'algo.tis_cap'"),
])  # fmt: skip
def test_bad_rollout_dtype_settings_raise_one_line_errors(overrides, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        load_config(None, overrides)
    assert "\n" not in str(caught.value)


def test_truncated_is_weights_on_hand_values() -> None:
    old = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    behaviour = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.8)]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights, metrics = truncated_is_weights(old, behaviour, mask, cap=1.5)
    # p_old / p_behaviour = 2.0 (capped to 1.5), 1.0, 0.25 (padding -> 0)
    assert weights[0].tolist() == pytest.approx([1.5, 1.0, 0.0])
    assert metrics["actor/tis_mean"] == pytest.approx(1.25)
    assert metrics["actor/tis_capped_frac"] == pytest.approx(0.5)
    weights, _ = truncated_is_weights(old, behaviour, torch.ones(1, 3), cap=4.0)
    assert weights[0].tolist() == pytest.approx([2.0, 1.0, 0.25])
    with pytest.raises(ConfigError, match=r"got 0\.5"):
        truncated_is_weights(old, behaviour, mask, cap=0.5)


def test_is_weights_scale_each_tokens_loss_and_gradient() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    weights = torch.tensor([[1.5, 0.5]])
    loss, _ = policy_loss(logp, logp.detach(), advantages, mask, is_weights=weights)
    # ratio 1: per-token loss -A = [-1, 1], weighted [-1.5, 0.5], token mean -0.5
    assert float(loss.detach()) == pytest.approx(-0.5)
    loss.backward()
    # d/dlogp of -A w ratio / 2 at ratio 1 = -A w / 2
    assert logp.grad[0].tolist() == pytest.approx([-0.75, 0.25])


def test_bf16_rollout_grpo_step_runs_and_sampler_follows_updates(tmp_path) -> None:
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["rollout.dtype=bfloat16", "optim.lr=1e-2", "eval.n=0",
                                       f"logging.run_dir={tmp_path}"])  # fmt: skip
    trainer = Trainer(config, model=model, tokenizer=tokenizer, reward=EvenTokenReward())
    decoder = trainer.rollout.engine._forward.decoder
    assert decoder.dtype == torch.bfloat16
    batch = trainer._sample(0)
    assert batch.behaviour_logp is not None
    fp32_logp = compute_logprobs(model, batch, 8, 1.0)
    gap = ((batch.behaviour_logp - fp32_logp).abs() * batch.response_mask).max()
    assert 0 < float(gap) < 0.2, f"bf16 sampler vs fp32 log-prob gap {float(gap)}"

    before = decoder.layers[0]["down"].clone()
    buffer_address = decoder.layers[0]["down"].data_ptr()
    metrics = trainer.train_step()
    assert metrics["actor/trained_rows_frac"] > 0
    assert 0 < metrics["actor/tis_mean"] <= config.algo.tis_cap
    assert all(math.isfinite(v) for v in metrics.values())
    trainer.rollout.generate(["hello"], [{}], [0], list(range(config.rollout.n_samples)))
    after = decoder.layers[0]["down"]
    current = model.model.layers[0].mlp.down_proj.weight.detach().to(torch.bfloat16)
    assert after.dtype == torch.bfloat16
    assert torch.equal(after, current)  # the sampler samples the updated weights
    assert not torch.equal(after, before)
    assert after.data_ptr() == buffer_address  # refreshed in place, not reallocated
    assert next(model.parameters()).dtype == torch.float32  # training stays fp32


def test_held_out_eval_of_a_bf16_rollout_run_samples_the_fp32_model(tmp_path) -> None:
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["rollout.dtype=bfloat16", "eval.n=4", "train.steps=1",
                                       f"logging.run_dir={tmp_path}"])  # fmt: skip
    trainer = Trainer(config, model=model, tokenizer=tokenizer, reward=EvenTokenReward())
    result = trainer.fit()
    assert [step for step, _ in result.evals] == [0, 1]
    assert trainer._eval_engine is not trainer.rollout.engine
    assert trainer._eval_engine._forward.decoder.dtype == torch.float32
    assert (
        "actor/tis_mean" in result.history[-1] or result.history[-1]["actor/trained_rows_frac"] == 0
    )
