"""A built-in reward that cannot grade a built-in task's rows is refused before a run that would
use it starts (`check_rewards_grade_task`, called by the trainer, the controllers and `yatt
eval`), in one line naming both settings; every pair the check accepts does grade the task (a
correct completion scores 1), and every pair it refuses does not (it raises, or scores a correct
completion 0). Rewards of the user's own and rows from a file are never refused, and SFT, which
uses no reward, is not checked."""

import json
import re
from functools import cache

import pytest

from yatt.config import load_config
from yatt.data import TASKS, generate_task
from yatt.errors import ConfigError
from yatt.rewards import REWARD_FNS, get_reward_fn
from yatt.run_checks import check_rewards_grade_task

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
        config = load_config("tiny_test", overrides)  # loading checks no reward
        if reward in ACCEPTED[task]:
            check_rewards_grade_task(config)
            continue
        with pytest.raises(ConfigError) as info:
            check_rewards_grade_task(config)
        message = str(info.value)
        assert f"reward.fns='{reward}'" in message and f"data.task='{task}'" in message
        assert "\n" not in message and sorted(ACCEPTED[task])[0] in message


def test_the_evaluation_reward_is_checked_only_where_it_is_used():
    countdown = ["data.task=countdown", "reward.fns=[reasoning_gym]"]
    message = "eval.reward_fn='math_answer' cannot grade data.task='countdown'"
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_rewards_grade_task(load_config("tiny_test", countdown))  # the run evaluates
    check_rewards_grade_task(load_config("tiny_test", [*countdown, "eval.n=0"]))  # it does not
    check_rewards_grade_task(load_config("tiny_test", [*countdown, "eval.reward_fn=reasoning_gym"]))
    # `yatt eval` grades with eval.reward_fn alone, whatever reward.fns says
    only_eval = load_config("tiny_test", ["data.task=countdown", "eval.reward_fn=reasoning_gym"])
    check_rewards_grade_task(only_eval, train=False, evaluate=True)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_rewards_grade_task(load_config("tiny_test", ["data.task=countdown", "eval.n=0"]),
                                 train=False, evaluate=True)  # fmt: skip


def test_a_countdown_config_with_default_rewards_loads_for_sft():
    """SFT reads neither reward setting, so loading (what `yatt sft` does) refuses nothing."""
    assert load_config("tiny_test", ["data.task=countdown"]).reward.fns == ("math_answer",)


def test_own_rewards_and_rows_from_a_file_are_never_refused(tmp_path):
    config = load_config("tiny_test", ["data.task=countdown", f"reward.fns=[{USER_REWARD}]",
                                       f"eval.reward_fn={USER_REWARD}"])  # fmt: skip
    check_rewards_grade_task(config, evaluate=True)
    rows = ["data.task=countdown", f"data.path={tmp_path / 'rows.jsonl'}"]
    check_rewards_grade_task(load_config("tiny_test", rows), evaluate=True)
    # with rows from a file, data.task is not used: any name loads
    assert load_config("tiny_test", ["data.task=mine", f"data.path={tmp_path / 'r.jsonl'}"])


def test_an_unknown_task_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"'data\.task'.*addition, arithmetic, countdown"):
        load_config("tiny_test", ["data.task=countdwn"])


def test_training_entry_points_refuse_a_mismatch_before_any_work(tmp_path):
    from yatt.control import fit_distributed
    from yatt.trainer import Trainer

    config = load_config("tiny_test", ["data.task=countdown", f"logging.run_dir={tmp_path}/r"])
    message = "reward.fns='math_answer' cannot grade data.task='countdown'"
    with pytest.raises(ConfigError, match=re.escape(message)):
        Trainer(config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        fit_distributed(config, config.control)
    assert not (tmp_path / "r").exists()  # refused before the run folder was claimed


def test_a_file_row_without_the_answer_a_reward_grades_against_is_refused_up_front(tmp_path):
    # It used to fail only at that row's first reward: steps (or hours) in.
    from yatt.data import load_prompts
    from yatt.errors import DataError
    from yatt.run_checks import check_rows_have_answers
    from yatt.trainer import Trainer

    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": f"What is {a} + 1?", "answer": a + 1} for a in range(20)]
    path.write_text("".join(json.dumps(row) + "\n" for row in [*rows, {"prompt": "What is?"}]))
    examples = list(load_prompts(path))
    config = load_config("tiny_test", [f"data.path={path}", f"logging.run_dir={tmp_path}/r"])
    message = (f"{path}:21: reward.fns='math_answer' grades each row against its 'answer' "
               "field, which this row lacks or leaves blank (give each row an answer, or use a "
               "reward of your "
               "own in reward.fns)")  # fmt: skip
    with pytest.raises(DataError, match=re.escape(message)):
        check_rows_have_answers(config, examples, [])
    with pytest.raises(DataError, match=re.escape("leaves blank (set eval.reward_fn=package.")):
        check_rows_have_answers(config, [], examples, train=False, evaluate=True)
    own = load_config("tiny_test", [f"data.path={path}", f"reward.fns=[{USER_REWARD}]"])
    check_rows_have_answers(own, examples, [])  # the user's reward decides what it needs
    everywhere = load_config("tiny_test", [f"data.path={path}", "data.n_heldout=0", "eval.n=0",
                                           f"logging.run_dir={tmp_path}/r"])  # fmt: skip
    with pytest.raises(DataError, match=re.escape(message)):
        Trainer(everywhere)  # before any step
    # math_answer compares numbers: an answer that reads as none is refused as early
    path.write_text(
        "".join(json.dumps(row) + "\n" for row in [*rows, {"prompt": "Length?", "answer": "5 cm"}])
    )
    with pytest.raises(DataError, match=re.escape(
        f"{path}:21: reward.fns='math_answer' compares numbers, and this row's reference "
        "answer '5 cm' is not a number (math_boxed compares text too)"
    )):  # fmt: skip
        check_rows_have_answers(config, list(load_prompts(path)), [])


def test_rows_a_reward_cannot_grade_are_refused_before_the_run_starts(tmp_path):
    """A blank answer under math_boxed, or a file row without reasoning_gym's fields, failed
    only when the row was drawn mid-run: after logging.overwrite had deleted the last run."""
    from yatt.data import load_prompts
    from yatt.errors import DataError
    from yatt.run_checks import check_rows_have_answers

    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "What is 3 + 1?", "answer": "4"}, {"prompt": "And 2 + 2?", "answer": " "}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    examples = list(load_prompts(path))
    boxed = load_config("tiny_test", [f"data.path={path}", "reward.fns=[math_boxed]"])
    with pytest.raises(DataError, match=re.escape(f"{path}:2: reward.fns='math_boxed'")):
        check_rows_have_answers(boxed, examples, [])
    gym = load_config("tiny_test", [f"data.path={path}", "reward.fns=[reasoning_gym]"])
    with pytest.raises(DataError, match=r"lacks \['rg_dataset', 'metadata'\]"):
        check_rows_have_answers(gym, examples[:1], [])
