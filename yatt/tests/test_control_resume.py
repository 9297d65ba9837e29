"""Periodic checkpoints and resume of the distributed controllers (in-process backend, one
device): a synchronous run resumed from its checkpoint ends with the weights and metrics of
the uninterrupted run, in both controller modes; the data position carries over; checkpoints
of the other kind of run, damaged state files and data positions that do not fit are one-line
errors before any worker starts."""

import json
import logging
import shutil

import pytest
import torch

from yatt.checkpoint import list_checkpoints
from yatt.config import load_config
from yatt.control import ControlConfig, fit_distributed
from yatt.control.async_rollout import ShardQueue, deal_prompts, prompts_due
from yatt.control.controller import Controller
from yatt.errors import ConfigError

OVERRIDES = ["train.steps=4", "algo.prompts_per_step=2", "rollout.n_samples=4", "optim.lr=1e-3",
             "rollout.max_new_tokens=6", "data.n_train=16", "data.n_heldout=0", "eval.n=0",
             "checkpoint.every=2", "checkpoint.keep_last=3"]  # fmt: skip
REWARD = ("yatt.control.workload:char_mix_reward",)


def _control(**changes) -> ControlConfig:
    return ControlConfig(**{"backend": "inprocess", "n_devices": 1, "device_kind": "cpu",
                            "extra_rewards": REWARD, **changes})  # fmt: skip


@pytest.fixture
def final_weights(monkeypatch):
    """The weights the workers hold when a run closes them."""
    final: dict = {}
    real_close = Controller.close

    def close(controller):
        final.clear()
        final.update(controller.weights())
        real_close(controller)

    monkeypatch.setattr(Controller, "close", close)
    return final


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["parallel", "single", "adaptive"])
def test_a_resumed_run_ends_as_the_uninterrupted_one(tmp_path, final_weights, mode, caplog):
    whole_dir, cut_dir = tmp_path / "whole", tmp_path / "cut"
    control = _control(replace_every=1) if mode == "adaptive" else _control(mode=mode)
    with caplog.at_level(logging.INFO):
        fit_distributed(load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={whole_dir}"]),
                        control)  # fmt: skip
    whole = dict(final_weights)
    assert [c.name for c in list_checkpoints(whole_dir)] == ["step_000002", "step_000004"]
    saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("saved checkp")]
    assert saved == [f"saved checkpoint {whole_dir / 'checkpoints' / name}"  # once each
                     for name in ("step_000002", "step_000004")]  # fmt: skip

    # The run as a crash during step 4 leaves it: steps 1-3 logged, the checkpoint of step 2
    shutil.copytree(whole_dir, cut_dir)
    shutil.rmtree(cut_dir / "checkpoints" / "step_000004")
    lines = (cut_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut_dir / "metrics.jsonl").write_text("".join(lines[:3]) + '{"step": 4, "actor/lo')
    # ... resumed in place from its latest checkpoint: step 3 again (its row rewritten), then 4
    resumed = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={cut_dir}",
                                        "checkpoint.resume=latest"])  # fmt: skip
    result = fit_distributed(resumed, control)
    assert len(result.history) == 2
    assert all(torch.equal(whole[k], final_weights[k]) for k in whole)
    rows, whole_rows = _rows(cut_dir), _rows(whole_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row, expected in zip(rows, whole_rows, strict=True):
        assert row["critic/score/mean"] == expected["critic/score/mean"], row["step"]
        assert row["actor/grad_norm"] == expected["actor/grad_norm"], row["step"]
    assert [c.name for c in list_checkpoints(cut_dir)] == ["step_000002", "step_000004"]


def test_a_checkpoint_of_another_folder_starts_a_new_run_there(tmp_path, final_weights):
    source, target = tmp_path / "source", tmp_path / "target"
    fit_distributed(load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={source}"]),
                    _control())  # fmt: skip
    whole = dict(final_weights)
    checkpoint = source / "checkpoints" / "step_000002"
    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={target}",
                                       f"checkpoint.resume={checkpoint}"])  # fmt: skip
    fit_distributed(config, _control())
    assert all(torch.equal(whole[k], final_weights[k]) for k in whole)
    assert [r["step"] for r in _rows(target)] == [3, 4]  # this folder holds only its own steps
    assert (source / "checkpoints" / "step_000004").is_dir()  # the source is left alone


def _refused(tmp_path, overrides, match):
    run_dir = tmp_path / "new"
    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={run_dir}", *overrides])
    with pytest.raises(ConfigError, match=match) as info:
        fit_distributed(config, _control())
    assert "\n" not in str(info.value)
    assert not run_dir.exists()  # refused before the run folder is claimed
    return str(info.value)


