"""Rollout engine correctness: yatt's KV-cache sampler against HF `generate` and against theory.

Method: tiny random-init Llama/Qwen2 models with the real SmolLM2 tokenizer. Greedy outputs must
equal HF `generate` token for token on ragged batches, including rows that stop early (EOS or stop
strings, which also exercises dropping finished rows from the batch). Sampling is checked by the
empirical first-token distribution over many seeds against softmax(logits / T) filtered with HF's
own top-k/top-p warpers, by seed reproducibility across batch orders, and by recomputing the
reported log-probs with a plain full forward pass. The oneDNN-prepacked matmuls are checked
against plain `F.linear` ones, before and after an in-place weight update.
"""

import dataclasses
import math
import os
from types import SimpleNamespace

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from yatt.errors import ConfigError
from yatt.models import tiny_model
from yatt.rollout import HFGenerateEngine, RolloutEngine, SamplingParams, make_engine
from yatt.rollout.forward import DecoderForward
from yatt.rollout.kv import PromptLayout
from yatt.rollout.sampling import filtered_logprobs

TEXTS = [
    "Hello there, how are",
    "What is 2 + 3? Answer with just the number.",
    "a",
    "The quick brown fox jumps over the lazy dog and then keeps running far away",
    "1 2 3",
]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_tokenizer(request):
    torch.set_num_threads(1)
    return tiny_model(request.param, seed=1)


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]


def test_greedy_matches_hf_generate_on_ragged_batch(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(max_new_tokens=32, greedy=True)
    ours = RolloutEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    reference = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    assert [len(set(c.token_ids)) > 1 for c in ours] == [True] * len(TEXTS)  # not degenerate
    for mine, theirs in zip(ours, reference):
        assert mine.token_ids == theirs.token_ids
        assert mine.finish_reason == theirs.finish_reason == "length"
        assert mine.text == theirs.text
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


def test_shared_chat_prefix_is_prefilled_once_and_matches_hf(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for text in TEXTS
    ]
    layout = PromptLayout.build(prompts, 4, 0, torch.device("cpu"), min_shared_prefix=16)
    assert layout.prefix_len >= 16  # the system prompt of the chat template
    params = SamplingParams(max_new_tokens=20, greedy=True)
    ours = RolloutEngine(model, tokenizer).generate(prompts, params)
    reference = HFGenerateEngine(model, tokenizer).generate(prompts, params)
    assert [c.token_ids for c in ours] == [c.token_ids for c in reference]
    assert ours[1].logprobs == pytest.approx(reference[1].logprobs, abs=1e-4)


@pytest.mark.parametrize("compact_fraction", [0.0, 0.6, 2.0])
def test_greedy_matches_hf_when_rows_stop_early_on_eos(model_and_tokenizer, compact_fraction):
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(max_new_tokens=24, greedy=True)
    engine = RolloutEngine(model, tokenizer)
    # 0: drop each finished row at once; 0.6: finished rows ride along for a while; 2: never drop.
    engine.compact_fraction = compact_fraction
    free = engine.generate(_prompts(tokenizer), params)
    # Declare tokens that rows 0 and 3 emit early to be EOS: those rows must stop there
    # (finish "stop"), and the batch shrinks while the others run on.
    eos_a, eos_b = free[0].token_ids[3], free[3].token_ids[6]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [eos_a, eos_b]
    try:
        ours = engine.generate(_prompts(tokenizer), params)
        reference = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    finally:
        model.generation_config.eos_token_id = saved
    assert ours[0].finish_reason == "stop"
    assert ours[0].token_ids[-1] in (eos_a, eos_b)
    assert len(ours[0].token_ids) <= 4
    assert ours[3].finish_reason == "stop"
    for mine, theirs in zip(ours, reference):
        assert mine.token_ids == theirs.token_ids
        assert mine.finish_reason == theirs.finish_reason


def test_ignore_eos_runs_every_row_to_its_budget(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = RolloutEngine(model, tokenizer)
    free = engine.generate(_prompts(tokenizer), SamplingParams(max_new_tokens=12, greedy=True))
    eos = free[0].token_ids[2]  # row 0 emits it early: with EOS honoured it stops there
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [eos]
    try:
        stopped = engine.generate(_prompts(tokenizer), SamplingParams(12, greedy=True))
        params = SamplingParams(max_new_tokens=12, greedy=True, ignore_eos=True)
        ignored = engine.generate(_prompts(tokenizer), params)
        with pytest.raises(ConfigError, match="ignore_eos"):
            HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer)[:1], params)
    finally:
        model.generation_config.eos_token_id = saved
    assert stopped[0].finish_reason == "stop" and len(stopped[0].token_ids) == 3
    assert all(c.finish_reason == "length" and len(c.token_ids) == 12 for c in ignored)
    assert [c.token_ids for c in ignored] == [c.token_ids for c in free]  # EOS kept, same tokens


