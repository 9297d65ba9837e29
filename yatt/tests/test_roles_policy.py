"""Policy role: skipping zero-advantage rows, sharing prompt passes and micro-batching leave
gradients and weights unchanged (up to float rounding); batch invariants are enforced.

Method: two identical tiny models get the same hand-built batch; one update runs with the speed
feature on, one with it off, and gradients/weights are compared.
"""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from yatt.algos.losses import aggregate_loss
from yatt.batch import RolloutBatch
from yatt.config import AlgoConfig, OptimConfig
from yatt.models import tiny_model
from yatt.roles._forward import response_logits, trim_columns
from yatt.roles.policy import PolicyRole, compute_logprobs

PROMPT_WIDTH, RESPONSE_WIDTH = 6, 5


def _batch(advantage_rows: list[float], padding: int = 0) -> RolloutBatch:
    """2 groups x 4 rows; group 1's prompt is left-padded; rows have different lengths
    (``padding``: that many more response columns, all padding)."""
    generator = torch.Generator().manual_seed(1)
    batch_size = 8
    ids = torch.randint(10, 2000, (batch_size, PROMPT_WIDTH + RESPONSE_WIDTH), generator=generator)
    ids = torch.cat([ids, torch.zeros(batch_size, padding, dtype=ids.dtype)], dim=1)
    ids[1:4, :PROMPT_WIDTH] = ids[0, :PROMPT_WIDTH]
    ids[5:8, :PROMPT_WIDTH] = ids[4, :PROMPT_WIDTH]
    attention = torch.ones_like(ids)
    attention[4:, :2] = 0
    lengths = [5, 3, 5, 1, 4, 5, 2, 5]
    for row, length in enumerate(lengths):
        attention[row, PROMPT_WIDTH + length :] = 0
    ids = ids * attention
    response_mask = attention[:, PROMPT_WIDTH:].float()
    advantages = torch.tensor(advantage_rows)[:, None] * response_mask
    return RolloutBatch(
        input_ids=ids, attention_mask=attention, response_mask=response_mask,
        prompt_width=PROMPT_WIDTH, group_ids=torch.tensor([0] * 4 + [1] * 4),
        rewards=torch.tensor(advantage_rows), advantages=advantages,
    ).check()  # fmt: skip


def _policy(model, grad_clip: float = 1.0, **algo_overrides) -> PolicyRole:
    algo = AlgoConfig(**{"micro_batch_size": 8, **algo_overrides})
    optim = OptimConfig(lr=1e-3, schedule="constant", grad_clip=grad_clip)
    return PolicyRole(model, algo=algo, optim=optim, total_updates=10)


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _assert_close(left: dict, right: dict, atol: float) -> None:
    for name in left:
        torch.testing.assert_close(left[name], right[name], atol=atol, rtol=1e-4, msg=name)


@pytest.fixture(scope="module")
def base_model():
    # float64: AdamW's first step moves every weight by about lr * sign(grad), so in float32 a
    # rounding-level gradient difference (different batch shapes) would flip whole steps.
    model, _ = tiny_model(seed=3)
    return model.double()


def test_skip_zero_advantage_rows_gives_same_gradients_and_weights(base_model) -> None:
    batch = _batch([0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.5, -0.5])  # group 0 carries no signal
    skipped, full = copy.deepcopy(base_model), copy.deepcopy(base_model)
    policy_skip = _policy(skipped, skip_zero_adv=True)
    policy_full = _policy(full, skip_zero_adv=False)
    metrics_skip = policy_skip.update(batch)
    metrics_full = policy_full.update(batch)
    assert metrics_skip["actor/trained_rows_frac"] == 0.5
    assert metrics_full["actor/trained_rows_frac"] == 1.0
    assert metrics_skip["actor/pg_loss"] == pytest.approx(metrics_full["actor/pg_loss"], abs=1e-6)
    _assert_close(_grads(skipped), _grads(full), atol=1e-12)
    _assert_close(dict(skipped.named_parameters()), dict(full.named_parameters()), atol=1e-9)