@pytest.fixture(scope="module")
def checkpoint_folder(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    config = load_config("tiny_test", [*OVERRIDES, "train.steps=2", f"logging.run_dir={run_dir}"])
    fit_distributed(config, _control())
    return run_dir / "checkpoints" / "step_000002"


def test_a_checkpoint_that_does_not_fit_is_one_line(tmp_path, checkpoint_folder):
    folder = shutil.copytree(checkpoint_folder, tmp_path / "ck")
    resume = f"checkpoint.resume={folder}"
    _refused(tmp_path, [resume, "algo.prompts_per_step=4"], "prompts_per_step=2, this run has 4")
    _refused(tmp_path, [resume, "data.n_train=4"], "a training set of 16, this run has 4")
    _refused(tmp_path, [resume, "train.seed=99"], r"data\.seed \+ train\.seed=")
    _refused(tmp_path, [resume, "data.n_heldout=3"], "training prompts ")
    state = json.loads((folder / "control_state.json").read_text())
    (folder / "control_state.json").write_text(json.dumps({**state, "queues": "none"}))
    _refused(tmp_path, [resume], "control_state.json is unreadable .*not \\{step, prompts_per")
    beyond = {**state, "queues": [[state["queues"][0][0], [state["n_prompts"]]]]}
    (folder / "control_state.json").write_text(json.dumps(beyond))  # right digest, bad index
    _refused(tmp_path, [resume], f"pending prompt {state['n_prompts']} is past the ")
    (folder / "control_state.json").write_text('{"step": 2, "que')  # a torn write
    _refused(tmp_path, [resume], "control_state.json is unreadable")
    (folder / "control_state.json").unlink()  # now it looks like the trainer's
    _refused(tmp_path, [resume], "written by the single-process trainer.*without control")


def test_the_trainer_refuses_a_controllers_checkpoint(tmp_path, checkpoint_folder):
    from yatt.trainer import Trainer

    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={tmp_path / 'new'}",
                                       f"checkpoint.resume={checkpoint_folder}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"written by the distributed controllers.*control"):
        Trainer(config)
    assert not (tmp_path / "new").exists()


def test_resuming_in_place_refuses_to_drop_later_checkpoints(tmp_path, checkpoint_folder):
    run_dir = checkpoint_folder.parent.parent
    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={run_dir}",
                                       f"checkpoint.resume={checkpoint_folder}"])  # fmt: skip
    later = run_dir / "checkpoints" / "step_000003"
    shutil.copytree(checkpoint_folder, later)
    try:
        with pytest.raises(ConfigError, match="holds later ones \\(step_000003\\)"):
            fit_distributed(config, _control())
        assert later.is_dir()  # nothing touched
    finally:
        shutil.rmtree(later)


def test_prompts_due_carries_every_taken_prompt_and_the_draws_others_took():
    # Two groups of one prompt per step each: group 0 consumed 3 global draws and holds one
    # prompt in flight, group 1 consumed 2 draws and took nothing it did not train.
    queue0 = ShardQueue(10, 7, 2, 2, 0)
    taken0 = queue0.take(3)
    states = [(queue0.draws, [taken0[2]]), (2, [])]
    draws, due = prompts_due(states, 10, 7, 2)
    order = ShardQueue(10, 7, 2, 1, 0)
    firsts = order.take(6)  # the global draws, 2 prompts each: [g0, g1, g0, g1, g0, g1]
    assert draws == 3
    assert due == [[firsts[4]], [firsts[5]]]
    assert deal_prompts(due, 1) == [[firsts[4], firsts[5]]]  # fewer groups: in old-rank order


def test_an_async_run_resumes_with_the_prompts_it_had_in_flight(tmp_path):
    """Disaggregated, one step of staleness, over-dispatch: at a checkpoint the next step is in
    flight; a resume samples its prompts first (with the checkpoint's weights) and loses none."""
    from yatt.checkpoint import load_control_state
    from yatt.control import make_controller

    control = _control(n_devices=2, placement="disaggregated", n_sampler=1, async_staleness=1,
                       over_dispatch=0.5)  # fmt: skip
    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={tmp_path / 'a'}"])
    fit_distributed(config, control)
    checkpoint = tmp_path / "a" / "checkpoints" / "step_000002"
    state = load_control_state(checkpoint)
    [(draws, pending)] = state["queues"]
    assert draws > 2 and len(pending) >= 3  # step 3's first wave: ceil(2 x 1.5) prompts
    controller = make_controller(config, control)
    try:
        assert controller.restore(checkpoint, state) == 2
        assert controller.queue_states() == [(draws, pending)]  # due first, nothing dropped
        history = controller.fit(start_step=2).history
    finally:
        controller.close()
    assert len(history) == 2 and history[0]["control/staleness"] == 0.0  # the new weights


def test_a_checkpoint_of_another_model_is_refused_before_the_folder_changes(
    tmp_path, checkpoint_folder
):
    run_dir = shutil.copytree(checkpoint_folder.parent.parent, tmp_path / "run")
    later = shutil.copytree(checkpoint_folder, run_dir / "checkpoints" / "step_000003")
    rows = (run_dir / "metrics.jsonl").read_text()
    resume = f"checkpoint.resume={run_dir / 'checkpoints' / 'step_000002'}"
    other = [
        f"logging.run_dir={run_dir}",
        resume,
        "model.path=tiny-qwen2",
        "logging.overwrite=true",
    ]
    config = load_config("tiny_test", [*OVERRIDES, *other])
    with pytest.raises(ConfigError, match="its state does not fit this run: ") as info:
        fit_distributed(config, _control())
    assert "\n" not in str(info.value)
    assert later.is_dir() and (run_dir / "metrics.jsonl").read_text() == rows  # untouched


def test_at_end_leaves_a_checkpoint_at_the_last_step_so_a_rerun_finds_the_run_complete(
    tmp_path,
):
    """As the trainer does: with checkpoint.at_end, the last step has a checkpoint even where
    checkpoint.every does not divide it (the controllers saved only every-th steps: a rerun
    with resume=auto resumed at step 2 and trained steps 3-5 again, changing model/)."""
    from yatt.checkpoint import checkpoint_step

    steps = ["train.steps=5", "checkpoint.at_end=true", f"logging.run_dir={tmp_path / 'r'}"]
    config = load_config("tiny_test", [*OVERRIDES, *steps])
    fit_distributed(config, _control())
    saved = [checkpoint_step(folder) for folder in list_checkpoints(tmp_path / "r")]
    assert saved == [2, 4, 5]
