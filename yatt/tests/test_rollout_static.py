"""The static-shape decode path (the CUDA path, run eagerly on CPU) and the non-Llama fallback.

Method: tiny random-init Llama/Qwen2 models with the real SmolLM2 tokenizer. Static decoding
(fixed batch, attention over the whole cache under a mask, tokens read back every k steps) must
give HF `generate`'s greedy tokens and the dynamic loop's sampled tokens for the same seeds,
including rows that stop early on EOS or a stop string between two host reads. A GPT-2 model
exercises the HF-forward fallback. Tests marked `gpu` replay the step as a CUDA graph and are
skipped where no CUDA device is present (the only skips allowed here).
"""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from yatt.errors import ConfigError
from yatt.models import load_tokenizer, tiny_model
from yatt.rollout import (
    BACKENDS,
    HFGenerateEngine,
    RolloutEngine,
    SamplingParams,
    VLLMEngine,
    make_engine,
)
from yatt.rollout.forward import DecoderForward, HFForward

TEXTS = [
    "Hello there, how are",
    "What is 2 + 3? Answer with just the number.",
    "a",
    "The quick brown fox jumps over the lazy dog and then keeps running far away",
]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_tokenizer(request):
    torch.set_num_threads(1)
    return tiny_model(request.param, seed=3)


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]


def _tokens(completions) -> list[list[int]]:
    return [c.token_ids for c in completions]


@pytest.mark.parametrize("sync_every", [1, 5])
def test_static_greedy_matches_hf_generate(model_and_tokenizer, sync_every):
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(max_new_tokens=24, greedy=True)
    engine = RolloutEngine(model, tokenizer, static=True, sync_every=sync_every)
    ours = engine.generate(_prompts(tokenizer), params)
    reference = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    assert _tokens(ours) == _tokens(reference)
    for mine, theirs in zip(ours, reference):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


def test_static_stops_between_host_reads_like_dynamic(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = _prompts(tokenizer)
    dynamic = RolloutEngine(model, tokenizer)
    first = dynamic.generate(prompts, SamplingParams(max_new_tokens=12, greedy=True))
    # A stop string made of a token each row produces mid-way, and that token as EOS.
    stop_token = first[1].token_ids[5]
    model.generation_config.eos_token_id = [stop_token]
    try:
        params = SamplingParams(max_new_tokens=12, greedy=True, stop=(first[0].text[-3:],))
        expected = dynamic.generate(prompts, params)
        static = RolloutEngine(model, tokenizer, static=True, sync_every=7)
        got = static.generate(prompts, params)
    finally:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    assert _tokens(got) == _tokens(expected)
    assert [c.finish_reason for c in got] == [c.finish_reason for c in expected]
    assert "stop" in [c.finish_reason for c in got]
    assert min(len(c.token_ids) for c in got) < 12  # some row really stopped early


def test_static_sampling_matches_dynamic_for_the_same_seeds(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = _prompts(tokenizer) * 2  # duplicates exercise the prefill dedupe
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_k=50, top_p=0.9)
    seeds = list(range(100, 100 + len(prompts)))
    dynamic = RolloutEngine(model, tokenizer).generate(prompts, params, seeds)
    static = RolloutEngine(model, tokenizer, static=True, sync_every=4)
    got = static.generate(prompts, params, seeds)
    assert _tokens(got) == _tokens(dynamic)
    for mine, theirs in zip(got, dynamic):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


def test_llama_family_uses_yatt_decoder_and_others_fall_back_to_hf():
    torch.set_num_threads(1)
    tokenizer = load_tokenizer("smollm2")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(config).eval()
    engine = RolloutEngine(gpt2, tokenizer)
    assert isinstance(engine._forward, HFForward)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    prompts = _prompts(tokenizer)
    reference = HFGenerateEngine(gpt2, tokenizer).generate(prompts, params)
    assert _tokens(engine.generate(prompts, params)) == _tokens(reference)
    with pytest.raises(ConfigError, match=r"static decoding needs a Llama-family model.*gpt2"):
        RolloutEngine(gpt2, tokenizer, static=True)
    llama, llama_tokenizer = tiny_model("llama", seed=0)
    assert isinstance(RolloutEngine(llama, llama_tokenizer)._forward, DecoderForward)


def _gpt2(tokenizer) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def test_the_hf_forward_masks_under_eager_attention_too():
    """Eager attention adds the mask to the scores: a boolean one would mask nothing (padding
    and later prompt tokens seen). The engine's log-probs equal HF generate's, on a ragged
    batch, under eager as under SDPA."""
    torch.set_num_threads(1)
    tokenizer = load_tokenizer("smollm2")
    params = SamplingParams(max_new_tokens=8, greedy=True)
    prompts = _prompts(tokenizer)
    for implementation in ("sdpa", "eager"):
        model = _gpt2(tokenizer)
        model.set_attn_implementation(implementation)
        ours = RolloutEngine(model, tokenizer).generate(prompts, params)
        reference = HFGenerateEngine(model, tokenizer).generate(prompts, params)
        assert _tokens(ours) == _tokens(reference), implementation
        for mine, theirs in zip(ours, reference):
            assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5), implementation


