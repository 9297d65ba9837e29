"""DPO checkpoints: a resumed run ends exactly where the uninterrupted one does, in place (after
its time limit stopped it) or into a new folder, without sampling its pairs or running the
reference again; checkpoints of DPO and of SFT are not mixed up; other data is refused.

Method: 4-step DPO runs of the tiny random-init model on slip pairs of generated sums; the
uninterrupted run is made once (module fixture) and every other run is compared with it
tensor by tensor and row by row.
"""

import json
import shutil

import pytest
import torch

from yatt.cli import main
from yatt.config import load_config
from yatt.dpo import run_dpo
from yatt.errors import ConfigError
from yatt.sft import run_sft

BASE = ["train.steps=4", "optim.lr=1e-3", "algo.micro_batch_size=4", "data.n_train=8",
        "data.n_heldout=4", "eval.n=4", "checkpoint.every=2"]  # fmt: skip


def _run(run_dir, *overrides):
    return run_dpo(load_config("tiny_test", [*BASE, f"logging.run_dir={run_dir}", *overrides]))


def _rows(run_dir) -> dict[int, dict]:
    lines = (run_dir / "dpo_metrics.jsonl").read_text().splitlines()
    return {row["step"]: row for row in map(json.loads, lines)}


def _trained(rows: dict[int, dict]) -> dict[int, tuple]:
    """What a step's row says of training and the held-out scores (not its timings)."""
    return {step: tuple(sorted((k, v) for k, v in row.items() if not k.startswith("timing_s/")))
            for step, row in rows.items()}  # fmt: skip


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    _run(run_dir)
    return run_dir


def test_checkpoints_keep_the_dpo_state_with_its_pairs_and_reference(straight) -> None:
    kept = sorted(p.name for p in (straight / "checkpoints").iterdir())
    assert kept == ["step_000002", "step_000004"]
    checkpoint = straight / "checkpoints" / "step_000002"
    assert json.loads((checkpoint / "dpo_state.json").read_text()) == {"step": 2}
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    assert len(state["pairs"]) == 8 and len(state["heldout_pairs"]) == 4
    assert [t.shape for t in state["reference"]] == [torch.Size([8])] * 2
    assert [t.shape for t in state["heldout_reference"]] == [torch.Size([4])] * 2
    assert list(_rows(straight)) == [0, 1, 2, 3, 4]


def test_a_run_resumed_into_a_new_folder_ends_as_the_straight_run(
    straight, tmp_path, same_weights
) -> None:
    folder = _run(tmp_path, f"checkpoint.resume={straight / 'checkpoints' / 'step_000002'}")
    same_weights(folder, straight / "model")
    assert _trained(_rows(tmp_path)) == {s: _trained(_rows(straight))[s] for s in (3, 4)}


def test_a_run_its_time_limit_stopped_scores_then_continues_with_auto(
    straight, tmp_path, same_weights
) -> None:
    """The limit stops the run after step 1 (with a checkpoint and the end's held-out
    scores there); rerunning with checkpoint.resume=auto goes on from it, no sampling."""
    _run(tmp_path, "train.time_limit_s=1e-9")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]
    stopped = _rows(tmp_path)
    assert list(stopped) == [0, 1] and "eval/accuracy" in stopped[1]
    assert (tmp_path / "model" / "model.safetensors").is_file()  # what the stopped run made
    folder = _run(tmp_path, "checkpoint.resume=auto")
    same_weights(folder, straight / "model")
    resumed, ran = _trained(_rows(tmp_path)), _trained(_rows(straight))
    assert list(resumed) == [0, 1, 2, 3, 4]
    assert {step: resumed[step] for step in (0, 2, 3, 4)} == {
        step: ran[step] for step in (0, 2, 3, 4)
    }


def test_a_complete_run_met_again_with_auto_is_done(straight, capsys) -> None:
    argv = ["dpo", "tiny_test", *BASE, f"logging.run_dir={straight}", "checkpoint.resume=auto"]
    assert main(argv) == 0
    assert "yatt dpo summary" in capsys.readouterr().err
    assert main(["eval", str(straight / "checkpoints" / "step_000002"), "eval.n=4"]) == 0
    assert "accuracy" in capsys.readouterr().out


def test_dpo_and_sft_each_refuse_the_others_checkpoints(straight, tmp_path) -> None:
    dpo_checkpoint = straight / "checkpoints" / "step_000002"
    with pytest.raises(ConfigError, match=r"was written by DPO.*resume it with `yatt dpo`"):
        run_sft(load_config("tiny_test", [*BASE, f"logging.run_dir={tmp_path / 'sft'}",
                                          f"checkpoint.resume={dpo_checkpoint}"]))  # fmt: skip
    run_sft(load_config("tiny_test", ["train.steps=2", "checkpoint.every=2", "eval.n=0",
                                      f"logging.run_dir={tmp_path / 'sft'}"]))  # fmt: skip
    sft_checkpoint = tmp_path / "sft" / "checkpoints" / "step_000002"
    with pytest.raises(ConfigError, match=r"was written by SFT.*resume it with `yatt sft`"):
        _run(tmp_path / "dpo", f"checkpoint.resume={sft_checkpoint}")
    assert not (tmp_path / "dpo").exists()


def test_a_checkpoint_of_other_data_is_refused(straight, tmp_path) -> None:
    checkpoint = straight / "checkpoints" / "step_000002"
    with pytest.raises(ConfigError, match=r"its pairs came from other data \(data.seed differ"):
        _run(tmp_path / "run", f"checkpoint.resume={checkpoint}", "data.seed=7")
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_whose_state_does_not_fit_changes_nothing(straight, tmp_path) -> None:
    """Refused before the folder is touched: its later checkpoint and metric rows stay."""
    run_dir = tmp_path / "run"
    shutil.copytree(straight, run_dir)
    checkpoint = run_dir / "checkpoints" / "step_000002"
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    state["sampler"] = {"position": 0}  # not a sampler's state
    torch.save(state, checkpoint / "trainer_state.pt")
    with pytest.raises(ConfigError, match="its DPO state does not fit this run"):
        _run(run_dir, f"checkpoint.resume={checkpoint}", "logging.overwrite=true")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step_000002", "step_000004"
    ]  # fmt: skip
    assert _rows(run_dir) == _rows(straight)
