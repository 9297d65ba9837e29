"""Rule rewards, the registry and CombinedReward.

Method: checker cases for numbers written in many ways, weighted sums with per-component
metrics, and each error path (unknown name, a fn that raises, a fn returning a non-number).
"""

import math
import re

import pytest

from yatt.data import generate_task
from yatt.errors import ConfigError
from yatt.rewards import REWARD_FNS, CombinedReward, RewardError, get_reward_fn
from yatt.rewards.math import extract_boxed, extract_last_number, math_answer, math_boxed


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("68", "68", 1.0),
        ("The answer is 68.", "68", 1.0),
        ("23 + 45 = 68", "68", 1.0),
        ("68 is wrong, it is 69", "68", 0.0),
        ("Total: 1,234.", "1234", 1.0),
        ("It is -5", "-5", 1.0),
        ("10-3 gives 7", "7", 1.0),
        ("10-3", "-3", 0.0),
        ("2.50", "2.5", 1.0),
        ("42.0", "42", 1.0),
        ("no digits here", "5", 0.0),
        ("", "5", 0.0),
        ("The answer is \u22125", "-5", 1.0),  # the minus sign
        ("The answer is \u22125", "5", 0.0),
        ("The answer is 3/4", "3/4", 1.0),  # a fraction is one number
        ("The answer is 3/4", "4", 0.0),
        ("The answer is 3/4.", "3/4", 1.0),  # ending a sentence too
        ("so 1/2.5", "2.5", 1.0),  # not a fraction: a decimal follows
        ("It is 0.5", r"\frac{1}{2}", 1.0),  # a LaTeX reference answer
        ("About 50", "50%", 1.0),
        # the stated answer wins over a later number, and LaTeX and units read as written
        (r"x = $\frac{1}{2}$", "2", 0.0),  # a LaTeX fraction is one number
        (r"x = $\frac{1}{2}$", "1/2", 1.0),
        ("12 cm^2", "2", 0.0),  # an exponent is no answer
        ("12 cm^2", "12", 1.0),
        (r"\boxed{42}. Check: 42/6 = 7", "7", 0.0),  # the boxed answer, not the check
        (r"\boxed{42}. Check: 42/6 = 7", "42", 1.0),
        ("The answer is 7. Check: 3 + 4 = 7, so 2 halves", "7", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("Let me find the answer: first, 3 + 4 = 7", "7", 1.0),  # a mark with words after it
        (r"\boxed{3\frac{1}{2}}", "7/2", 1.0),  # a mixed number
        (r"\boxed{3\frac{1}{2}}", "15.5", 0.0),
        (r"\boxed{1 2}", "12", 0.0),  # two numbers, not twelve
        (r"\boxed{1 000}", "1000", 1.0),  # a thousands space
    ],
)
def test_math_answer_cases(completion, answer, expected):
    assert math_answer("What is it?", completion, answer=answer) == expected