def test_all_zero_step_still_applies_adam_momentum(base_model) -> None:
    signal = _batch([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5])
    no_signal = _batch([0.0] * 8)
    skipped, full = copy.deepcopy(base_model), copy.deepcopy(base_model)
    policy_skip = _policy(skipped, skip_zero_adv=True)
    policy_full = _policy(full, skip_zero_adv=False)
    for batch in (signal, no_signal):
        policy_skip.update(batch)
        policy_full.update(batch)
    before = dict(copy.deepcopy(base_model).named_parameters())
    moved = any(not torch.equal(before[n], p) for n, p in skipped.named_parameters())
    assert moved
    _assert_close(dict(skipped.named_parameters()), dict(full.named_parameters()), atol=1e-9)


def test_an_update_reports_the_same_metric_keys_with_or_without_trained_rows(base_model) -> None:
    """Data-parallel ranks sum their metrics key by key: a rank whose groups carry no signal
    (no trained row) reports the importance-weight metrics too, as 0 over 0 trained tokens."""
    keys = []
    for advantages in ([0.0] * 8, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5]):
        batch = _batch(advantages)
        batch.behaviour_logp = torch.full_like(batch.response_mask, -1.0) * batch.response_mask
        policy = _policy(copy.deepcopy(base_model), skip_zero_adv=True)
        metrics = policy.update(batch)
        keys.append(sorted(metrics))
        if not any(advantages):
            assert metrics["actor/tis_mean"] == 0.0 and policy.metric_weights["trained_tokens"] == 0
    assert keys[0] == keys[1] and "actor/tis_mean" in keys[0]


def test_micro_batching_and_prefix_sharing_do_not_change_gradients(base_model) -> None:
    batch = _batch([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25])
    reference = copy.deepcopy(base_model)
    _policy(reference, micro_batch_size=8).update(batch)
    for micro_batch_size, shared in ((3, True), (1, False), (8, False)):
        model = copy.deepcopy(base_model)
        algo = AlgoConfig(micro_batch_size=micro_batch_size)
        PolicyRole(model, algo=algo, optim=OptimConfig(lr=1e-3, schedule="constant"),
                   total_updates=10, shared_prefix=shared).update(batch)  # fmt: skip
        _assert_close(_grads(model), _grads(reference), atol=1e-7)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_the_entropy_bonus_is_the_sampled_distributions_entropy_aggregated_as_the_loss(
    base_model, agg: str
) -> None:
    """With zero advantages and no KL only the entropy bonus moves the weights: its gradient
    is that of -coef x the loss mode's aggregate of the entropy of softmax(logits / T), the
    distribution the sampler draws from (micro-batched, over the whole batch's normaliser)."""
    batch = _batch([0.0] * 8)
    coef, temperature = 0.1, 0.7
    model = copy.deepcopy(base_model)
    algo = AlgoConfig(micro_batch_size=3, entropy_coef=coef, loss_agg=agg)
    optim = OptimConfig(lr=1e-3, schedule="constant", grad_clip=0.0)  # the raw gradient
    PolicyRole(model, algo=algo, optim=optim, total_updates=10, temperature=temperature,
               shared_prefix=False).update(batch)  # fmt: skip
    expected = copy.deepcopy(base_model)
    ids, attention, mask, width = trim_columns(
        batch.input_ids, batch.attention_mask, batch.response_mask, batch.prompt_width
    )
    logits = response_logits(expected, ids, attention, width).double() / temperature
    entropy = torch.distributions.Categorical(logits=logits).entropy()  # (B, R)
    (-coef * aggregate_loss(entropy, mask, agg)).backward()
    _assert_close(_grads(model), _grads(expected), atol=1e-9)


