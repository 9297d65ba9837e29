"""Generative judge: score parsing, the fallback policy, and running through rollout engines.

Method: a fake engine beside the test answers from the prompt text (it sees what the judge
sent); one test runs yatt's real RolloutEngine on a tiny random model end to end.
"""

from dataclasses import dataclass

import pytest

from yatt.models import tiny_model
from yatt.rewards import CombinedReward, RewardError
from yatt.rewards.judge import GenerativeJudge, parse_score
from yatt.rollout import RolloutEngine, SamplingParams


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Score: 7/10", 0.7),
        ("score = 3", 0.3),
        ("I think SCORE: 8 / 10.", 0.8),
        ("Score: 4/5", 0.8),
        ("First 2/10, then on reflection Score: 9/10", 0.9),
        ("It deserves 6/10", 0.6),
        ("Score: 15/10", 1.0),
        ("Score: -2", 0.0),
        ("no number", None),
        ("Score: 3/0", None),
        ("**Score:** 8", 0.8),  # markdown emphasis
        ("**Score**: 8/10", 0.8),
        ("__Score__ = 5", 0.5),
    ],
)
def test_parse_score(reply, expected):
    assert parse_score(reply) == (None if expected is None else pytest.approx(expected))


@dataclass
class _Done:
    text: str


class FakeJudgeEngine:
    """Grades 9/10 when the judged answer contains the row's answer, replies noise otherwise."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = []

    def generate(self, prompt_ids, params, seeds=None):
        self.calls.append((prompt_ids, params, seeds))
        texts = [self.tokenizer.decode(ids) for ids in prompt_ids]
        return [_Done("Score: 9/10" if "Answer: 42" in t else "hmm, hard to say") for t in texts]


def test_judge_with_fake_engine_and_fallback():
    _, tokenizer = tiny_model(seed=0)
    engine = FakeJudgeEngine(tokenizer)
    judge = GenerativeJudge(engine, tokenizer)
    scores = judge.score_batch(["6*7?", "6*7?"], ["42", "41"], [{}, {}])
    assert scores == [pytest.approx(0.9), 0.0]
    assert judge.last_metrics["judge/parse_failures"] == 1.0
    prompt_ids, params, seeds = engine.calls[0]
    assert "<|im_start|>assistant" in tokenizer.decode(prompt_ids[0])  # chat template applied
    assert params.is_greedy and seeds == [0, 1]
    strict = GenerativeJudge(engine, tokenizer, fallback=None)
    with pytest.raises(RewardError, match=r"row 1 has no score: 'hmm, hard to say'"):
        strict.score_batch(["q", "q"], ["42", "0"], [{}, {}])


def test_judge_inside_combined_reward_uses_row_fields():
    _, tokenizer = tiny_model(seed=0)
    template = "Question: {prompt}\nAnswer: {completion}\nReference: {answer}"
    judge = GenerativeJudge(FakeJudgeEngine(tokenizer), tokenizer, template)
    combined = CombinedReward([("math_answer", 1.0), (judge, 0.5)])
    totals = combined(["6*7?"], ["42"], [{"answer": "42"}])
    assert totals == [pytest.approx(1.0 + 0.5 * 0.9)]
    assert combined.last_metrics["reward/judge/mean"] == pytest.approx(0.9)
    assert combined.last_metrics["judge/parse_failures"] == 0.0


def test_judge_through_real_rollout_engine():
    model, tokenizer = tiny_model(seed=0)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    judge = GenerativeJudge(RolloutEngine(model, tokenizer), tokenizer, params=params)
    scores = judge.score_batch(["What is 2 + 2?", "Name a colour."], ["4", "blue"], [{}, {}])
    assert len(scores) == 2 and all(0.0 <= score <= 1.0 for score in scores)
    failures = sum(parse_score(reply) is None for reply in judge.last_replies)
    assert judge.last_metrics["judge/parse_failures"] == failures
    again = judge.score_batch(["What is 2 + 2?", "Name a colour."], ["4", "blue"], [{}, {}])
    assert again == scores  # greedy judging is deterministic


def test_template_field_missing_names_row():
    _, tokenizer = tiny_model(seed=0)
    judge = GenerativeJudge(FakeJudgeEngine(tokenizer), tokenizer, "{prompt} {completion} {answer}")
    with pytest.raises(RewardError, match="field 'answer' missing on row 1"):
        CombinedReward([(judge, 1.0)])(["q", "q"], ["a", "b"], [{"answer": "1"}, {}])
