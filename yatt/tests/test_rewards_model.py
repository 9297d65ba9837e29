"""Bradley–Terry reward model training on a synthetic preference, and its batch scorer.

Method: a tiny random Llama backbone learns to prefer texts containing the word "banana";
the loss must fall and held-out pairwise accuracy must clearly beat chance (0.5).
"""

import random

import pytest
import torch

from yatt.errors import ConfigError
from yatt.heads import ScalarHeadModel
from yatt.models import tiny_model
from yatt.rewards import CombinedReward
from yatt.rewards.model import (
    RewardModelScorer,
    _padded,
    _token_rows,
    encode_texts,
    pair_scores,
    score_texts,
    train_reward_model,
)

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "tree"]


def _pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(4, 8))]
        chosen = list(sentence)
        chosen.insert(rng.randint(0, len(sentence)), "banana")
        pairs.append((" ".join(chosen), " ".join(sentence)))
    return pairs


def _accuracy(model, tokenizer, pairs) -> float:
    chosen = score_texts(model, tokenizer, [c for c, _ in pairs])
    rejected = score_texts(model, tokenizer, [r for _, r in pairs])
    return float((chosen > rejected).float().mean())


def test_bt_training_learns_synthetic_preference():
    torch.manual_seed(0)
    causal_lm, tokenizer = tiny_model(seed=0)
    model = ScalarHeadModel.from_causal_lm(causal_lm, seed=0)
    heldout = _pairs(64, seed=1)
    history = train_reward_model(
        model, tokenizer, _pairs(96, seed=0), epochs=3, batch_size=16, lr=1e-3, seed=0
    )
    assert len(history) == 3 * 6
    first = sum(h["loss"] for h in history[:3]) / 3
    last = sum(h["loss"] for h in history[-3:]) / 3
    assert last < 0.5 * first
    assert _accuracy(model, tokenizer, heldout) > 0.8
    scorer = RewardModelScorer(model, tokenizer)
    combined = CombinedReward([(scorer, 1.0)])
    totals = combined(["the cat ", "the cat "], ["sat banana", "sat down"], [{}, {}])
    assert totals[0] > totals[1]
    assert "reward/reward_model/mean" in combined.last_metrics


def test_encode_texts_keeps_the_end_and_appends_eos():
    _, tokenizer = tiny_model(seed=0)
    ids, mask = encode_texts(tokenizer, ["a b c d e f g", "x"], max_length=4, device="cpu")
    assert ids.shape == (2, 4)
    assert ids[0, -1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[0, :3]).strip().endswith("f g")
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    with pytest.raises(ConfigError, match="max_length"):
        encode_texts(tokenizer, ["a"], max_length=1, device="cpu")


def test_bad_pairs_are_config_errors():
    causal_lm, tokenizer = tiny_model(seed=0)
    model = ScalarHeadModel.from_causal_lm(causal_lm)
    with pytest.raises(ConfigError, match="at least one"):
        train_reward_model(model, tokenizer, [])
    with pytest.raises(ConfigError, match="pair 0"):
        train_reward_model(model, tokenizer, [("only one",)])


def test_a_tokenizer_without_eos_is_named_not_a_type_error():
    import copy

    from yatt.errors import ModelError

    _, tokenizer = tiny_model(seed=0)
    broken = copy.deepcopy(tokenizer)
    broken.eos_token = None
    with pytest.raises(ModelError, match="has no EOS token to score at"):
        encode_texts(broken, ["a", "b"], 16, "cpu")


def _backbone_rows(model) -> list[int]:
    """Rows of every backbone forward from now on (a forward pre-hook records them)."""
    seen: list[int] = []
    model.backbone.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    return seen


def _pair_passes(chosen: list[str], rejected: list[str]) -> list[int]:
    """The rows of each backbone pass `pair_scores` makes over these pairs, once its scores
    and their gradients were checked equal to those of the whole rows (up to rounding)."""
    causal_lm, tokenizer = tiny_model(seed=0)
    model = ScalarHeadModel.from_causal_lm(causal_lm, seed=0)
    rows = _token_rows(tokenizer, chosen + rejected, 512)
    seen = _backbone_rows(model)
    shared = pair_scores(model, tokenizer, rows)
    passes = list(seen)
    shared.square().sum().backward()
    shared_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    whole = model.sequence_scores(*_padded(rows, tokenizer, torch.device("cpu")))
    whole.square().sum().backward()
    assert torch.allclose(shared, whole, atol=1e-5)
    for got, want in zip(shared_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    return passes


def test_pair_scores_run_a_shared_prompt_once_and_equal_whole_rows() -> None:
    """Chosen and rejected texts of a prompt: the prompt's tokens run once per pair."""
    prompts = ["What is 2 + 3? Answer:", "Name a colour, please:", "Q"]
    chosen = [p + " five" for p in prompts[:2]] + ["Q yes indeed"]
    rejected = [p + " six or seven" for p in prompts[:2]] + ["Q no"]
    # the prefixes once (3 rows), then the 6 suffixes on their cache
    assert _pair_passes(chosen, rejected) == [3, 6]


def test_pair_scores_run_the_start_every_prompt_shares_once() -> None:
    """Prompts that begin alike (a chat template's system turn): that start runs once, each
    pair's rest of its prompt once on it, then the responses."""
    system = "You are a careful assistant who answers with numbers only. "
    prompts = [system + p for p in ("What is 2 + 3? Answer:", "Name a colour, please:", "Q")]
    chosen = [p + " five" for p in prompts]
    rejected = [p + " six or seven" for p in prompts]
    # the start, the 3 prompts' rests, the 6 responses
    assert _pair_passes(chosen, rejected) == [1, 3, 6]


def test_pairs_without_a_common_prefix_run_whole() -> None:
    causal_lm, tokenizer = tiny_model(seed=0)
    model = ScalarHeadModel.from_causal_lm(causal_lm, seed=0)
    rows = _token_rows(tokenizer, ["same start a", "x", "same start b", "y"], 512)
    seen = _backbone_rows(model)
    scores = pair_scores(model, tokenizer, rows)  # the second pair shares no token
    assert seen == [4] and scores.shape == (4,)


def test_scores_of_grouped_texts_equal_their_whole_rows() -> None:
    """Completions of one prompt share its pass (score_texts with groups, as RLHF scores a
    group's samples): the same scores as text by text, chunks cutting a group included."""
    causal_lm, tokenizer = tiny_model(seed=0)
    model = ScalarHeadModel.from_causal_lm(causal_lm, seed=0)
    prompts = ["Add 2 and 3:"] * 3 + ["Say hi:"] * 2 + ["x"]
    completions = [" 5", " five", " 6 maybe", " hi", " hello there", "y"]
    texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    whole = score_texts(model, tokenizer, texts, batch_size=4)
    seen = _backbone_rows(model)
    grouped = score_texts(model, tokenizer, texts, batch_size=4, groups=prompts)
    assert seen == [2, 4, 2, 2]  # per chunk: the prefixes, then the rows on their cache
    assert torch.allclose(grouped, whole, atol=1e-5)
    scorer = RewardModelScorer(model, tokenizer, batch_size=4)
    assert scorer.score_batch(prompts, completions, [{}] * 6) == pytest.approx(
        whole.tolist(), abs=1e-5
    )