def test_logprobs_match_with_and_without_prefix_sharing(base_model) -> None:
    batch = _batch([0.0] * 8)
    shared = compute_logprobs(base_model, batch, 8, 1.0, shared_prefix=True)
    plain = compute_logprobs(base_model, batch, 3, 1.0, shared_prefix=False)
    assert shared.shape == (8, RESPONSE_WIDTH)
    torch.testing.assert_close(shared, plain, atol=1e-6, rtol=1e-6)
    assert torch.all(shared[batch.response_mask == 0] == 0)
    assert torch.all(shared[batch.response_mask == 1] < 0)


def test_batch_invariants_are_checked() -> None:
    batch = _batch([0.0] * 8)
    picked = batch.select([1, 5])
    assert picked.size == 2 and picked.prompt_width == PROMPT_WIDTH
    merged = RolloutBatch.concat([picked, batch.select([0])])
    assert merged.size == 3
    batch.rewards = torch.zeros(3)
    with pytest.raises(AssertionError, match="rewards"):
        batch.check()
    batch.rewards = None
    batch.response_mask = batch.response_mask[:, :-1]
    with pytest.raises(AssertionError, match="response_mask"):
        batch.check()


@settings(max_examples=25)
@given(
    prompt_lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    response_lengths=st.lists(st.integers(0, 4), min_size=5, max_size=5),
    picks=st.lists(st.integers(0, 4), min_size=1, max_size=6),
)
def test_batch_packing_select_and_concat_keep_rows_intact(prompt_lengths, response_lengths, picks):
    rows = len(prompt_lengths)
    prompts = [list(range(1, n + 1)) for n in prompt_lengths]
    responses = [list(range(100, 100 + n)) for n in response_lengths[:rows]]
    batch = RolloutBatch.from_token_lists(prompts, responses).check()
    picked = [p % rows for p in picks]
    merged = RolloutBatch.concat([batch.select(picked), batch]).check()
    for out_row, in_row in enumerate([*picked, *range(rows)]):
        real = merged.input_ids[out_row][merged.attention_mask[out_row].bool()].tolist()
        assert real == prompts[in_row] + responses[in_row]
        assert int(merged.response_mask[out_row].sum()) == len(responses[in_row])


def test_a_rollout_engine_sharing_the_policy_sees_every_update() -> None:
    """Regression: fused AdamW leaves version counters alone, so the engine's fused weight
    copies went stale after the first update of a colocated run."""
    from yatt.rollout import RolloutEngine

    model, tokenizer = tiny_model(seed=4)
    engine = RolloutEngine(model, tokenizer)
    decoder = engine._forward.decoder
    policy = _policy(model)
    for _ in range(2):
        policy.update(_batch([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25]))
        decoder.refresh()
        q_proj = model.model.layers[0].self_attn.q_proj.weight
        assert torch.equal(decoder.layers[0]["qkv"][: q_proj.shape[0]], q_proj.detach())


def test_under_bf16_autocast_the_reference_computes_as_the_policy_does() -> None:
    """With the same weights (step 0), the reference's log-probs must equal the policy's, so
    the KL is exactly 0. The reference ran in fp32 beside a bf16-autocast policy, and the KL
    term pulled on the rounding gap between the two."""
    from yatt.roles.reference import ReferenceRole

    model, _ = tiny_model(seed=3)
    algo, optim = AlgoConfig(micro_batch_size=8), OptimConfig(lr=1e-3)
    policy = PolicyRole(model, algo=algo, optim=optim, total_updates=10, bf16_autocast=True)
    batch = _batch([0.0] * 8)
    reference = ReferenceRole(model, micro_batch_size=8, temperature=1.0, bf16_autocast=True)
    policy_logp = policy.logprobs(batch)
    assert torch.equal(reference.logprobs(batch), policy_logp)
    fp32 = ReferenceRole(model, micro_batch_size=8, temperature=1.0).logprobs(batch)
    assert not torch.equal(fp32, policy_logp)  # the gap the KL used to see


