"""`yatt rm`: a Bradley–Terry reward model from preference pairs (a file's prompt/chosen/
rejected rows, or pairs made from a task's answers and the model's own scored samples), saved
where `reward.model_path` loads it; bad rows and settings it does not read are one-line errors
before the run folder is claimed."""

import json

import pytest
import torch

from yatt.cli import main
from yatt.config import load_config
from yatt.errors import ConfigError, DataError
from yatt.heads import ScalarHeadModel
from yatt.models import tiny_model
from yatt.pairs import PreferencePair, _sampled_pair, preference_pairs, sampled_responses
from yatt.report import load_history, summary_table
from yatt.rewards.model import train_reward_model
from yatt.rm import _heldout_metrics, run_reward_model

FAST = ["train.steps=4", "data.n_train=24", "data.n_heldout=8", "eval.n=8",
        "algo.micro_batch_size=4"]  # fmt: skip


def _write_pairs(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_task_makes_pairs_of_its_answer_over_a_nearby_wrong_number() -> None:
    from yatt.builders import build_data

    config = load_config("tiny_test", ["data.task=addition"])
    _, tokenizer = tiny_model(seed=0)
    train, _ = build_data(config.data)
    pairs = preference_pairs(train, tokenizer, config)
    assert len(pairs) == len(train)
    for example, pair in zip(train, pairs, strict=True):
        assert pair.chosen == example.answer
        assert int(pair.rejected) - int(pair.chosen) in (-11, -10, -9, -2, -1, 1, 2, 9, 10, 11)
        assert example.question() in pair.prompt  # the prompt as the policy sees it
        assert pair.texts() == (pair.prompt + pair.chosen, pair.prompt + pair.rejected)
    # the same seed makes the same pairs
    assert preference_pairs(train, tokenizer, config) == pairs


@pytest.mark.parametrize(
    ("row", "problem"),
    [({"prompt": "2+2?", "chosen": "4"}, "needs 'rejected', a non-empty string"),
     ({"prompt": "2+2?", "chosen": "4", "rejected": 5}, "it is int 5"),
     ({"prompt": "2+2?", "chosen": " ", "rejected": "5"}, "needs 'chosen'"),
     ({"prompt": "2+2?", "chosen": "4", "rejected": "4"}, "the same text: no preference")],
)  # fmt: skip
def test_a_bad_preference_row_is_one_line_naming_file_and_line(tmp_path, row, problem) -> None:
    path = tmp_path / "pairs.jsonl"
    good = {"prompt": "1+1?", "chosen": "2", "rejected": "3"}
    _write_pairs(path, [good] * 11 + [row])
    config = load_config("tiny_test", [f"data.path={path}", "data.n_heldout=2", "eval.n=2",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    with pytest.raises(DataError) as info:
        run_reward_model(config)
    message = str(info.value)
    assert f"{path}:12: " in message and problem in message and "\n" not in message
    assert not (tmp_path / "run").exists()  # refused before the run folder was claimed


def test_a_reward_model_trains_saves_and_loads_as_reward_model_path(tmp_path) -> None:
    path = tmp_path / "pairs.jsonl"
    words = ("yes", "sure", "ok", "fine") * 4
    rows = [{"prompt": [{"role": "user", "content": f"Say {w}."}], "chosen": f"{w}!",
             "rejected": "no", "topic": "echo"} for w in words]  # fmt: skip
    _write_pairs(path, rows)
    run_dir = tmp_path / "rm"
    config = load_config("tiny_test", [*FAST, f"data.path={path}", "data.n_heldout=4",
                                       "eval.n=4", f"logging.run_dir={run_dir}"])  # fmt: skip
    seen = []
    folder = run_reward_model(config, progress=lambda step, total, row: seen.append(step))
    assert folder == run_dir / "reward_model" and seen == [1, 2, 3, 4]
    model = ScalarHeadModel.from_pretrained(folder, trained_head="reward.model_path")
    assert isinstance(model, ScalarHeadModel) and (folder / "config.yaml").is_file()
    history = load_history(run_dir)
    assert [row["step"] for row in history] == [0, 1, 2, 3, 4]
    assert {"rm/heldout_accuracy", "rm/heldout_margin"} <= set(history[0]) & set(history[-1])
    assert all("rm/loss" in row for row in history[1:])
    assert summary_table(history, []).title == "yatt rm summary"
    # RLHF with it: the reward role scores with the saved model
    from yatt.config import RewardConfig
    from yatt.roles.reward import RewardRole

    role = RewardRole(RewardConfig(fns=(), model_path=str(folder)))
    assert role.combined is not None
    # a fresh run into the folder is refused, as for the other jobs
    with pytest.raises(ConfigError, match="already holds a run"):
        run_reward_model(config)


@pytest.mark.parametrize(
    ("override", "problem"),
    [("checkpoint.every=2", "keeps no checkpoints"),
     ("control.backend=ray", "yatt rm runs in one process"),
     ("model.lora_rank=4", "does not act on model.lora_rank"),
     ("train.time_limit_s=60", "does not act on train.time_limit_s"),
     ("eval.every=2", "does not act on eval.every"),
     ("data.task=countdown", "whole-number answers"),
     ("model.path=/nonexistent/model", "/nonexistent/model"),
     ("data.rejected=sideways", "'data.rejected'; expected one of slips, samples, both"),
     ("data.rejected=samples data.task=countdown", "cannot grade data.task='countdown'"),
     ("data.rejected=samples reward.fns=[] reward.model_path=/x", "reward.fns, which is empty"),
     ("data.rejected=samples reward.model_path=/x", "drop reward.model_path"),
     ("data.rejected=samples rollout.backend=vllm", "rollout.backend=yatt or hf"),
     ("data.rejected=both data.path=/x.jsonl", "a data.path file gives its own chosen")],
)  # fmt: skip
def test_yatt_rm_refuses_what_it_cannot_do_in_one_line(tmp_path, capsys, override, problem):
    run_dir = tmp_path / "run"
    argv = ["rm", "tiny_test", *FAST, *override.split(), f"logging.run_dir={run_dir}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("yatt: error: ") and problem in err[-1], err
    assert not run_dir.exists()  # no empty run folder left behind


def test_yatt_rm_on_the_command_line_prints_its_summary(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["rm", "tiny_test", *FAST, "data.task=addition", "logging.plots=true",
                 f"logging.run_dir={run_dir}"]) == 0  # fmt: skip
    err = capsys.readouterr().err  # (the report's console is stderr, as for yatt train)
    assert "yatt rm summary" in err and "held-out pairs ranked right, step 0" in err
    assert (run_dir / "rm.png").stat().st_size > 0
    assert (run_dir / "reward_model" / "config.json").is_file()


def test_train_reward_model_takes_a_number_of_steps_across_passes() -> None:
    causal_lm, tokenizer = tiny_model(seed=0)
    model = ScalarHeadModel.from_causal_lm(causal_lm, seed=0)
    pairs = [("a b", "a c"), ("b b", "b c"), ("c b", "c c")]
    steps = []
    history = train_reward_model(model, tokenizer, pairs, steps=5, batch_size=2,
                                 on_step=lambda step, row: steps.append(step))  # fmt: skip
    assert len(history) == 5 and steps == [1, 2, 3, 4, 5]  # 2 steps a pass over 3 pairs
    assert all(row["step_s"] > 0 for row in history) and not model.training
    assert torch.isfinite(torch.tensor([row["loss"] for row in history])).all()


def test_a_reward_model_from_yatt_rm_drives_a_grpo_run(tmp_path) -> None:
    """RLHF end to end: `yatt rm` trains a reward model, and a GRPO run scores with it alone
    (`reward.fns=[]`): every step logs the reward model's mean score as its reward."""
    from yatt.trainer import Trainer

    folder = run_reward_model(
        load_config(
            "tiny_test", [*FAST, "data.task=addition", f"logging.run_dir={tmp_path / 'rm'}"]
        )
    )
    config = load_config("tiny_test", ["reward.fns=[]", f"reward.model_path={folder}",
                                       f"logging.run_dir={tmp_path / 'rl'}"])  # fmt: skip
    steps = [row for row in Trainer(config).fit().history if "timing_s/step" in row]
    assert len(steps) == config.train.steps
    for row in steps:
        assert row["critic/score/mean"] == pytest.approx(row["reward/reward_model/mean"])


@pytest.mark.parametrize(
    ("own", "reference_score", "pair"),
    [([(0.0, "7"), (1.0, "12"), (0.0, "3")], 1.0, ("12", "7")),  # worst under best, first ties
     ([(0.0, "7"), (0.0, "3")], 1.0, ("12", "7")),  # all alike: under the reference
     ([(1.0, "12"), (1.0, "12.0")], 1.0, None),  # all as good as the reference: no pair
     ([(0.0, "12"), (0.0, "12")], 1.0, None)],  # the reference itself is no preference
)  # fmt: skip
def test_a_sampled_pair_is_the_worst_completion_under_the_best_or_the_reference(
    own, reference_score, pair
) -> None:
    assert _sampled_pair(own, "12", reference_score) == pair


def test_sampled_pairs_are_the_models_own_completions_scored_by_reward_fns(
    tmp_path, monkeypatch
) -> None:
    """A reward scoring longer completions higher: each prompt's pair is its longest sample
    over its shortest (never the reference), the same for the same seeds."""
    from yatt.builders import build_data

    (tmp_path / "length_reward.py").write_text(
        "def score(prompt, completion, **fields):\n    return min(len(completion), 99) / 99\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config("tiny_test", ["data.n_train=6", "data.n_heldout=2",
                                       "rollout.n_samples=3", "data.rejected=samples",
                                       "reward.fns=[length_reward:score]"])  # fmt: skip
    causal_lm, tokenizer = tiny_model(seed=0)
    train, _ = build_data(config.data)
    counts: list[int] = []
    pairs, best = sampled_responses(causal_lm, tokenizer, train, config, advance=counts.append)
    assert len(pairs) == len(train) and sum(counts) == 3 * len(train)  # the progress bar's
    for example, (chosen, rejected) in zip(train, pairs, strict=True):
        assert len(chosen) > len(rejected) and example.answer not in (chosen, rejected)
    assert best > 0  # the reference is short: samples beat it
    # each example's samples are its own: the same whatever examples come with it
    assert sampled_responses(causal_lm, tokenizer, train, config) == (pairs, best)
    assert sampled_responses(causal_lm, tokenizer, train[:2], config)[0] == pairs[:2]
    assert sampled_responses(causal_lm, tokenizer, train[:2], config, "heldout")[0] != pairs[:2]


def test_held_out_accuracy_per_kind_takes_the_slip_pairs_first(monkeypatch) -> None:
    """Slip pairs scored right, sampled ones wrong: each kind's share is its own."""
    scores = {"p+good": 1.0, "p+bad": 0.0}
    monkeypatch.setattr(
        "yatt.rewards.model.score_texts",
        lambda model, tokenizer, texts, groups: torch.tensor([scores[t] for t in texts]),
    )
    slips = [PreferencePair("p+", "good", "bad")] * 3
    samples = [PreferencePair("p+", "bad", "good")] * 2
    row = _heldout_metrics(None, None, slips + samples, slips=3)
    assert row["rm/heldout_accuracy_slips"] == 1.0 and row["rm/heldout_accuracy_samples"] == 0
    assert row["rm/heldout_accuracy"] == pytest.approx(3 / 5) and row["rm/heldout_pairs"] == 5
    assert "rm/heldout_accuracy_slips" not in _heldout_metrics(None, None, slips)


def test_yatt_rm_with_sampled_and_slipped_pairs_scores_each_kind(tmp_path, capsys) -> None:
    """data.rejected=both: a slip pair and a sampled pair per prompt (the tiny model's samples
    never hold the sum, so each is the reference over a sample); held-out accuracy per kind;
    the summary says how the samples scored."""
    run_dir = tmp_path / "run"
    assert main(["rm", "tiny_test", *FAST, "data.rejected=both",
                 f"logging.run_dir={run_dir}"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "samples scored as high as the reference" in err and "slips / samples" in err
    history = load_history(run_dir)
    first, last = history[0], history[-1]
    assert first["rm/samples_best"] == 0 and first["rm/sample_pairs"] == 24 + 8
    assert first["rm/heldout_pairs"] == 16  # 8 slip pairs, then 8 sampled ones
    for row in (first, last):
        mean = (row["rm/heldout_accuracy_slips"] + row["rm/heldout_accuracy_samples"]) / 2
        assert row["rm/heldout_accuracy"] == pytest.approx(mean)


@pytest.mark.parametrize(
    ("rejected", "problem"),
    [("samples", "no training pair from samples: each of the 96 sampled completions"),
     ("both", None)],
)  # fmt: skip
def test_samples_that_all_score_as_high_as_the_reference_make_no_pairs(
    tmp_path, monkeypatch, capsys, rejected, problem
) -> None:
    """A reward no completion can lose on: sampled pairs alone leave nothing to train on (one
    line, no run folder); beside slips, the run trains on slips and says so."""
    (tmp_path / "flat_reward.py").write_text("def score(prompt, completion, **fields):\n"
                                             "    return 1.0\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    code = main(["rm", "tiny_test", *FAST, f"data.rejected={rejected}",
                 "reward.fns=[flat_reward:score]", f"logging.run_dir={run_dir}"])  # fmt: skip
    err = capsys.readouterr().err
    if problem:
        assert code == 2 and problem in err.strip().splitlines()[-1]
        assert not run_dir.exists()
    else:
        assert code == 0 and "the training pairs are slips alone" in err
        assert load_history(run_dir)[0]["rm/heldout_pairs"] == 8  # the slip pairs


@pytest.mark.parametrize("command", ["train", "sft", "eval"])
def test_commands_that_make_no_pairs_refuse_data_rejected(tmp_path, capsys, command) -> None:
    run_dir = tmp_path / "run"
    assert main([command, "tiny_test", "data.rejected=samples",
                 f"logging.run_dir={run_dir}"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert f"yatt {command} makes no preference pairs" in err[-1], err
    assert not run_dir.exists()


def test_sampling_draws_a_progress_bar_on_a_terminal(tmp_path, monkeypatch) -> None:
    import io

    from rich.console import Console

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, color_system=None)
    monkeypatch.setattr("yatt.report.console", terminal)
    config = load_config("tiny_test", [*FAST, "data.rejected=samples", "logging.progress=true",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    run_reward_model(config)
    assert "sampling" in screen.getvalue() and "128/128 completions" in screen.getvalue()
