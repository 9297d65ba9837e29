"""Non-finite logits (a diverged policy) end sampling with one clear SamplingError naming the
decode step, in both decode loops of yatt's engine and in the HF backend, instead of an index
error from the sampler (or, greedy, NaN log-probs passed on to training); the sampler itself
keeps every token in range so that nothing fails on the device first."""

import copy
import math

import pytest
import torch

from yatt.errors import YattError
from yatt.models import tiny_model
from yatt.rollout import HFGenerateEngine, RolloutEngine, SamplingError, SamplingParams
from yatt.rollout.sampling import sample_next

V = 7
GOOD = [0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 0.25]
BAD_ROWS = {
    "nan": [0.0, 1.0, math.nan, 2.0, 0.0, 0.0, 0.0],
    "all -inf": [-math.inf] * V,
    "+inf": [0.0, 1.0, math.inf, 2.0, 0.0, 0.0, 0.0],
}
PARAMS = [SamplingParams(), SamplingParams(temperature=0.7, top_k=3, top_p=0.9),
          SamplingParams(greedy=True)]  # fmt: skip


@pytest.mark.parametrize("params", PARAMS, ids=["plain", "top_k_top_p", "greedy"])
@pytest.mark.parametrize("bad", sorted(BAD_ROWS))
def test_sampler_keeps_tokens_in_range_and_marks_non_finite_rows(bad, params):
    logits = torch.tensor([GOOD, BAD_ROWS[bad], GOOD])
    uniforms = torch.tensor([0.3, 0.999, 0.7], dtype=torch.float64)
    tokens, logps = sample_next(logits, params, uniforms)
    assert all(0 <= t < V for t in tokens.tolist())
    assert not math.isfinite(logps[1].item())
    alone_tokens, alone_logps = sample_next(logits[[0, 2]], params, uniforms[[0, 2]])
    assert tokens[[0, 2]].tolist() == alone_tokens.tolist()  # the finite rows are untouched
    assert torch.equal(logps[[0, 2]], alone_logps) and torch.isfinite(alone_logps).all()


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    model, tokenizer = tiny_model("llama", seed=1)
    return model, tokenizer


def _poisoned(model, token: int):
    """A copy of `model` whose input embedding of `token` is NaN (the output head untied, so
    only the step after `token` is sampled sees non-finite logits)."""
    poisoned = copy.deepcopy(model)
    head = poisoned.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    poisoned.config.tie_word_embeddings = False
    with torch.no_grad():
        poisoned.get_input_embeddings().weight[token] = math.nan
    return poisoned


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_engine_names_the_decode_step_of_non_finite_logits(tiny, static, greedy):
    model, tokenizer = tiny
    prompt = tokenizer.encode("What is 2 + 3?", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=8, greedy=greedy, ignore_eos=True)
    seeds = [11]
    clean = RolloutEngine(model, tokenizer, static=static).generate([prompt], params, seeds)[0]
    # the first generated token that is new: its embedding, poisoned, breaks the next step only
    index = next(i for i, t in enumerate(clean.token_ids)
                 if t not in prompt and t not in clean.token_ids[:i])  # fmt: skip
    assert index < len(clean.token_ids) - 1, clean.token_ids
    engine = RolloutEngine(_poisoned(model, clean.token_ids[index]), tokenizer, static=static,
                           sync_every=3)  # fmt: skip
    with pytest.raises(SamplingError, match=rf"at decode step {index + 2},.*optim\.lr") as info:
        engine.generate([prompt], params, seeds)
    assert isinstance(info.value, YattError) and "\n" not in str(info.value)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_hf_backend_reports_non_finite_logits_alike(tiny, greedy):
    model, tokenizer = tiny
    poisoned = _poisoned(model, 0)
    with torch.no_grad():
        poisoned.get_output_embeddings().weight[5] = math.nan  # every step's logits
    prompt = tokenizer.encode("What is 2 + 3?", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=4, greedy=greedy)
    with pytest.raises(SamplingError, match=r"NaN or infinite logits.*optim\.lr"):
        HFGenerateEngine(poisoned, tokenizer).generate([prompt], params, [3])


def test_a_cdf_rising_at_a_filtered_token_is_made_flat_there():
    """A tree-order scan (CUDA) can round the running sum up at a token of zero probability;
    `flat_at_zeros` gives that token the sum before it, so `searchsorted` never picks it."""
    from yatt.rollout.sampling import flat_at_zeros

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [float("nan")] * 5])
    up = torch.nextafter(torch.tensor([0.5, 1.0]), torch.tensor(2.0)).tolist()  # one step up
    rounded = torch.tensor([[1e-8, 0.5, up[0], 1.0, up[1]], [float("nan")] * 5])
    flat = flat_at_zeros(rounded, probs)
    assert flat[0].tolist() == [float("-inf"), 0.5, 0.5, 1.0, 1.0]
    assert torch.isnan(flat[1]).all()  # a NaN row stays NaN (and is reported by its log-prob)
    target = torch.tensor([[0.5]])  # the raw scan rises above it first at token 2
    assert torch.searchsorted(rounded[:1], target, right=True).item() == 2  # the filtered one
    assert torch.searchsorted(flat[:1], target, right=True).item() == 3  # the next kept one


def test_the_vllm_backend_reports_a_non_finite_log_prob_with_its_step():
    """vLLM samples on its own; its completions' log-probs are checked as the engine's are."""
    from types import SimpleNamespace

    from yatt.rollout.vllm import VLLMEngine

    def output(logprobs: list[float]) -> SimpleNamespace:
        steps = [{token: SimpleNamespace(logprob=lp)} for token, lp in enumerate(logprobs)]
        return SimpleNamespace(token_ids=list(range(len(logprobs))), logprobs=steps,
                               finish_reason="length", text="abc")  # fmt: skip

    assert VLLMEngine._completion([7], output([-0.5, -1.0, -2.0])).logprobs == [-0.5, -1.0, -2.0]
    with pytest.raises(SamplingError, match="NaN or infinite logits at decode step 2"):
        VLLMEngine._completion([7], output([-0.5, float("nan"), -2.0]))


def test_several_steps_read_back_at_once_report_the_earliest_bad_one():
    """With sync_every > 1 the host reads k steps of every row together: the error names the
    earliest step any unfinished row went bad at, not the first bad row's."""
    from yatt.rollout.engine import _Row, _StopRule

    rule = _StopRule(SamplingParams(max_new_tokens=8, temperature=1.0), set(), None)
    rows = [_Row([1]), _Row([1])]
    nan = float("nan")
    logps = torch.tensor([[-1.0, -1.0, nan], [nan, -1.0, -1.0]])  # row 0 at step 3, row 1 at 1
    with pytest.raises(SamplingError, match="at decode step 1,"):
        rule.feed(rows, torch.zeros(2, 3, dtype=torch.long), logps)