def test_stop_string_ends_row_at_completing_token(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = RolloutEngine(model, tokenizer)
    free = engine.generate(_prompts(tokenizer), SamplingParams(max_new_tokens=16, greedy=True))
    ids = free[1].token_ids
    # A stop string that spans the boundary between tokens 5 and 6.
    stop = tokenizer.decode(ids[:7])[len(tokenizer.decode(ids[:5])) - 1 :].strip()[:4]
    assert len(stop) >= 2, stop
    params = SamplingParams(max_new_tokens=16, greedy=True, stop=(stop,))
    stopped = engine.generate(_prompts(tokenizer), params)[1]
    assert stopped.finish_reason == "stop"
    assert stop in tokenizer.decode(stopped.token_ids)
    assert stop not in tokenizer.decode(stopped.token_ids[:-1])
    assert stopped.token_ids == ids[: len(stopped.token_ids)]
    reference = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)[1]
    assert reference.token_ids == stopped.token_ids


def test_a_stop_string_of_characters_split_into_byte_tokens_is_found(model_and_tokenizer):
    """答案 is 6 byte-level tokens here (2 characters): the window of tokens checked must
    cover its bytes, not only its characters."""
    from yatt.rollout.engine import _completes_stop

    _, tokenizer = model_and_tokenizer
    ids = tokenizer.encode(" The answer 答案", add_special_tokens=False)
    assert len(ids) - len(tokenizer.encode(" The answer", add_special_tokens=False)) > 3
    assert _completes_stop(tokenizer, ids, ("答案",))
    assert not _completes_stop(tokenizer, ids[:-1], ("答案",))  # its last byte not yet out


def test_seeded_rows_do_not_depend_on_batch_order_or_composition(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = RolloutEngine(model, tokenizer)
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, top_k=100)
    seeds = [11, 22, 33, 44, 55]
    first = engine.generate(prompts, params, seeds)
    order = [3, 0, 4, 2, 1]
    shuffled = engine.generate([prompts[i] for i in order], params, [seeds[i] for i in order])
    alone = engine.generate([prompts[2]], params, [seeds[2]])
    for position, i in enumerate(order):
        assert shuffled[position].token_ids == first[i].token_ids
    assert alone[0].token_ids == first[2].token_ids
    other_seed = engine.generate(prompts, params, [s + 1 for s in seeds])
    assert [c.token_ids for c in other_seed] != [c.token_ids for c in first]


def _hf_expected_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Reference sampling distribution built from HF's own logits warpers. logits: (1, V)."""
    scores = TemperatureLogitsWarper(params.temperature)(None, logits.clone())
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    return torch.softmax(scores, dim=-1)[0]


