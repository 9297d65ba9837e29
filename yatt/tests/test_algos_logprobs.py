"""token_logprobs: next-token log-probs of a tiny random Llama.

Method: compare with a naive full log_softmax over the logits; check that chunking, temperature
and left padding do not change the values of real tokens, and that gradients flow.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from yatt.algos import token_logprobs


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _naive(model, input_ids, attention_mask, temperature=1.0):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def test_matches_naive_log_softmax_for_any_chunk_size_and_temperature():
    model = _tiny_llama()
    input_ids = torch.randint(0, 97, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(input_ids)
    with torch.no_grad():
        expected = _naive(model, input_ids, mask)
        for chunk_size in (1, 3, 256):
            got = token_logprobs(model, input_ids, mask, chunk_size=chunk_size)
            assert got.shape == (3, 8)
            torch.testing.assert_close(got, expected)
        hot = token_logprobs(model, input_ids, mask, temperature=0.7, chunk_size=4)
        torch.testing.assert_close(hot, _naive(model, input_ids, mask, temperature=0.7))


def test_left_padding_does_not_change_real_token_logprobs():
    model = _tiny_llama()
    sequence = torch.randint(1, 97, (1, 6), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), sequence], dim=1)
    padded_mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6)], dim=1)
    with torch.no_grad():
        plain = token_logprobs(model, sequence, torch.ones_like(sequence))
        shifted = token_logprobs(model, padded, padded_mask.long())
    torch.testing.assert_close(shifted[:, 3:], plain, atol=1e-5, rtol=1e-5)


def test_response_mask_and_gradients():
    model = _tiny_llama()
    input_ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(3))
    response_mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]])
    logp = token_logprobs(model, input_ids, torch.ones_like(input_ids), response_mask)
    assert (logp[response_mask == 0] == 0).all()
    assert (logp[response_mask == 1] < 0).all()
    logp.sum().backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_matches_rollout_engine_logprobs_on_left_padded_batch():
    from yatt.models import tiny_model
    from yatt.rollout import RolloutEngine, SamplingParams

    model, tokenizer = tiny_model(seed=0)
    prompts = [tokenizer("What is 12 + 34?")["input_ids"], tokenizer("hi")["input_ids"]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    completions = RolloutEngine(model, tokenizer).generate(prompts, params, seeds=[1, 2])
    prompt_width = max(len(done.prompt_ids) for done in completions)
    width = prompt_width + max(len(done.token_ids) for done in completions)
    input_ids = torch.full((2, width), tokenizer.pad_token_id)
    mask = torch.zeros(2, width, dtype=torch.long)
    for row, done in enumerate(completions):
        sequence = done.prompt_ids + done.token_ids
        start = prompt_width - len(done.prompt_ids)  # prompts left-padded, responses after
        input_ids[row, start : start + len(sequence)] = torch.tensor(sequence)
        mask[row, start : start + len(sequence)] = 1
    with torch.no_grad():
        logp = token_logprobs(model, input_ids, mask)
    for row, done in enumerate(completions):
        ours = logp[row, prompt_width - 1 : prompt_width - 1 + len(done.token_ids)]
        torch.testing.assert_close(ours, torch.tensor(done.logprobs), atol=1e-3, rtol=1e-4)
