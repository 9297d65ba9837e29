"""SFT checkpoints: a resumed run ends exactly where the uninterrupted one does, in place (after
its time limit stopped it) or into a new folder; checkpoints of SFT and of RL are not mixed up;
a checkpoint of other data is refused.

Method: 4-step SFT runs of the tiny random-init model (`model.path=tiny`, built from its seed)
on generated sums; the uninterrupted run is made once (module fixture) and every other run is
compared with it tensor by tensor and loss by loss.
"""

import json
import shutil

import pytest

from yatt.config import load_config
from yatt.errors import ConfigError
from yatt.sft import run_sft
from yatt.trainer import Trainer

BASE = ["train.steps=4", "optim.lr=3e-3", "algo.micro_batch_size=4", "data.n_train=8",
        "data.n_heldout=2", "eval.n=2", "eval.at_end=true", "checkpoint.every=2"]  # fmt: skip


def _run(run_dir, *overrides):
    return run_sft(load_config("tiny_test", [*BASE, f"logging.run_dir={run_dir}", *overrides]))


def _losses(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "sft_metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["sft/loss"] for row in rows}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    _run(run_dir)
    return run_dir


def test_checkpoints_keep_the_sft_state(straight) -> None:
    kept = sorted(p.name for p in (straight / "checkpoints").iterdir())
    assert kept == ["step_000002", "step_000004"]
    checkpoint = straight / "checkpoints" / "step_000002"
    assert json.loads((checkpoint / "sft_state.json").read_text()) == {"step": 2}
    assert (checkpoint / "policy" / "model.safetensors").is_file()
    assert list(_losses(straight)) == [1, 2, 3, 4]


def test_a_run_resumed_into_a_new_folder_ends_as_the_straight_run(
    straight, tmp_path, same_weights
) -> None:
    folder = _run(tmp_path, f"checkpoint.resume={straight / 'checkpoints' / 'step_000002'}")
    same_weights(folder, straight / "model")
    assert _losses(tmp_path) == {step: _losses(straight)[step] for step in (3, 4)}


def test_a_run_its_time_limit_stopped_continues_in_place_with_auto(
    straight, tmp_path, same_weights
) -> None:
    _run(tmp_path, "train.time_limit_s=1e-9")  # stops after step 1, with a checkpoint there
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]
    assert list(_losses(tmp_path)) == [1]
    folder = _run(tmp_path, "checkpoint.resume=auto")
    same_weights(folder, straight / "model")
    assert _losses(tmp_path) == _losses(straight)  # step 1's row once, then 2..4


def test_sft_and_rl_each_refuse_the_others_checkpoints(straight, tmp_path) -> None:
    sft_checkpoint = straight / "checkpoints" / "step_000002"
    config = load_config(
        "tiny_test", [f"logging.run_dir={tmp_path / 'rl'}", f"checkpoint.resume={sft_checkpoint}"]
    )
    with pytest.raises(ConfigError, match=r"was written by SFT.*resume it with `yatt sft`"):
        Trainer(config, model=object(), tokenizer=object())
    rl_checkpoint = tmp_path / "rl_checkpoint"  # the trainer's layout: no marker file
    shutil.copytree(sft_checkpoint, rl_checkpoint)
    (rl_checkpoint / "sft_state.json").unlink()
    with pytest.raises(ConfigError, match=r"written by the single-process trainer"):
        _run(tmp_path / "sft", f"checkpoint.resume={rl_checkpoint}")
    assert not (tmp_path / "sft").exists()  # refused before the folder was made


def test_a_checkpoint_of_other_data_is_refused(straight, tmp_path) -> None:
    checkpoint = straight / "checkpoints" / "step_000002"
    with pytest.raises(ConfigError, match=r"was written with data.seed \+ train.seed="):
        _run(tmp_path, f"checkpoint.resume={checkpoint}", "data.seed=99")
    assert not (tmp_path / "sft_metrics.jsonl").exists()


def test_resuming_in_place_before_later_checkpoints_is_refused_before_saying_resumed(
    straight, tmp_path, caplog
) -> None:
    # It logged "resumed SFT from ..." and then refused.
    import logging

    shutil.copytree(straight, tmp_path / "run")
    older = tmp_path / "run" / "checkpoints" / "step_000002"
    with caplog.at_level(logging.INFO, logger="yatt.sft"):
        with pytest.raises(ConfigError, match=r"holds later ones \(step_000004\)"):
            _run(tmp_path / "run", f"checkpoint.resume={older}")
        assert not [r for r in caplog.records if "resumed SFT" in r.getMessage()]
        shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000004")
        _run(tmp_path / "run", f"checkpoint.resume={older}")
    resumed = [r.getMessage() for r in caplog.records if "resumed SFT" in r.getMessage()]
    assert resumed == [f"resumed SFT from {older} at step 2"]