def _chi_square_critical(dof: int, z: float = 3.72) -> float:
    """Upper critical value of chi-square with `dof` degrees of freedom at p = 1e-4 (z = 3.72),
    by the Wilson-Hilferty approximation."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def _chi_square(counts: torch.Tensor, expected_probs: torch.Tensor, n: int) -> tuple[float, int]:
    """Pearson chi-square over tokens with expected count >= 5, the rest lumped in one bin."""
    expected = expected_probs.double() * n
    big = expected >= 5
    observed_bins = torch.cat([counts[big].double(), counts[~big].sum().double().reshape(1)])
    expected_bins = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if expected_bins[-1] < 5:  # too little mass left over for its own bin: merge it
        observed_bins = torch.cat([observed_bins[:-2], observed_bins[-2:].sum().reshape(1)])
        expected_bins = torch.cat([expected_bins[:-2], expected_bins[-2:].sum().reshape(1)])
    statistic = ((observed_bins - expected_bins) ** 2 / expected_bins).sum().item()
    return statistic, len(expected_bins) - 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=1, temperature=1.0),
        SamplingParams(max_new_tokens=1, temperature=0.7, top_k=12),
        SamplingParams(max_new_tokens=1, temperature=1.5, top_p=0.6),
    ],
)
def test_first_token_distribution_matches_softmax(params):
    torch.set_num_threads(1)
    model, tokenizer = tiny_model("llama", seed=3, vocab_size=512, hidden_size=32, init_std=0.3)
    prompt = [17, 230, 401]  # the tiny vocabulary is smaller than the tokenizer's
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[:, -1, :]  # (1, V)
    expected = _hf_expected_probs(logits, params)
    ours = filtered_logprobs(logits, params).exp()[0]
    assert torch.equal(ours > 0, expected > 0)  # same support as HF's warpers
    assert torch.allclose(ours, expected, atol=1e-5)
    n_samples = 3000
    engine = RolloutEngine(model, tokenizer)
    completions = engine.generate([prompt] * n_samples, params, seeds=list(range(n_samples)))
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in completions]), minlength=512)
    assert expected[counts > 0].min() > 0  # never samples a filtered-out token
    statistic, dof = _chi_square(counts, expected, n_samples)
    assert dof >= 8, f"distribution too peaked to test sampling: {dof} degrees of freedom"
    assert statistic < _chi_square_critical(dof), (statistic, dof)


def test_reported_logprobs_match_full_forward(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(max_new_tokens=10, temperature=0.8, top_k=50, top_p=0.9)
    prompts = _prompts(tokenizer)[:3]
    completions = RolloutEngine(model, tokenizer).generate(prompts, params, seeds=[5, 6, 7])
    for prompt, completion in zip(prompts, completions):
        ids = torch.tensor([prompt + completion.token_ids])
        with torch.inference_mode():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]  # (N, V)
        logp = filtered_logprobs(logits, params)
        expected = logp.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
        assert completion.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_engine_shares_weights_and_restores_training_mode(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = RolloutEngine(model, tokenizer)
    assert engine.model is model
    prompts = _prompts(tokenizer)[:2]
    params = SamplingParams(max_new_tokens=8, greedy=True)
    model.train()
    try:
        before = engine.generate(prompts, params)
        assert model.training
        with torch.no_grad():
            saved = model.lm_head.weight.clone()
            model.lm_head.weight.mul_(-1.0)  # tied to the embeddings: a very different model
        after = engine.generate(prompts, params)
        with torch.no_grad():
            model.lm_head.weight.copy_(saved)
    finally:
        model.eval()
    assert [c.token_ids for c in before] != [c.token_ids for c in after]


def test_weight_sync_pushes_only_into_a_separate_copy(model_and_tokenizer):
    """An engine sampling its own copy (as vLLM's) gets the policy's new weights on sync; one
    sampling the policy module itself needs no push."""
    import copy

    from yatt.config import RolloutConfig
    from yatt.roles.rollout import RolloutRole
    from yatt.rollout.vllm import VLLMEngine

    model, tokenizer = model_and_tokenizer
    policy = copy.deepcopy(model)
    with torch.no_grad():
        policy.lm_head.weight.mul_(-1.0)  # an "update": the copy is now stale
    role = RolloutRole(RolloutEngine(copy.deepcopy(model), tokenizer), tokenizer, RolloutConfig())
    assert not role.engine.shares_weights(policy)
    prompts = _prompts(tokenizer)[:2]
    params = SamplingParams(max_new_tokens=6, greedy=True)
    expected = [c.token_ids for c in RolloutEngine(policy, tokenizer).generate(prompts, params)]
    assert [c.token_ids for c in role.engine.generate(prompts, params)] != expected
    role.sync_weights(policy)
    assert [c.token_ids for c in role.engine.generate(prompts, params)] == expected
    assert RolloutEngine(policy, tokenizer).shares_weights(policy)
    vllm_engine = object.__new__(VLLMEngine)  # no vllm here: only the method under test
    vllm_engine.model = policy  # it keeps the policy module, yet samples its own copy
    assert not vllm_engine.shares_weights(policy)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(top_k=-1), "top_k"),
        (dict(stop="END"), "stop"),
    ],
)
def test_bad_sampling_params_raise_config_error(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        SamplingParams(**kwargs)


def test_bad_requests_raise_config_error(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(max_new_tokens=2)
    for backend in ("yatt", "hf"):
        engine = make_engine(backend, model, tokenizer)
        with pytest.raises(ConfigError, match="seeds"):
            engine.generate([[1, 2], [3]], params, seeds=[1])
        with pytest.raises(ConfigError, match="empty"):
            engine.generate([[1, 2], []], params)
        with pytest.raises(ConfigError, match="empty"):
            engine.generate([], params)
    with pytest.raises(ConfigError, match="vllm"):
        make_engine("vllm", model, tokenizer)


def test_generate_text_uses_raw_prompts(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(max_new_tokens=4, greedy=True)
    engine = RolloutEngine(model, tokenizer)
    from_text = engine.generate_text(TEXTS[:2], params)
    from_ids = engine.generate(_prompts(tokenizer)[:2], params)
    assert [c.token_ids for c in from_text] == [c.token_ids for c in from_ids]
    assert from_text[0].prompt_ids == _prompts(tokenizer)[0]


def test_bf16_rollout_follows_live_fp32_weights(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = RolloutEngine(model, tokenizer, dtype=torch.bfloat16)
    prompts = _prompts(tokenizer)[:3]
    params = SamplingParams(max_new_tokens=8, greedy=True)
    before = engine.generate(prompts, params)
    assert next(model.parameters()).dtype == torch.float32  # the model itself is untouched
    assert all(math.isfinite(lp) for c in before for lp in c.logprobs)
    fp32 = RolloutEngine(model, tokenizer).generate(prompts, params)
    # bf16 rounding may flip near-ties later on, but the first tokens agree with fp32.
    assert [c.token_ids[0] for c in before] == [c.token_ids[0] for c in fp32]
    with torch.no_grad():
        saved = model.lm_head.weight.clone()
        model.lm_head.weight.mul_(-1.0)  # an in-place update, as an optimizer step makes
    try:
        after = engine.generate(prompts, params)
        flipped = RolloutEngine(model, tokenizer, dtype=torch.bfloat16).generate(prompts, params)
    finally:
        with torch.no_grad():
            model.lm_head.weight.copy_(saved)
    assert [c.token_ids for c in after] == [c.token_ids for c in flipped]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


def _prompt_logits(forward: DecoderForward, prompt: list[int]) -> torch.Tensor:
    cpu = torch.device("cpu")
    layout = PromptLayout.build([prompt], 1, 0, cpu, min_shared_prefix=10**9)
    forward.prepare(layout.capacity, cpu)
    cache = forward.new_cache(1, layout.capacity, cpu)
    with torch.inference_mode():
        return forward.forward(layout.prompt_chunk(layout.width), cache).float()  # (1, V)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepacked_matmuls_match_dense_ones_and_follow_updates(model_and_tokenizer, dtype):
    model, tokenizer = model_and_tokenizer
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        # a CPU without oneDNN bf16 (no AVX512-BF16/AMX): asking for prepacking is an error
        with pytest.raises(ConfigError, match="prepacked weights need oneDNN on a CPU"):
            DecoderForward(model, dtype, prepack=True)
        default = DecoderForward(model, dtype)  # falls back to dense matmuls, and runs
        _prompt_logits(default, _prompts(tokenizer)[3])
        assert not default.decoder.packed
        return
    packed, dense = DecoderForward(model, dtype, prepack=True), DecoderForward(model, dtype, False)
    prompt = _prompts(tokenizer)[3]
    tolerance = (
        {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0, "atol": 0.05}
    )
    before = _prompt_logits(packed, prompt)
    torch.testing.assert_close(before, _prompt_logits(dense, prompt), **tolerance)
    assert packed.decoder.packed and not dense.decoder.packed  # the two paths really differ
    with torch.no_grad():
        saved = model.model.layers[0].mlp.down_proj.weight.clone()
        model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)  # as an optimizer step would
    try:
        after = _prompt_logits(packed, prompt)
        torch.testing.assert_close(after, _prompt_logits(dense, prompt), **tolerance)
    finally:
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.copy_(saved)
    assert not torch.allclose(after, before, **tolerance)


def test_prepack_where_it_cannot_run_is_a_config_error(model_and_tokenizer):
    model, _ = model_and_tokenizer
    with pytest.raises(ConfigError, match="prepacked weights need oneDNN on a CPU"):
        DecoderForward(model, torch.float16, prepack=True)  # oneDNN linear: fp32/bf16 only


def test_duplicate_prompts_are_prefilled_once_without_changing_results(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = RolloutEngine(model, tokenizer)
    prompts = _prompts(tokenizer)
    grouped = [prompts[1]] * 3 + [prompts[0]] * 2 + [prompts[1]]
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    seeds = [1, 2, 3, 4, 5, 6]
    together = engine.generate(grouped, params, seeds)
    for prompt, seed, completion in zip(grouped, seeds, together):
        assert engine.generate([prompt], params, [seed])[0].token_ids == completion.token_ids
    greedy = SamplingParams(max_new_tokens=10, greedy=True)
    reference = HFGenerateEngine(model, tokenizer).generate(grouped, greedy)
    assert [c.token_ids for c in engine.generate(grouped, greedy)] == [
        c.token_ids for c in reference
    ]


def test_public_api_is_exported():
    import yatt.rollout as rollout

    expected = {
        "BACKENDS",
        "Completion",
        "HFGenerateEngine",
        "RolloutEngine",
        "SamplingError",
        "SamplingParams",
        "VLLMEngine",
        "make_engine",
    }
    assert set(rollout.__all__) == expected
    assert all(hasattr(rollout, name) for name in rollout.__all__)
    assert set(rollout.BACKENDS) == {"yatt", "hf", "vllm"}


def test_hf_engine_without_seeds_draws_new_samples_each_call(model_and_tokenizer):
    """Seeds left to the engine come from the global generator; the RNG fork around HF's
    sampling undid every draw, so each call without seeds sampled the same tokens."""
    model, tokenizer = model_and_tokenizer
    engine = HFGenerateEngine(model, tokenizer)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    prompts = _prompts(tokenizer)[:1] * 4
    runs = [tuple(tuple(c.token_ids) for c in engine.generate(prompts, params)) for _ in range(3)]
    assert len(set(runs)) == 3
    torch.manual_seed(5)
    first = engine.generate(prompts, params)
    torch.manual_seed(5)
    assert [c.token_ids for c in engine.generate(prompts, params)] == [c.token_ids for c in first]


class _FakeLLM:
    """What VLLMEngine calls on ``vllm.LLM``, recorded (vllm is not installed here)."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []

    def apply_model(self, function):
        loaded = []
        function(
            SimpleNamespace(load_weights=lambda items: loaded.extend(name for name, _ in items))
        )
        self.calls.append(("apply_model", len(loaded)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def test_vllm_engine_pushes_the_models_weights_and_drops_its_prefix_cache(
    model_and_tokenizer, tmp_path, monkeypatch
):
    """After a weight push vLLM's prefix cache still held the prompt keys and values the old
    weights computed (vLLM does not drop it), so every later step sampled from a mix of old
    and new weights. A model loaded from a folder and changed in memory started from the
    folder's weights. And apply_model's function needs V1's insecure-serialization flag."""
    import sys

    from yatt.rollout.vllm import VLLMEngine

    model, tokenizer = model_and_tokenizer
    model.save_pretrained(tmp_path)
    model.name_or_path = str(tmp_path)  # as from_pretrained(folder) leaves it
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=_FakeLLM))
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    engine = VLLMEngine(model, tokenizer)
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    assert engine._llm.kwargs["model"] == str(tmp_path)
    count = len(model.state_dict())
    assert engine._llm.calls == [("apply_model", count), ("reset_prefix_cache",)]
    engine.load_state_dict(model.state_dict())
    assert engine._llm.calls[2:] == [("apply_model", count), ("reset_prefix_cache",)]


def test_a_stop_string_spanning_the_prompt_does_not_end_an_hf_row():
    """HF's own stop_strings match across the prompt's last tokens and ended the row at its
    first token (then failed an assertion); both backends judge generated tokens alone."""
    model, tokenizer = tiny_model("llama", seed=3)
    prompt = tokenizer.encode("Hello there, how are you", add_special_tokens=False)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    first = RolloutEngine(model, tokenizer).generate([prompt], greedy)[0].token_ids
    for stop, reason in ((tokenizer.decode(prompt[-1:] + first[:1]), "length"),
                         (tokenizer.decode(first[2:4]), "stop")):  # fmt: skip
        params = dataclasses.replace(greedy, stop=(stop,))
        ours = RolloutEngine(model, tokenizer).generate([prompt], params)[0]
        theirs = HFGenerateEngine(model, tokenizer).generate([prompt], params)[0]
        assert (ours.token_ids, ours.finish_reason) == (theirs.token_ids, theirs.finish_reason)
        assert ours.finish_reason == reason, (stop, ours)


@pytest.mark.parametrize(
    ("prompts", "seeds", "needle"),
    [
        ([1, 2, 3], None, "prompt 0 must be a list of int token ids"),
        (["hello"], None, "prompt 0 must be a list of int token ids"),
        ([[1.0, 2.5]], None, "prompt 0 must be a list of int token ids"),
        ([[5], [1, 10**6]], None, "prompt 1 holds token id 1000000, outside the vocabulary"),
        ([[-1]], None, "prompt 0 holds token id -1"),
        ("abc", None, "a non-empty list of prompts"),
        ([[1, 2]], [2**64], "seed 0 must be an int in [-2**63, 2**64)"),
        ([[1, 2]], [1.5], "seed 0 must be an int"),
    ],
)
@pytest.mark.parametrize("backend", ["yatt", "hf"])
def test_a_malformed_request_is_one_config_error(prompts, seeds, needle, backend):
    """Bad ids used to fail deep inside the embedding (on CUDA: a device assert that poisons
    the context); floats were truncated; out-of-range seeds overflowed in the generator."""
    model, tokenizer = tiny_model("llama", seed=1)
    engine = make_engine(backend, model, tokenizer)
    with pytest.raises(ConfigError) as caught:
        engine.generate(prompts, SamplingParams(max_new_tokens=2), seeds)
    assert needle in str(caught.value)
