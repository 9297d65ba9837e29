"""ScalarHeadModel: shapes, padding-side independence, and the safetensors folder round trip.

Method: a tiny random Llama with the real SmolLM2 tokenizer (yatt.models.tiny_model); scores of
the same text must not depend on padding side; a saved folder must reload to identical outputs.
"""

import pytest
import torch

from yatt.errors import ModelError
from yatt.heads import ScalarHeadModel
from yatt.models import tiny_model

TEXTS = ["What is 12 + 30? 42", "hi"]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    model, tokenizer = tiny_model(seed=0)
    return ScalarHeadModel.from_causal_lm(model, seed=1), tokenizer


def _encode(tokenizer, side):
    tokenizer.padding_side = side
    return tokenizer(TEXTS, return_tensors="pt", padding=True)


def test_values_shape_and_padding_side_independence(model_and_tokenizer):
    head_model, tokenizer = model_and_tokenizer
    with torch.no_grad():
        left = _encode(tokenizer, "left")
        right = _encode(tokenizer, "right")
        values = head_model(left.input_ids, left.attention_mask)
        assert values.shape == left.input_ids.shape
        assert values.dtype == torch.float32
        left_scores = head_model.sequence_scores(left.input_ids, left.attention_mask)
        right_scores = head_model.sequence_scores(right.input_ids, right.attention_mask)
    torch.testing.assert_close(left_scores, right_scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(left_scores, values[:, -1])  # left padding: last column
    assert left_scores[0] != left_scores[1]


def test_save_load_round_trip(model_and_tokenizer, tmp_path):
    head_model, tokenizer = model_and_tokenizer
    batch = _encode(tokenizer, "left")
    folder = head_model.save(tmp_path / "rm", tokenizer)
    assert (folder / "model.safetensors").exists()
    assert (folder / "value_head.safetensors").exists()
    loaded = ScalarHeadModel.from_pretrained(folder)
    with torch.no_grad():
        expected = head_model(batch.input_ids, batch.attention_mask)
        torch.testing.assert_close(loaded(batch.input_ids, batch.attention_mask), expected)


def test_from_causal_lm_folder_gets_a_new_head(tmp_path):
    causal_lm, tokenizer = tiny_model(seed=0)
    causal_lm.save_pretrained(tmp_path / "lm")
    started = ScalarHeadModel.from_pretrained(tmp_path / "lm")
    reference = ScalarHeadModel.from_causal_lm(causal_lm, seed=0)
    batch = _encode(tokenizer, "left")
    with torch.no_grad():
        torch.testing.assert_close(
            started(batch.input_ids, batch.attention_mask),
            reference(batch.input_ids, batch.attention_mask),
        )


def test_gradients_reach_head_and_backbone(model_and_tokenizer):
    head_model, tokenizer = model_and_tokenizer
    batch = _encode(tokenizer, "right")
    head_model.zero_grad()
    head_model.sequence_scores(batch.input_ids, batch.attention_mask).sum().backward()
    assert head_model.head.weight.grad.abs().sum() > 0
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for p in head_model.backbone.parameters()
    )


def test_missing_folder_is_model_error(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        ScalarHeadModel.from_pretrained(tmp_path / "nope")


def test_a_reward_model_needs_a_trained_head(model_and_tokenizer, tmp_path):
    # A plain causal LM folder as reward.model_path would score with a random head; a damaged
    # head file is one line too.
    causal_lm, _ = tiny_model(seed=0)
    causal_lm.save_pretrained(tmp_path / "lm")
    with pytest.raises(ModelError, match=r"reward.model_path=.*lm is not a trained reward model"):
        ScalarHeadModel.from_pretrained(tmp_path / "lm", trained_head="reward.model_path")
    head_model, tokenizer = model_and_tokenizer
    folder = head_model.save(tmp_path / "rm", tokenizer)
    assert ScalarHeadModel.from_pretrained(folder, trained_head="reward.model_path") is not None
    (folder / "value_head.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(ModelError, match=r"cannot load the head .*value_head\.safetensors"):
        ScalarHeadModel.from_pretrained(folder)
