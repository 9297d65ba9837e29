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
