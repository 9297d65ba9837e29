"""Damaged files and reused run folders give one-line errors that name the file, and lose nothing.

Method: one real 1-step checkpoint of the tiny model (module fixture), copied and damaged per test
(truncated, garbage, empty, missing keys); small data and metrics files written to tmp_path; a fake
engine and tokenizer for evaluation. Each error must be a YattError whose message is one line.
"""

import json
import logging
import shutil
from types import SimpleNamespace

import pytest
import torch

from yatt.checkpoint import load_trainer_state, policy_folder, truncate_metrics
from yatt.cli import main
from yatt.config import load_config, save_config
from yatt.data import PromptExample, load_prompts, split_heldout
from yatt.errors import ConfigError, DataError, ModelError, YattError
from yatt.evaluate import evaluate_engine
from yatt.models import load_model, tiny_model
from yatt.rewards import RewardError
from yatt.run_dir import check_run_dir
from yatt.trainer import Trainer

TINY = ["train.steps=1", "eval.n=0", "rollout.n_samples=2", "algo.prompts_per_step=2"]


def _one_line(exc_info: pytest.ExceptionInfo) -> str:
    message = str(exc_info.value)
    assert isinstance(exc_info.value, YattError)
    assert "\n" not in message, message
    return message


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run folder holding metrics.jsonl and checkpoints/step_000001 of a 1-step tiny run."""
    run_dir = tmp_path_factory.mktemp("run")
    model, tokenizer = tiny_model(seed=0)
    config = load_config(
        "tiny_test", [*TINY, "checkpoint.at_end=true", f"logging.run_dir={run_dir}"]
    )
    Trainer(config, model=model, tokenizer=tokenizer).fit()
    return run_dir


@pytest.fixture
def checkpoint(finished_run, tmp_path):
    """A private copy of the fixture run's checkpoint, free to damage."""
    return shutil.copytree(finished_run / "checkpoints" / "step_000001", tmp_path / "ck")


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "missing_keys", "not_dict"])
def test_damaged_trainer_state_is_one_line(checkpoint, damage):
    state = checkpoint / "trainer_state.pt"
    if damage == "truncated":
        _truncate(state)
    elif damage == "garbage":
        state.write_bytes(bytes(range(256)) * 8)
    elif damage == "empty":
        state.write_bytes(b"")
    elif damage == "missing_keys":
        torch.save({"step": 1}, state)
    else:
        torch.save([1, 2], state)
    with pytest.raises(ConfigError) as exc_info:
        load_trainer_state(checkpoint)
    message = _one_line(exc_info)
    assert message.startswith(f"checkpoint.resume={checkpoint}: trainer_state.pt is unreadable")
    if damage == "missing_keys":
        assert "['policy', 'sampler', 'rng']" in message


def test_resuming_with_or_without_a_critic_names_the_algorithm(checkpoint, caplog):
    # (a GRPO checkpoint resumed by PPO was called "unreadable (truncated ...)": it is whole)
    with pytest.raises(ConfigError) as exc_info:
        load_trainer_state(checkpoint, needs_critic=True)
    message = _one_line(exc_info)
    assert "was written by a run without a critic (not algo.name=ppo)" in message
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    torch.save({**state, "critic": {}}, checkpoint / "trainer_state.pt")
    assert "critic" in load_trainer_state(checkpoint)  # (a PPO checkpoint, resumed by GRPO)
    assert "the critic is not carried on" in caplog.text


def test_a_checkpoint_without_its_policy_folder_says_so(checkpoint):
    assert policy_folder(checkpoint) == checkpoint / "policy"
    shutil.rmtree(checkpoint / "policy")
    with pytest.raises(ConfigError, match=r"has no policy/ folder \(its weights\)"):
        policy_folder(checkpoint)


def test_resume_from_truncated_state_fails_before_training(checkpoint, tmp_path):
    _truncate(checkpoint / "trainer_state.pt")
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", [*TINY, f"checkpoint.resume={checkpoint}",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"trainer_state\.pt is unreadable") as exc_info:
        Trainer(config, model=model, tokenizer=tokenizer)
    _one_line(exc_info)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_weights_name_the_file(checkpoint, damage, capsys):
    weights = policy_folder(checkpoint) / "model.safetensors"
    if damage == "truncated":
        _truncate(weights)
    else:
        weights.write_bytes(b"\xff" * 4096)
    with pytest.raises(ModelError, match=r"model\.safetensors is unreadable") as exc_info:
        load_model(policy_folder(checkpoint))
    _one_line(exc_info)
    assert main(["eval", str(checkpoint)]) == 2  # `yatt eval DIR`: one line, no traceback
    err = capsys.readouterr().err.strip().splitlines()
    assert "model.safetensors is unreadable" in err[-1]
    assert not any("Traceback" in line for line in err)


