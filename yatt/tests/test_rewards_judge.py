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
        ("Score: 15/10", None),  # off the scale: the judge did not follow the format
        ("Score: 85", None),  # a 0-100 scale: no score, not a clamped 1.0
        ("Score: -2", None),
        ("The question asks for 3/4 of 12. Score: ", None),  # cut off before its score
        ("The score is 8/10", 0.8),  # an N/D after the word
        ("I'd score it 7/10.", 0.7),
        ("no number", None),
        ("Score: 3/0", None),
        ("**Score:** 8", 0.8),  # markdown emphasis
        ("**Score**: 8/10", 0.8),
        ("__Score__ = 5", 0.5),
    ],
)
def test_parse_score(reply, expected):
    assert parse_score(reply) == (None if expected is None else pytest.approx(expected))


@pytest.mark.timeout(30)  # quadratic, 200k spaces take minutes; linear, milliseconds
def test_a_long_run_of_separators_is_scanned_in_linear_time():
    assert parse_score("score" + " " * 200_000) is None


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


def test_the_judge_quotes_the_question_not_the_policys_chat_markup():
    """A reward's `prompt` is the prompt as the policy saw it (chat template applied); the
    judge's template quotes the row's `question` (the prompt's own text) instead: the policy's
    <|im_start|> markup inside the judge's user turn would close that turn early."""
    from yatt.data import PromptExample, render_prompt

    _, tokenizer = tiny_model(seed=0)
    example = PromptExample("What is 6*7?", answer="42")
    rendered = render_prompt(example, tokenizer)
    assert "<|im_start|>" in rendered
    engine = FakeJudgeEngine(tokenizer)
    GenerativeJudge(engine, tokenizer).score_batch([rendered], ["42"], [example.reward_fields()])
    text = tokenizer.decode(engine.calls[0][0][0])
    assert "Question: What is 6*7?\nAnswer: 42" in text
    assert text.count("<|im_start|>user") == 1


def test_a_request_past_the_judge_models_positions_keeps_the_end_of_the_completion():
    model, tokenizer = tiny_model(seed=0)
    positions = model.config.max_position_embeddings
    engine = FakeJudgeEngine(tokenizer)
    engine.model = model  # the judge reads the positions of the engine's model
    judge = GenerativeJudge(engine, tokenizer)
    rambling = "blah " * positions + "Answer: 42"
    scores = judge.score_batch(["6*7?", "6*7?"], [rambling, "41"], [{}, {}])
    asked = engine.calls[0][0]
    assert all(len(ids) + judge.params.max_new_tokens <= positions for ids in asked)
    assert tokenizer.decode(asked[0]).count("blah") < positions
    assert judge.last_metrics["judge/truncated"] == 1.0 and scores[1] == 0.0
    huge_question = ["why " * positions]  # nothing of the completion can make it fit
    assert judge.score_batch(huge_question, ["42"], [{}]) == [0.0]
    assert judge.last_metrics["judge/parse_failures"] == 1.0


def test_a_template_with_a_stray_brace_is_refused_when_the_judge_is_built():
    _, tokenizer = tiny_model(seed=0)
    with pytest.raises(ValueError, match="judge template does not format"):
        GenerativeJudge(FakeJudgeEngine(tokenizer), tokenizer, "Put it in \\boxed{} {completion}")