def test_extract_helpers():
    assert extract_last_number("a 1,000,000 b") == 1_000_000
    assert extract_last_number("x") is None
    assert extract_boxed(r"so \boxed{\frac{1}{2}} and \boxed{7}") == "7"
    assert extract_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{unclosed") is None


def test_math_boxed_cases():
    assert math_boxed("q", r"so \boxed{1,234}.", answer="1234") == 1.0
    assert math_boxed("q", r"\boxed{ x + 1 }", answer="x+1") == 1.0
    assert math_boxed("q", "1234", answer="1234") == 0.0
    assert math_boxed("q", r"\boxed{5}", answer="6") == 0.0
    for boxed, answer in ((r"\frac{1}{2}", "1/2"), (r"\dfrac{3}{4}", "0.75"), (r"\text{42}", 42),
                          (r"42\%", "42"), ("{5}", "5"), ("\u22125", -5), (r"\$5", 5),
                          ("1{,}000", 1000), (r"1\,000", 1000), ("x = 5", 5),
                          (r"5\text{ cm}", 5), (r"3\mathrm{kg}", "3")):  # fmt: skip
        assert math_boxed("q", rf"so \boxed{{{boxed}}}", answer=answer) == 1.0, boxed
    assert math_boxed("q", r"\boxed{1,2}", answer="12") == 0.0  # two answers, not twelve
    assert math_boxed("q", r"\boxed{6\frac{1}{4}}", answer=r"\frac{25}{4}") == 1.0
    assert math_boxed("q", r"\boxed{61/4}", answer=r"6\frac{1}{4}") == 0.0
    with pytest.raises(ValueError, match="non-empty 'answer'"):  # an empty box would match
        math_boxed("q", r"\boxed{}", answer=" ")


def test_format_reward_is_opt_in_and_configurable():
    only_number = get_reward_fn("format")
    assert only_number("q", " 68.") == 1.0
    assert only_number("q", "The answer is 68") == 0.0
    # the numbers math_answer reads: fractions, a leading point; not a trail of commas
    assert [only_number("q", text) for text in ("3/4", "-.5", "5,,,,")] == [1.0, 1.0, 0.0]
    boxed = get_reward_fn("format", pattern=r".*\\boxed\{.+\}.*")
    assert boxed("q", r"so \boxed{3}") == 1.0


def test_reasoning_gym_reward_uses_dataset_checker():
    example = generate_task("arithmetic", 1, seed=2)[0]
    scorer = get_reward_fn("reasoning_gym")
    fields = example.reward_fields()
    assert scorer(example.prompt, f"work...\n{example.answer}", **fields) == 1.0
    assert scorer(example.prompt, "<answer>123456789</answer>", **fields) < 1.0


def test_registry_errors():
    assert {"math_answer", "math_boxed", "format"} <= set(REWARD_FNS)
    with pytest.raises(ConfigError, match=r"'exact'.*math_answer"):
        get_reward_fn("exact")
    with pytest.raises(ConfigError, match="takes no options"):
        get_reward_fn("math_answer", strict=True)
    with pytest.raises(ConfigError, match="bad options"):
        get_reward_fn("format", regex="x")


def length_bonus(prompt, completion, **fields):
    return len(completion) / 10


def test_combined_reward_weights_and_metrics():
    combined = CombinedReward([("math_answer", 1.0), (length_bonus, 0.5)])
    rows = [{"answer": "5"}, {"answer": "6"}]
    totals = combined(["q1", "q2"], ["5", "it is 7"], rows)
    # row 0: 1 * 1 + 0.5 * 0.1 = 1.05; row 1: 0 + 0.5 * 0.7 = 0.35
    assert [round(t, 6) for t in totals] == [1.05, 0.35]
    metrics = combined.last_metrics
    assert math.isclose(metrics["reward/math_answer/mean"], 0.5)
    assert math.isclose(metrics["reward/length_bonus/mean"], 0.4)
    assert math.isclose(metrics["reward/total/mean"], 0.7)


def test_numpy_and_torch_scalars_are_numbers():
    import numpy as np
    import torch

    for value in (np.float32(0.5), np.int64(1), torch.tensor(0.25)):
        assert CombinedReward([(lambda p, c, v=value, **f: v, 1.0)])(["p"], ["a"], [{}]) == [
            float(value)
        ]
    with pytest.raises(RewardError, match="need a number"):
        CombinedReward([(lambda p, c, **f: torch.tensor([0.5, 0.5]), 1.0)])(["p"], ["a"], [{}])


def test_combined_reward_errors_name_fn_and_row():
    def broken(prompt, completion, **fields):
        raise ValueError("boom\nsecond line")

    def wrong_type(prompt, completion, **fields):
        return "1.0" if completion == "b" else 1.0

    with pytest.raises(RewardError, match=r"'broken' raised ValueError: boom second line on row 0"):
        CombinedReward([(broken, 1.0)])(["p"], ["a"], [{}])
    with pytest.raises(RewardError, match=r"'wrong_type' returned '1.0' \(str\) on row 1"):
        CombinedReward([(wrong_type, 1.0)])(["p", "p"], ["a", "b"], [{}, {}])
    with pytest.raises(RewardError, match=r"'math_answer' raised ValueError.*answer.*row 0"):
        CombinedReward([("math_answer", 1.0)])(["p"], ["5"], [{"answer": None}])
    with pytest.raises(RewardError, match="returned nan"):
        CombinedReward([(lambda p, c, **f: float("nan"), 1.0)])(["p"], ["a"], [{}])
    with pytest.raises(RewardError, match=r"returned 1000.* on row 0; need a finite number"):
        CombinedReward([(lambda p, c, **f: 10**400, 1.0)])(["p"], ["a"], [{}])  # past float
    with pytest.raises(ConfigError, match="at least one"):
        CombinedReward([])
    with pytest.raises(ConfigError, match="weight must be a number"):
        CombinedReward([("math_answer", "1")])


def test_batch_scorers_declare_the_counts_the_controllers_sum():
    from yatt.config import RewardConfig
    from yatt.roles.reward import RewardRole

    class Judge:
        name = "judge"
        metric_names = ("judge/parse_failures",)

        def score_batch(self, prompts, completions, rows):
            return [1.0] * len(prompts)  # this call set no last_metrics

    role = RewardRole(RewardConfig(fns=("format",)), extra=[(Judge(), 1.0)])
    assert role.combined.counted_metrics == ("judge/parse_failures",)
    role.combined(["p"], ["<answer>1</answer>"], [{}])
    metrics = role.combined.last_metrics
    summable = role.summable_metrics(metrics | {"other/x": 3.0})
    assert summable["judge/parse_failures"] == 0.0  # left out: 0, so every rank has the key
    assert (
        "other/x" not in summable and summable["reward/total/mean"] == metrics["reward/total/mean"]
    )

    class Bad:
        metric_names = ("reward/mine",)

        def score_batch(self, prompts, completions, rows):
            return []

    with pytest.raises(ConfigError, match=r"metric_names \['reward/mine'\]: reward/\* names"):
        CombinedReward([(Bad(), 1.0)])
    Bad.metric_names = None
    with pytest.raises(ConfigError, match="metric_names must be a tuple of names, got None"):
        CombinedReward([(Bad(), 1.0)])


def test_two_scorers_counts_add_up_and_stray_reward_keys_stay_out():
    class Judge:
        name = "judge"
        metric_names = ("judge/parse_failures",)

        def __init__(self, failures):
            self.failures = failures

        def score_batch(self, prompts, completions, rows):
            self.last_metrics = {"judge/parse_failures": self.failures, "reward/stray": 9.0}
            return [0.0] * len(prompts)

    from yatt.config import RewardConfig
    from yatt.roles.reward import RewardRole

    role = RewardRole(RewardConfig(fns=("format",)), extra=[(Judge(2.0), 1.0), (Judge(3.0), 1.0)])
    role.combined(["p"], ["x"], [{}])
    metrics = role.combined.last_metrics
    assert metrics["judge/parse_failures"] == 5.0 and "reward/stray" not in metrics
    assert sorted(role.summable_metrics(metrics | {"reward/other": 1.0})) == [
        "judge/parse_failures", "reward/format/mean", "reward/judge/mean",
        "reward/judge_2/mean", "reward/total/mean",
    ]  # fmt: skip


class _Scorer:
    """A batch scorer returning ``result`` and setting ``metrics`` (a misbehaving one)."""

    name = "scorer"

    def __init__(self, result, metrics=None):
        self.result, self.last_metrics = result, metrics or {}

    def score_batch(self, prompts, completions, rows):
        return self.result(len(prompts)) if callable(self.result) else self.result


@pytest.mark.parametrize(
    ("result", "says"),
    [
        (None, "returned NoneType None; need a list of 2 numbers, one per row"),
        (lambda n: (1.0 for _ in range(n)), "returned generator"),
        ({0: 1.0, 1: 1.0}, "returned dict {0: 1.0, 1: 1.0}; need a list of 2 numbers"),
        ("11", "returned str '11'"),
    ],
    ids=["none", "generator", "dict", "str"],
)
def test_a_batch_scorer_must_return_one_number_per_row(result, says):
    reward = CombinedReward([(_Scorer(result), 1.0)])
    with pytest.raises(RewardError, match=re.escape(says)):
        reward(["p", "q"], ["a", "b"], [{}, {}])
    good = CombinedReward([(_Scorer([1.0, 2.0]), 1.0)])
    assert good(["p", "q"], ["a", "b"], [{}, {}]) == [1.0, 2.0]


def test_a_batch_scorers_metric_must_be_a_number():
    reward = CombinedReward([(_Scorer([1.0], {"judge/mood": "grumpy"}), 1.0)])
    with pytest.raises(RewardError, match="set its metric 'judge/mood' to str 'grumpy'"):
        reward(["p"], ["a"], [{}])


def test_rewards_beyond_float32s_reach_are_refused():
    """1e38 is finite, yet its square overflows the float32 advantages (non-finite, a crash
    mid-run); a score, or a weighted sum, beyond +-1e15 is refused naming it."""
    with pytest.raises(RewardError, match=r"returned 2e\+38 on row 0; need a number within"):
        CombinedReward([(lambda p, c: 2e38, 1.0)])(["p"], ["a"], [{}])
    with pytest.raises(RewardError, match=r"the weighted sum of reward\.fns returned"):
        CombinedReward([(lambda p, c: 1e14, 100.0)])(["p"], ["a"], [{}])
    assert CombinedReward([(lambda p, c: -1e15, 1.0)])(["p"], ["a"], [{}]) == [-1e15]


def test_a_reward_that_calls_sys_exit_is_named_not_obeyed():
    def leaves(prompt, completion):
        raise SystemExit("bye")

    with pytest.raises(RewardError, match="reward 'leaves' raised SystemExit: bye on row 0"):
        CombinedReward([(leaves, 1.0)])(["p"], ["a"], [{}])