def test_torn_last_metrics_line_is_dropped_and_the_rest_kept(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": step, "x": 1.0}) for step in (1, 2, 3)]
    path.write_text("\n".join(rows) + '\n{"step": 4, "x": 1.')
    with caplog.at_level(logging.WARNING):
        truncate_metrics(path, last_step=2)
    assert path.read_text().splitlines() == rows[:2]
    assert str(path) in caplog.text and "torn last line" in caplog.text


def test_damaged_middle_metrics_line_refuses_and_keeps_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = '{"step": 1}\nnot json\n{"step": 2}\n'
    path.write_text(text)
    with pytest.raises(ConfigError, match="row 2 is not a JSON metrics row") as exc_info:
        truncate_metrics(path, last_step=2)
    _one_line(exc_info)
    assert path.read_text() == text


def test_latin1_data_file_names_byte_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"not UTF-8 \(byte 0xe9 at line 1\)") as exc_info:
        load_prompts(path)
    assert str(path) in _one_line(exc_info)


def test_a_byte_order_mark_before_the_first_row_is_read_past(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes('\ufeff{"prompt": "What is 1 + 1?", "answer": "2"}\n'.encode())
    assert [(row.prompt, row.answer) for row in load_prompts(path)] == [("What is 1 + 1?", "2")]


def test_identical_prompts_leave_no_training_prompts():
    examples = [PromptExample("same prompt", "1")] * 10
    with pytest.raises(ConfigError, match=r"no training prompts left.*\(10 rows, 1 distinct") as e:
        split_heldout(examples, n_heldout=2)
    _one_line(e)


class _FakeTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1, 2, 3]}


class _FakeEngine:
    def generate(self, prompt_ids, params):
        return [SimpleNamespace(text="42") for _ in prompt_ids]


def test_eval_reward_failure_names_the_source_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?"}\n')
    examples = load_prompts(path)
    with pytest.raises(RewardError, match=rf"math_answer.*on {path}:2$") as exc_info:
        evaluate_engine(_FakeEngine(), _FakeTokenizer(), examples, use_chat_template=False)
    _one_line(exc_info)
    with pytest.raises(ConfigError, match="nothing to evaluate"):
        evaluate_engine(_FakeEngine(), _FakeTokenizer(), [], use_chat_template=False)


@pytest.mark.parametrize(("module", "returned", "problem"), [
    ("nan_scores", "float('nan')", "returned nan on held-out example 0; need a finite number"),
    ("bool_scores", "True", "returned True (bool) on held-out example 0; need a number"),
])  # fmt: skip
def test_an_eval_reward_that_returns_no_number_is_refused(
    tmp_path, monkeypatch, module, returned, problem
):
    # NaN was scored as wrong and True as right, silently.
    source = f"def score(prompt, text, **row):\n    return {returned}\n"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    examples = [PromptExample("1+1?", "2")]
    with pytest.raises(RewardError) as exc_info:
        evaluate_engine(_FakeEngine(), _FakeTokenizer(), examples, use_chat_template=False,
                        reward_fn=f"{module}:score")  # fmt: skip
    assert _one_line(exc_info) == f"eval reward '{module}:score' {problem}"


