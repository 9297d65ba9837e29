"""The rollout engine on the real SmolLM2-135M-Instruct (slow: prepares the model once).

Method: greedy completions of chat-templated addition prompts must equal HF `generate` token for
token, stop at EOS with finish "stop", and answer a simple sum correctly.
"""

import pytest
import torch

from yatt.models import load_model, load_tokenizer
from yatt.rollout import HFGenerateEngine, RolloutEngine, SamplingParams


@pytest.mark.slow
def test_smollm2_greedy_matches_hf_and_stops_at_eos():
    torch.set_num_threads(1)
    model, tokenizer = load_model("smollm2"), load_tokenizer("smollm2")
    questions = ["What is 2 + 3?", "What is 41 + 17?", "What is 12 + 30?"]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{q} Answer with just the number."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for q in questions
    ]
    prompts.append(prompts[0])  # a duplicate, as in a GRPO group
    params = SamplingParams(max_new_tokens=16, greedy=True)
    ours = RolloutEngine(model, tokenizer).generate(prompts, params)
    reference = HFGenerateEngine(model, tokenizer).generate(prompts, params)
    assert [c.token_ids for c in ours] == [c.token_ids for c in reference]
    assert ours[0].finish_reason == "stop"
    assert ours[0].token_ids[-1] == tokenizer.eos_token_id
    assert "5" in ours[0].text
    assert ours[3].token_ids == ours[0].token_ids