def test_the_hf_backend_ignores_the_checkpoints_own_sampling_settings(model_and_tokenizer):
    """A checkpoint's generation_config may ship a repetition penalty, min_p ...: HF generate
    would apply them where a call leaves them unset, so the hf backend would sample from a
    distribution the trainer's log-probs never see. Its greedy log-probs equal yatt's."""
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(max_new_tokens=10, greedy=True)
    prompts = _prompts(tokenizer)
    expected = RolloutEngine(model, tokenizer).generate(prompts, params)
    shipped = model.generation_config
    model.generation_config = copy.deepcopy(shipped)
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.no_repeat_ngram_size = 2
    try:
        got = HFGenerateEngine(model, tokenizer).generate(prompts, params)
        assert model.generation_config.repetition_penalty == 3.0  # the model's, kept
    finally:
        model.generation_config = shipped
    assert _tokens(got) == _tokens(expected)
    for mine, theirs in zip(got, expected):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


def test_a_sliding_window_the_batch_outgrows_is_refused_not_ignored():
    """The engine's mask over the cache is a full causal one: right while every row fits in
    the window, wrong past it, so a batch spanning more positions is a one-line error."""
    from types import SimpleNamespace

    from transformers import MistralConfig, MistralForCausalLM

    from yatt.config import load_config
    from yatt.run_checks import check_budgets_fit_model

    torch.set_num_threads(1)
    tokenizer = load_tokenizer("smollm2")
    prompts = _prompts(tokenizer)[:3]  # at most 10 tokens
    params = SamplingParams(max_new_tokens=8, greedy=True)
    for window in (64, 12):
        config = MistralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                               max_position_embeddings=128, sliding_window=window)  # fmt: skip
        torch.manual_seed(0)
        model = MistralForCausalLM(config).eval()
        engine = RolloutEngine(model, tokenizer)
        assert isinstance(engine._forward, HFForward)
        if window == 64:  # 18 positions fit: the engine samples what HF generate samples
            reference = HFGenerateEngine(model, tokenizer).generate(prompts, params)
            assert _tokens(engine.generate(prompts, params)) == _tokens(reference)
        else:
            with pytest.raises(ConfigError, match="sliding window of 12 tokens, and this batch"):
                engine.generate(prompts, params)
    run = load_config("tiny_test", ["rollout.max_new_tokens=12", "eval.n=0"])
    with pytest.raises(ConfigError, match="attends within a sliding window of 12 tokens"):
        check_budgets_fit_model(run, SimpleNamespace(config=config))  # refused up front


def test_a_llama_with_mlp_biases_runs_on_hf_forward_and_matches_it():
    """yatt's fused decoder has no MLP biases: such a model goes to HF's forward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    tokenizer = load_tokenizer("smollm2")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=128, mlp_bias=True,
                         initializer_range=0.2)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    engine = RolloutEngine(model, tokenizer)
    assert isinstance(engine._forward, HFForward)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    reference = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    for mine, theirs in zip(engine.generate(_prompts(tokenizer), params), reference):
        assert mine.token_ids == theirs.token_ids
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


def test_bad_static_settings_raise_config_error(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ConfigError, match="sync_every must be an int >= 1, got 0"):
        RolloutEngine(model, tokenizer, sync_every=0)
    with pytest.raises(ConfigError, match="cuda_graphs needs static decoding on a CUDA device"):
        RolloutEngine(model, tokenizer, device="cpu", static=True, cuda_graphs=True)


def test_vllm_backend_without_vllm_is_a_clear_config_error(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="rollout backend 'vllm' needs the vllm package"):
            make_engine("vllm", model, tokenizer)
    else:
        assert BACKENDS["vllm"] is VLLMEngine


def test_attention_output_in_cuda_layout_still_matches_hf(model_and_tokenizer, monkeypatch):
    """CUDA's SDPA kernels may return (B, H, T, D) stored as (B, T, H, D); the decoder must not
    `view` across that (it failed on an H200 until it reshaped)."""
    import yatt.rollout.decoder as decoder

    model, tokenizer = model_and_tokenizer
    sdpa = decoder.F.scaled_dot_product_attention

    def cuda_layout(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        return out.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides

    monkeypatch.setattr(decoder.F, "scaled_dot_product_attention", cuda_layout)
    params = SamplingParams(max_new_tokens=12, greedy=True)
    engine = RolloutEngine(model, tokenizer, static=True)
    assert isinstance(engine._forward, DecoderForward)
    reference = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    assert _tokens(engine.generate(_prompts(tokenizer), params)) == _tokens(reference)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cuda_graph_greedy_matches_hf_generate_on_cuda(arch):
    model, tokenizer = tiny_model(arch, seed=3)
    model = model.to("cuda")
    params = SamplingParams(max_new_tokens=24, greedy=True)
    reference = HFGenerateEngine(model, tokenizer).generate(_prompts(tokenizer), params)
    engine = RolloutEngine(model, tokenizer)
    assert engine.static and engine.cuda_graphs and engine.sync_every > 1
    assert _tokens(engine.generate(_prompts(tokenizer), params)) == _tokens(reference)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_sampling_equals_eager_static_sampling():
    model, tokenizer = tiny_model("qwen2", seed=4)
    model = model.to("cuda")
    prompts = _prompts(tokenizer) * 4
    seeds = list(range(len(prompts)))
    params = SamplingParams(max_new_tokens=32, temperature=1.0, top_p=0.95)
    graphed = RolloutEngine(model, tokenizer, cuda_graphs=True).generate(prompts, params, seeds)
    eager = RolloutEngine(model, tokenizer, cuda_graphs=False).generate(prompts, params, seeds)
    assert _tokens(graphed) == _tokens(eager)