def test_train_reward_failure_names_the_data_line(tmp_path, monkeypatch):
    # (A row without an answer, or one math_answer cannot read as a number, is refused when
    # the data loads: test_config_task_rewards.) A reward of the user's fails on a row's field.
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "What is 1 + 1?", "answer": "2", "unit": "two"}\n'
        '{"prompt": "What is 2 + 2?", "answer": "4", "unit": "four"}\n'
    )
    (tmp_path / "unit_reward.py").write_text(
        "def reward(prompt, completion, *, unit, **fields):\n    return float(unit)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", [*TINY, f"data.path={path}", "data.n_heldout=0",
                                       "reward.fns=[unit_reward:reward]",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    trainer = Trainer(config, model=model, tokenizer=tokenizer)
    with pytest.raises(RewardError, match=rf"row \d is a sample of {path}:[12]\)$") as exc_info:
        trainer.train_step()
    _one_line(exc_info)


def test_a_prompt_too_long_for_the_models_positions_names_the_data_line(tmp_path):
    """The tiny model has 1024 positions: a prompt of about 1100 tokens cannot fit with any
    budget (a rotary model would sample garbage past them, an absolute one fail its lookup).
    Refused before the first step: found when the sampler first drew it, it ended the run
    then, and again at the same step on every resume."""
    path = tmp_path / "d.jsonl"
    long = "What is " + " + ".join(["1"] * 600) + "?"
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}] * 3 + [{"prompt": long, "answer": "600"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", [*TINY, f"data.path={path}", "data.n_heldout=0",
                                       "algo.prompts_per_step=1",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    named = rf"^{path}:4: the prompt has \d+ tokens and, with the response budget of \d+, needs "
    with pytest.raises(ConfigError, match=named) as exc_info:
        Trainer(config, model=model, tokenizer=tokenizer)
    assert "the model (" in _one_line(exc_info) and "has 1024 (max_position_embeddings)" in str(
        exc_info.value
    )


def test_a_held_out_prompt_too_long_for_the_eval_budget_is_refused_before_training(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["train.steps=1", "rollout.n_samples=2",
                                       "algo.prompts_per_step=2", f"data.path={path}",
                                       "data.n_heldout=2", "eval.n=2", "eval.max_new_tokens=1010",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"with eval\.max_new_tokens of 1010, needs") as exc_info:
        Trainer(config, model=model, tokenizer=tokenizer)
    assert _one_line(exc_info).startswith(f"{path}:")


def test_fresh_run_into_a_used_folder_is_refused(finished_run):
    before = sorted(p.name for p in finished_run.rglob("*"))
    config = load_config("tiny_test", [*TINY, f"logging.run_dir={finished_run}"])
    with pytest.raises(ConfigError) as exc_info:
        Trainer(config, model=object(), tokenizer=object())  # refused before the model is used
    assert _one_line(exc_info) == (
        f"logging.run_dir={finished_run} already holds a run (metrics.jsonl, checkpoints/): "
        "pass checkpoint.resume=... to continue it, or choose another folder, or set "
        "logging.overwrite=true to replace it"
    )
    assert sorted(p.name for p in finished_run.rglob("*")) == before  # nothing lost


def test_overwrite_deletes_the_previous_run_only_once_the_new_one_loaded(
    finished_run, tmp_path, monkeypatch
):
    # logging.overwrite=true with a mistyped data.path (or model.path): the run is refused and
    # the previous run's checkpoints and metrics are all still there.
    run_dir = shutil.copytree(finished_run, tmp_path / "run")  # the fixture's run is shared
    before = sorted(p.name for p in run_dir.rglob("*"))
    for typo in ["data.path=/no/such/rows.jsonl", "model.path=/no/such/model"]:
        overrides = [*TINY, f"logging.run_dir={run_dir}", "logging.overwrite=true", typo]
        with pytest.raises(YattError) as exc_info:
            Trainer(load_config("tiny_test", overrides))
        assert "/no/such/" in _one_line(exc_info)
        assert sorted(p.name for p in run_dir.rglob("*")) == before
    # A reward that fails on every call (here: returns None) fails before the deletion too.
    (tmp_path / "broken_reward.py").write_text("def none(prompt, completion, **row):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model, tokenizer = tiny_model(seed=0)
    overrides = [*TINY, f"logging.run_dir={run_dir}", "logging.overwrite=true"]
    with pytest.raises(RewardError, match="reward 'none' returned None"):
        Trainer(load_config("tiny_test", [*overrides, "reward.fns=[broken_reward:none]"]),
                model=model, tokenizer=tokenizer)  # fmt: skip
    assert sorted(p.name for p in run_dir.rglob("*")) == before
    config = load_config("tiny_test", overrides)  # a run that loads replaces the previous one
    Trainer(config, model=model, tokenizer=tokenizer)
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()


def test_resume_over_another_training_set_is_refused(finished_run, tmp_path):
    # The checkpoint's data position counts prompts of its run's training set; a resume over
    # a smaller one (an index error at the first step) or another one (other prompts, silently)
    # is refused before any work, with the same line as the distributed controllers'.
    checkpoint = finished_run / "checkpoints" / "step_000001"
    model, tokenizer = tiny_model(seed=0)
    changes = {
        "data.n_train=3": "with a training set of 6",  # (64 rows less any held-out twins)
        "data.seed=9": "with data.seed + train.seed=0, this run has 9",
    }
    for change, fragment in changes.items():
        overrides = [*TINY, "train.steps=2", f"checkpoint.resume={checkpoint}", change]
        overrides.append(f"logging.run_dir={tmp_path / change}")
        with pytest.raises(ConfigError) as exc_info:
            Trainer(load_config("tiny_test", overrides), model=model, tokenizer=tokenizer)
        assert fragment in _one_line(exc_info)


def test_run_dir_resume_overwrite_and_bad_folders(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    outputs = ("metrics.jsonl", "checkpoints")
    assert check_run_dir(str(run_dir), outputs, resuming=True).clear() == run_dir
    assert (run_dir / "metrics.jsonl").is_file()
    claim = check_run_dir(str(run_dir), outputs, overwrite=True)
    assert (run_dir / "metrics.jsonl").is_file()  # checked, nothing deleted yet
    claim.clear()
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    check_run_dir(str(run_dir), outputs)  # now empty: a fresh run may use it
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for bad, fragment in [("", "is empty"), ("  ", "is empty"), (str(a_file), "is a file"),
                          (str(a_file / "sub"), "cannot create it")]:  # fmt: skip
        with pytest.raises(ConfigError, match=fragment) as exc_info:
            check_run_dir(bad, outputs)
        _one_line(exc_info)


def test_a_run_folder_in_use_by_another_job_is_refused(tmp_path):
    # Two jobs into one folder both ran to the end, each deleting what the other wrote.
    import gc
    import os
    import subprocess
    import sys

    claim = check_run_dir(str(tmp_path / "run"), ("metrics.jsonl",))
    assert check_run_dir(str(tmp_path / "run"), ("metrics.jsonl",)).lock is claim.lock  # shared
    other = [sys.executable, "-c", "import sys; from yatt.run_dir import check_run_dir\n"
             "try: check_run_dir(sys.argv[1], ('metrics.jsonl',))\n"
             "except Exception as e: sys.exit(str(e))", str(tmp_path / "run")]  # fmt: skip
    refused = subprocess.run(other, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"logging.run_dir={tmp_path / 'run'} is in use by another yatt job (pid {os.getpid()}): "
        "wait for it to end, or choose another folder"
    )
    del claim
    gc.collect()  # (the claims are gone: the lock with them)
    assert subprocess.run(other, capture_output=True, text=True, timeout=120).returncode == 0


def _claim_in_another_process(folder) -> int:
    import subprocess
    import sys

    other = [sys.executable, "-c", "import sys; from yatt.run_dir import check_run_dir\n"
             "try: check_run_dir(sys.argv[1], ('metrics.jsonl',))\n"
             "except Exception as e: sys.exit(str(e))", str(folder)]  # fmt: skip
    return subprocess.run(other, capture_output=True, text=True, timeout=120).returncode


def test_a_retry_after_a_failed_set_up_locks_afresh_and_a_fork_drops_the_lock(tmp_path):
    import gc
    import os

    folder = tmp_path / "run"
    claim = check_run_dir(str(folder), ("metrics.jsonl",))
    with pytest.raises(ValueError), claim.removed_if_unused():
        raise ValueError("a mistyped data path")
    assert not folder.exists()  # the folder the claim made went, with its lock file
    retry = check_run_dir(str(folder), ("metrics.jsonl",))  # (the failed claim still alive)
    assert (folder / ".yatt.lock").is_file() and _claim_in_another_process(folder) == 1
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # a forked child that outlives the claim: it must not keep the lock
        os.close(writer)
        os.read(reader, 1)
        os._exit(0)
    os.close(reader)
    try:
        del claim, retry
        gc.collect()
        assert _claim_in_another_process(folder) == 0  # the child still runs
    finally:
        os.close(writer)
        os.waitpid(child, 0)


def test_a_run_without_checkpoints_gets_no_resume_hint(tmp_path):
    """A run that failed after its step-0 evaluation left metrics.jsonl and no checkpoint."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.0}\n')
    (tmp_path / "checkpoints").mkdir()  # empty: nothing to resume either
    with pytest.raises(ConfigError) as exc_info:
        check_run_dir(str(tmp_path), ("metrics.jsonl", "checkpoints"))
    assert _one_line(exc_info) == (
        f"logging.run_dir={tmp_path} already holds a run (metrics.jsonl): it holds no checkpoint "
        "to resume; choose another folder, or set logging.overwrite=true to replace it"
    )
    (tmp_path / "checkpoints" / "step_000001").mkdir()
    with pytest.raises(ConfigError, match=r"pass checkpoint\.resume=\.\.\. to continue it"):
        check_run_dir(str(tmp_path), ("metrics.jsonl", "checkpoints"))
    assert (tmp_path / "metrics.jsonl").is_file()  # nothing lost


def test_a_fresh_run_keeps_a_config_yaml_that_yatt_did_not_write(tmp_path):
    # `yatt train proj/config.yaml logging.run_dir=proj` would have replaced the user's file.
    mine = "my_other_tool: {setting: 42}\n"
    (tmp_path / "config.yaml").write_text(mine)
    with pytest.raises(ConfigError) as exc_info:
        check_run_dir(str(tmp_path), ("metrics.jsonl",))
    assert _one_line(exc_info) == (
        f"logging.run_dir={tmp_path} holds a config.yaml that yatt did not write, and the run "
        "would replace it with its own: choose another folder, move the file, or set "
        "logging.overwrite=true to replace it"
    )
    assert (tmp_path / "config.yaml").read_text() == mine
    claim = check_run_dir(str(tmp_path), ("metrics.jsonl",), overwrite=True)
    assert claim.previous == (tmp_path / "config.yaml",)  # replaced only when asked to
    save_config(load_config("tiny_test"), tmp_path)  # a run's own (one that failed early)
    assert check_run_dir(str(tmp_path), ("metrics.jsonl",)).previous == ()


def test_sft_refuses_an_rl_run_folder(tmp_path):
    from yatt.sft import run_sft

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "config.yaml").write_text("train: {steps: 7}\n")
    config = load_config("tiny_test", [f"logging.run_dir={tmp_path}"])
    with pytest.raises(ConfigError) as exc_info:
        run_sft(config, model=object(), tokenizer=object())
    assert "already holds a run (metrics.jsonl)" in _one_line(exc_info)
    assert (tmp_path / "config.yaml").read_text() == "train: {steps: 7}\n"  # not replaced


def test_sft_resume_latest_without_a_checkpoint_is_refused_before_touching_the_folder(tmp_path):
    from yatt.sft import run_sft

    config = load_config("tiny_test", [f"logging.run_dir={tmp_path}", "checkpoint.resume=latest"])
    with pytest.raises(ConfigError) as exc_info:
        run_sft(config, model=object(), tokenizer=object())
    assert _one_line(exc_info).startswith("checkpoint.resume=latest: ")
    assert "holds no checkpoint" in _one_line(exc_info)
    assert not any(tmp_path.iterdir())


def test_sft_rerun_is_refused_saying_there_is_no_checkpoint_to_resume(tmp_path):
    from yatt.sft import run_sft

    (tmp_path / "sft_metrics.jsonl").write_text('{"step": 1}\n')
    config = load_config("tiny_test", [f"logging.run_dir={tmp_path}"])
    with pytest.raises(ConfigError) as exc_info:
        run_sft(config, model=object(), tokenizer=object())
    assert _one_line(exc_info).endswith(
        "already holds a run (sft_metrics.jsonl): it holds no checkpoint to resume; choose "
        "another folder, or set logging.overwrite=true to replace it"
    )


def test_logging_overwrite_replaces_a_previous_run(finished_run, tmp_path):
    run_dir = tmp_path / "again"
    shutil.copytree(finished_run, run_dir)
    config = load_config(
        "tiny_test", [*TINY, f"logging.run_dir={run_dir}", "logging.overwrite=true"]
    )
    # a distributed run's outputs, left in the folder: no longer shown as this run's
    (run_dir / "control.json").write_text("{}")
    (run_dir / "model").mkdir()
    (run_dir / "model" / "config.json").write_text("{}")
    trainer = Trainer(config)
    assert trainer.run_dir == run_dir and not (run_dir / "checkpoints").exists()
    assert not (run_dir / "control.json").exists() and not (run_dir / "model").exists()


def test_every_job_claims_the_outputs_every_job_writes():
    from yatt.control.run import MODEL_FOLDER
    from yatt.control.segments import SEGMENTS_BAD_FILE, SEGMENTS_FILE
    from yatt.run_dir import RUN_OUTPUTS

    assert {MODEL_FOLDER, SEGMENTS_FILE, SEGMENTS_BAD_FILE} <= set(RUN_OUTPUTS)


def test_evaluating_with_no_heldout_prompts_is_refused_before_any_work(tmp_path):
    overrides = ["data.n_heldout=0", "eval.n=4", "eval.at_end=true", f"logging.run_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"^data.n_heldout=0 leaves nothing to evaluate"):
        Trainer(load_config("tiny_test", overrides), model=object(), tokenizer=object())
    assert not any(tmp_path.iterdir())  # refused before the run folder was touched


def test_an_rl_run_refuses_an_sft_run_folder(tmp_path):
    (tmp_path / "sft_metrics.jsonl").write_text('{"step": 1, "sft/loss": 2.0}\n')
    config = load_config("tiny_test", [*TINY, f"logging.run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"already holds a run \(sft_metrics\.jsonl\)"):
        Trainer(config, model=object(), tokenizer=object())


def test_overwriting_never_deletes_the_folder_model_path_names(tmp_path):
    """`model.path=run/model logging.run_dir=run logging.overwrite=true`: an SFT run's model in
    the folder an RL or SFT run writes to is kept (the run would load it after deleting it)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as exc_info:
        check_run_dir(str(tmp_path), ("model",), overwrite=True, model_path=str(tmp_path / "model"))
    assert "would delete" in _one_line(exc_info) and "a model this run loads" in str(exc_info.value)
    assert (tmp_path / "model" / "config.json").is_file()
    # nor the reward model it scores with (a `yatt rm` run's, in the same folder)
    from yatt.run_dir import RUN_OUTPUTS, claim_run_dir

    (tmp_path / "reward_model").mkdir()
    (tmp_path / "reward_model" / "config.json").write_text("{}")
    overrides = [f"logging.run_dir={tmp_path}", "logging.overwrite=true",
                 f"reward.model_path={tmp_path / 'reward_model'}"]  # fmt: skip
    config = load_config("tiny_test", overrides)
    with pytest.raises(ConfigError, match=r"would delete .*reward_model, which holds"):
        claim_run_dir(config, RUN_OUTPUTS, resume="", in_place=False)
    assert (tmp_path / "reward_model" / "config.json").is_file()


def test_a_run_that_keeps_no_checkpoint_says_so_at_the_start(tmp_path, caplog):
    model, tokenizer = tiny_model(seed=0)
    for keep, warned in [([], True), (["checkpoint.at_end=true"], False)]:
        caplog.clear()
        run_dir = tmp_path / str(warned)
        config = load_config("tiny_test", [*TINY, *keep, f"logging.run_dir={run_dir}"])
        with caplog.at_level(logging.WARNING, logger="yatt.run_checks"):
            Trainer(config, model=model, tokenizer=tokenizer)
        said = [r.getMessage() for r in caplog.records if "keeps no checkpoint" in r.getMessage()]
        assert bool(said) is warned, said


def test_the_critic_takes_the_configured_weight_decay():
    # It used AdamW's own default (0.01) whatever optim.weight_decay said (0.0 by default).
    from yatt.config import AlgoConfig, OptimConfig
    from yatt.roles.critic import CriticRole

    model, _ = tiny_model(seed=0)
    for decay in (0.0, 0.3):
        optim = OptimConfig(weight_decay=decay)
        critic = CriticRole.from_policy(model, algo=AlgoConfig(), optim=optim, total_updates=2)
        assert [group["weight_decay"] for group in critic.optimizer.param_groups] == [decay]


def test_a_resume_with_other_optimizer_settings_uses_them(finished_run, tmp_path):
    # The checkpoint's moments and step count carry on; lr, betas, eps and weight decay are
    # this run's (a checkpoint's own were kept silently, though config.yaml said otherwise).
    checkpoint = finished_run / "checkpoints" / "step_000001"
    model, tokenizer = tiny_model(seed=0)
    changed = [
        "optim.lr=1e-7",
        "optim.beta1=0.5",
        "optim.weight_decay=0.25",
        "optim.schedule=constant",
    ]  # (its factor 1: the lr itself shows)
    overrides = [*TINY, "train.steps=2", f"checkpoint.resume={checkpoint}", *changed,
                 f"logging.run_dir={tmp_path / 'run'}"]  # fmt: skip
    trainer = Trainer(load_config("tiny_test", overrides), model=model, tokenizer=tokenizer)
    group = trainer.policy.optimizer.param_groups[0]
    factor = trainer.policy.scheduler.lr_lambdas[0](trainer.policy.scheduler.last_epoch)
    assert trainer.policy.scheduler.last_epoch == 1  # the resumed schedule step
    assert factor == 1 and group["lr"] == 1e-7 and trainer.policy.scheduler.base_lrs == [1e-7]
    assert group["betas"][0] == 0.5 and group["weight_decay"] == 0.25
    assert trainer.policy.optimizer.state  # the moments came from the checkpoint
