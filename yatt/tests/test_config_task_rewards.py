"""A built-in reward that cannot grade a built-in task's rows is refused when the config loads,
in one line naming both settings; every pair the check accepts does grade the task (a correct
completion scores 1), and every pair it refuses does not (it raises, or scores a correct
completion 0). Rewards of the user's own and rows from a file are never refused."""

import re
from functools import cache

import pytest

from yatt.config import load_config
from yatt.data import TASKS, generate_task
from yatt.errors import ConfigError
from yatt.rewards import REWARD_FNS, get_reward_fn

ACCEPTED = {
    "addition": {"math_answer", "math_boxed", "format"},
    "arithmetic": {"math_answer", "math_boxed", "format", "reasoning_gym"},
    "countdown": {"reasoning_gym"},
    "gsm8k_style": {"math_answer", "math_boxed", "format", "reasoning_gym"},
}
USER_REWARD = "yatt.control.workload:char_mix_reward"


def _correct_completion(task: str, reward: str, answer: str) -> str:
    """A right answer as `reward` asks for it; for countdown an equivalent expression other
    than the reference (any expression reaching the target with the numbers is correct)."""
    text = f"({answer})" if task == "countdown" else answer
    return f"\\boxed{{{text}}}" if reward == "math_boxed" else text


@cache
def _examples(task: str) -> list:
    return generate_task(task, 3, seed=5)


def _grades(task: str, reward: str) -> bool:
    fn = get_reward_fn(reward)
    for example in _examples(task):
        completion = _correct_completion(task, reward, example.answer)
        try:
            if fn(example.prompt, completion, **example.reward_fields()) != 1.0:
                return False
        except ValueError:  # e.g. "reference answer '3*4 - 2' is not a number"
            return False
    return True


@pytest.mark.parametrize("task", TASKS)
def test_every_built_in_pair_is_accepted_exactly_when_the_reward_grades_the_task(task):
    assert set(ACCEPTED) == set(TASKS)
    for reward in sorted(REWARD_FNS):
        overrides = [f"data.task={task}", f"reward.fns=[{reward}]", f"eval.reward_fn={reward}"]
        assert _grades(task, reward) == (reward in ACCEPTED[task]), (task, reward)
        if reward in ACCEPTED[task]:
            assert load_config("tiny_test", overrides).data.task == task
            continue
        with pytest.raises(ConfigError) as info:
            load_config("tiny_test", overrides)
        message = str(info.value)
        assert f"reward.fns='{reward}'" in message and f"data.task='{task}'" in message
        assert "\n" not in message and sorted(ACCEPTED[task])[0] in message


def test_the_evaluation_reward_is_checked_only_when_the_run_evaluates():
    countdown = ["data.task=countdown", "reward.fns=[reasoning_gym]"]
    message = "eval.reward_fn='math_answer' cannot grade data.task='countdown'"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("tiny_test", countdown)
    assert load_config("tiny_test", [*countdown, "eval.n=0"]).eval.reward_fn == "math_answer"
    assert load_config("tiny_test", [*countdown, "eval.reward_fn=reasoning_gym"])


def test_own_rewards_and_rows_from_a_file_are_never_refused(tmp_path):
    config = load_config("tiny_test", ["data.task=countdown", f"reward.fns=[{USER_REWARD}]",
                                       f"eval.reward_fn={USER_REWARD}"])  # fmt: skip
    assert config.reward.fns == (USER_REWARD,)
    rows = ["data.task=countdown", f"data.path={tmp_path / 'rows.jsonl'}"]
    assert load_config("tiny_test", rows).reward.fns == ("math_answer",)


def test_an_unknown_task_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"'data\.task'.*addition, arithmetic, countdown"):
        load_config("tiny_test", ["data.task=countdwn"])