def test_the_critics_token_sum_norm_divides_by_the_budget_not_the_widest_response() -> None:
    """The policy's token_sum_norm divides by rows x max_new_tokens; the critic's divided by
    rows x the batch's widest response, so its loss scale moved with that width."""
    from yatt.roles.critic import CriticRole

    model, _ = tiny_model(seed=3)
    algo = AlgoConfig(micro_batch_size=8, loss_agg="token_sum_norm")
    losses = []
    for padding in (0, 3):
        batch = _batch([0.0] * 8, padding)
        batch.values = torch.zeros(batch.response_mask.shape)
        batch.returns = batch.response_mask.clone()
        critic = CriticRole.from_policy(model, algo=algo, optim=OptimConfig(lr=1e-3),
                                        total_updates=1, norm_len=16)  # fmt: skip
        losses.append(critic.update(batch)["critic/vf_loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_a_non_finite_gradient_skips_the_step_and_three_in_a_row_stop_the_run():
    """Advantages of 3e38 overflow the gradient: the step is skipped (the weights stay
    finite and unchanged) instead of writing NaN into every weight; the third such update in a
    row is a ModelError that says the loss diverged."""
    from yatt.errors import ModelError

    model, _ = tiny_model(seed=2)
    policy = _policy(model)
    before = copy.deepcopy(model.state_dict())
    metrics = policy.update(_batch([3e38, -3e38, 3e38, -3e38] * 2))
    assert not torch.isfinite(torch.tensor(metrics["actor/grad_norm"]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    policy.update(_batch([3e38, -3e38, 3e38, -3e38] * 2))
    with pytest.raises(ModelError, match="policy: the gradient norm was nan in 3 updates"):
        policy.update(_batch([3e38, -3e38, 3e38, -3e38] * 2))
    policy.finite_steps.in_a_row = 0
    assert torch.isfinite(torch.tensor(policy.update(_batch([1.0, -1.0] * 4))["actor/grad_norm"]))
    # several PPO passes over one bad batch are one skipped update, not one per pass
    several = _policy(tiny_model(seed=2)[0], ppo_passes=3)
    several.update(_batch([3e38, -3e38, 3e38, -3e38] * 2))
    assert several.finite_steps.in_a_row == 1


def test_algo_dual_clip_reaches_the_policy_loss(monkeypatch):
    """algo.dual_clip (0: off) is passed to the loss; a value <= 1 is refused by the config."""
    import yatt.roles.policy as policy_module
    from yatt.config import load_config
    from yatt.errors import ConfigError

    seen = []
    real = policy_module.policy_loss

    def spy(*args, **kwargs):
        seen.append(kwargs["dual_clip"])
        return real(*args, **kwargs)

    monkeypatch.setattr(policy_module, "policy_loss", spy)
    for dual_clip, passed in ((0.0, None), (3.0, 3.0)):
        model, _ = tiny_model(seed=2)
        metrics = _policy(model, dual_clip=dual_clip).update(_batch([1.0, -1.0] * 4))
        assert seen[-1] == passed
        assert ("actor/clipfrac_lower" in metrics) == bool(dual_clip)
    assert load_config("tiny_test", ["algo.dual_clip=3"]).algo.dual_clip == 3.0
    with pytest.raises(ConfigError, match=r"algo\.dual_clip.*0 \(off\) or > 1"):
        load_config("tiny_test", ["algo.dual_clip=0.5"])


class _ThreadRanks:
    """The collective of data-parallel policy ranks run as threads of one process: each sum
    waits for every rank's part (a barrier), so the ranks run in lockstep as over gloo."""

    def __init__(self, world: int) -> None:
        import threading

        self.barrier = threading.Barrier(world, timeout=60)
        self.parts: list = [None] * world
        self.scalar_rounds = 0

    def rank(self, rank: int):
        hub = self

        class Rank:
            def sum_scalar(self, value: float) -> float:
                hub.scalar_rounds += rank == 0
                return float(hub._sum(rank, torch.tensor([value], dtype=torch.float64))[0])

            def sum_grads(self, params) -> None:
                flat = hub._sum(rank, torch.cat([p.grad.flatten() for p in params]))
                offset = 0
                for param in params:
                    param.grad.copy_(flat[offset : offset + param.numel()].view_as(param.grad))
                    offset += param.numel()

        return Rank()

    def _sum(self, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        self.parts[rank] = tensor.clone()
        self.barrier.wait()
        total = torch.stack(self.parts).sum(dim=0)
        self.barrier.wait()  # every rank has read the parts before the next round writes them
        return total


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_sum", "token_sum_norm"])
def test_data_parallel_ranks_train_as_one_policy_on_the_whole_batch(base_model, loss_agg):
    """Two ranks, each updating on half the batch through a collective, end with the weights
    one policy gets from the whole batch, over several PPO passes; one rank's half carries no
    signal (it trains no row but still counts its tokens in the global normaliser)."""
    from concurrent.futures import ThreadPoolExecutor

    batch = _batch([0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.5, -0.5])
    # (no clipping: it would rescale a gradient whose normaliser were wrong)
    overrides = dict(loss_agg=loss_agg, ppo_passes=2, skip_zero_adv=True, grad_clip=0.0)
    whole = copy.deepcopy(base_model)
    _policy(whole, **overrides).update(batch)
    ranks = _ThreadRanks(world=2)
    models = [copy.deepcopy(base_model) for _ in range(2)]
    policies = [_policy(model, **overrides) for model in models]
    for rank, policy in enumerate(policies):
        policy.collective = ranks.rank(rank)
    shards = [batch.select([0, 1, 2, 3]), batch.select([4, 5, 6, 7])]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda rank: policies[rank].update(shards[rank]), range(2)))
    assert ranks.scalar_rounds == 1  # one normaliser per update, not one per pass
    moved = dict(models[0].named_parameters())
    assert any(not torch.equal(moved[n], p) for n, p in base_model.named_parameters())
    for model in models:  # (AdamW's steps hardly see a gradient's scale: the gradients too)
        _assert_close(_grads(model), _grads(whole), atol=1e-12)
        _assert_close(dict(model.named_parameters()), dict(whole.named_parameters()), atol=1e-9)


def test_a_probe_pass_runs_the_backward_pass_and_leaves_the_policy_as_it_was(base_model):
    """`probe_pass` (re-placement's timing of an update on one core and on several) computes
    the update's gradients over every micro-batch and then zeroes them, with no optimizer step:
    a later update equals one on a policy that was never probed."""
    batch = _batch([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5])
    probed, fresh = copy.deepcopy(base_model), copy.deepcopy(base_model)
    policy = _policy(probed, micro_batch_size=3)
    weight = next(p for p in probed.parameters() if p.requires_grad)
    seen: list[float] = []
    weight.register_hook(lambda grad: seen.append(float(grad.abs().sum())))
    before = {name: p.detach().clone() for name, p in probed.named_parameters()}
    policy.probe_pass(batch)
    assert len(seen) == 3 and all(total > 0 for total in seen)  # 8 rows, micro-batches of 3
    assert not probed.training
    assert all(float(p.grad.abs().sum()) == 0 for p in probed.parameters())
    _assert_close({n: p.detach() for n, p in probed.named_parameters()}, before, atol=0)
    policy.update(batch)
    _policy(fresh, micro_batch_size=3).update(batch)
    _assert_close(dict(probed.named_parameters()), dict(fresh.named_parameters()), atol=0)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_gradient_checkpointing_recomputes_each_layer_and_leaves_the_gradients_alone(
    base_model, shared_prefix
):
    """`train.gradient_checkpointing`: the update's forward keeps only each decoder layer's
    input and the backward pass runs the layer again (two calls of a layer per micro-batch,
    where a plain forward over whole rows makes one), with the same gradients and weights as
    the plain update, with and without a shared prompt pass (a checkpointed forward runs whole
    rows: HF drops a KV cache passed to a checkpointed layer)."""
    batch = _batch([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5])
    results = {}
    for checkpointing in (False, True):
        model = copy.deepcopy(base_model)
        algo = AlgoConfig(micro_batch_size=4)
        optim = OptimConfig(lr=1e-3, schedule="constant", grad_clip=1.0)
        policy = PolicyRole(
            model, algo=algo, optim=optim, total_updates=10, shared_prefix=shared_prefix,
            gradient_checkpointing=checkpointing,
        )  # fmt: skip
        calls = []
        # A layer's own hooks stay outside its checkpoint; its MLP is entered again in the
        # replay (which stops once it has what the backward pass needs: a pre-hook counts).
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *_, c=calls: c.append(1))
        policy.update(batch)
        results[checkpointing] = (len(calls), _grads(model), dict(model.named_parameters()))
    plain_calls = 2 * 2 if shared_prefix else 2  # 2 micro-batches; a shared prefix: 2 passes
    assert results[False][0] == plain_calls
    assert results[True][0] == 2 * 2  # whole rows, then the layer again in the backward pass
    # (as close as a shared prompt pass is to whole rows; AdamW's first step moves a weight by
    # about lr = 1e-3 either way, so a wrong gradient's sign shows far above 1e-5)
    _assert_close(results[True][1], results[False][1], atol=1e-7)
    _assert_close(results[True][2], results[False][2], atol=1e-5)


def _critic_case(base_model, **flags):
    """A critic over `base_model` (micro-batches of 4, AdamW at a constant 1e-3, one update)
    with `flags`, and a batch of 2 groups x 4 rows with values and returns to fit."""
    from yatt.roles.critic import CriticRole

    batch = _batch([0.0] * 8)
    batch.values = torch.zeros(batch.response_mask.shape, dtype=torch.float64)
    batch.returns = batch.response_mask.clone()
    critic = CriticRole.from_policy(
        base_model, algo=AlgoConfig(micro_batch_size=4),
        optim=OptimConfig(lr=1e-3, schedule="constant"), total_updates=1, **flags,
    )  # fmt: skip
    return critic, batch


def test_a_checkpointed_critic_recomputes_its_backbone_layers_with_the_same_update(base_model):
    """PPO's critic under `train.gradient_checkpointing`: its backbone's layers run again in
    the backward pass, and the value loss and the trained weights are the plain update's."""
    results = {}
    for checkpointing in (False, True):
        critic, batch = _critic_case(
            base_model, gradient_checkpointing=checkpointing, shared_prefix=False
        )
        calls = []
        layer = critic.model.backbone.layers[0]
        layer.mlp.register_forward_pre_hook(lambda *_, c=calls: c.append(1))
        loss = critic.update(batch)["critic/vf_loss"]
        results[checkpointing] = (len(calls), loss, dict(critic.model.named_parameters()))
    assert (results[False][0], results[True][0]) == (2, 4)  # 2 micro-batches, then replayed
    assert results[True][1] == pytest.approx(results[False][1], rel=1e-9)
    _assert_close(results[True][2], results[False][2], atol=1e-9)


def test_the_critic_runs_each_prompt_once_with_the_same_values_and_update(base_model):
    """PPO's critic with `train.shared_prefix`: a group's prompt goes through the backbone once
    in the values pass and the update, and values, loss and trained weights are the whole
    rows' (up to rounding)."""
    results = {}
    for shared in (False, True):
        critic, batch = _critic_case(base_model, shared_prefix=shared)
        rows = []
        critic.model.backbone.layers[0].mlp.register_forward_pre_hook(
            lambda module, args, seen=rows: seen.append(args[0].shape[0])
        )
        values = critic.values(batch)
        loss = critic.update(batch)["critic/vf_loss"]
        results[shared] = (rows, values, loss, dict(critic.model.named_parameters()))
    assert results[False][0] == [4] * 4  # values, then update: 2 micro-batches of whole rows
    assert results[True][0] == [1, 4] * 4  # each micro-batch: its group's prompt, then its rows
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-5, rtol=1e-4)
    assert results[True][2] == pytest.approx(results[False][2], rel=1e-5)
    _assert_close(results[True][3], results[False][3], atol=1e-5)
