"""`yatt sft`, `yatt report` and `yatt eval` end to end: the learning rate SFT logs, the report of
an SFT folder, and evaluation on the data of the config saved beside a model.

Method: one 2-step SFT run of the tiny random-init model (module fixture, through `main`) on a
small JSONL file; a checkpoint-shaped folder (policy/ + config.yaml) written without training.
"""

import json

import pytest

from yatt.cli import main
from yatt.config import load_config, save_config
from yatt.models import save_checkpoint, tiny_model

LR = 1e-3


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    rows = [{"prompt": f"What is {a} + 1?", "answer": a + 1} for a in range(12)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, data_file):
    run_dir = tmp_path_factory.mktemp("sft")
    argv = ["sft", "tiny_test", f"data.path={data_file}", "data.n_heldout=3", "eval.n=3",
            "train.steps=2", f"optim.lr={LR}", "optim.schedule=linear", "logging.plots=true",
            "algo.micro_batch_size=4", f"logging.run_dir={run_dir}"]  # fmt: skip
    assert main(argv) == 0
    return run_dir


def test_sft_writes_its_loss_plot_as_train_writes_its_plots(sft_run) -> None:
    # logging.plots was ignored: only `yatt report` wrote loss.png.
    assert (sft_run / "loss.png").stat().st_size > 1000


def test_sft_logs_the_rate_each_step_used(sft_run) -> None:
    lines = (sft_run / "sft_metrics.jsonl").read_text().splitlines()
    rates = [json.loads(line)["sft/lr"] for line in lines]
    assert rates == pytest.approx([LR, LR / 2])  # linear: 1 -> 0 over 2 steps, from step 1


def test_report_of_an_sft_folder_prints_its_loss_summary(sft_run, capsys) -> None:
    assert main(["report", str(sft_run)]) == 0
    table = capsys.readouterr().err
    assert "yatt sft summary" in table
    assert "train loss, first 1 steps (mean)" in table and "held-out loss at step 2" in table


def test_eval_of_an_sft_model_uses_its_saved_config(sft_run, data_file, capsys) -> None:
    model = sft_run / "model"
    assert load_config(str(model / "config.yaml")).data.path == str(data_file)
    assert main(["eval", str(model)]) == 0
    assert f"on 3 held-out {data_file} problems" in capsys.readouterr().out
    assert main(["eval", str(model), "eval.n=2", "model.dtype=bfloat16"]) == 0  # overrides win
    assert f"on 2 held-out {data_file} problems" in capsys.readouterr().out


def test_eval_of_a_run_folder_names_the_models_in_it(sft_run, capsys) -> None:
    assert main(["eval", str(sft_run)]) == 2
    err = capsys.readouterr().err
    named = f"{sft_run} is a run folder, not a model: evaluate {sft_run / 'model'}"
    assert f"yatt: error: {named}" in err


def test_eval_of_a_run_folder_that_kept_no_model_says_so(tmp_path, capsys) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["eval", str(tmp_path)]) == 2
    assert f"yatt: error: {tmp_path} is a run folder that kept no model" in capsys.readouterr().err


def test_eval_of_a_checkpoint_uses_its_saved_config(tmp_path, data_file, capsys) -> None:
    checkpoint = tmp_path / "step_000001"
    save_checkpoint(*tiny_model(seed=0), checkpoint / "policy")
    trained = load_config("tiny_test", [f"data.path={data_file}", "data.n_heldout=4", "eval.n=4"])
    save_config(trained, checkpoint)
    assert main(["eval", str(checkpoint)]) == 0
    assert f"on 4 held-out {data_file} problems" in capsys.readouterr().out
    assert main(["eval", str(checkpoint / "policy")]) == 0  # its model: the checkpoint's config
    assert f"on 4 held-out {data_file} problems" in capsys.readouterr().out
    no_evals = [f"data.path={data_file}", "data.n_heldout=5", "eval.n=0"]
    save_config(load_config("tiny_test", no_evals), checkpoint)  # a run that did not evaluate
    assert main(["eval", str(checkpoint)]) == 0  # the default eval.n: all 5 held-out rows
    assert f"on 5 held-out {data_file} problems" in capsys.readouterr().out
    assert main(["eval", str(checkpoint), "eval.n=0"]) == 2
    assert "eval.n=0 leaves nothing to evaluate" in capsys.readouterr().err
    # Another split of the run's own data: its "held-out" rows may be ones the run trained on.
    assert main(["eval", str(checkpoint), "data.seed=3"]) == 0
    out = capsys.readouterr().out
    assert f"on 5 {data_file} problems of a split unlike the run's (data.seed=3, not 0)" in out
    assert main(["eval", str(checkpoint), "data.n_heldout=2"]) == 0  # a prefix of the run's
    assert f"on 2 held-out {data_file} problems" in capsys.readouterr().out


def test_eval_takes_the_model_of_a_run_whose_controller_settings_needed_lora(
    tmp_path, data_file, capsys
) -> None:
    """A Ray run with LoRA, a KL term and runtime re-placement is valid; its saved model holds
    merged weights, which eval loads without adapters. The run's control section is not
    eval's (without LoRA it would be refused: no reference model to hand over in a move)."""
    checkpoint = tmp_path / "step_000001"
    save_checkpoint(*tiny_model(seed=0), checkpoint / "policy")
    trained = load_config("tiny_test", [
        f"data.path={data_file}", "data.n_heldout=4", "eval.n=4", "model.lora_rank=8",
        "algo.kl_coef=0.01", "control.backend=ray", "control.n_devices=2",
        "control.replace_every=2",
    ])  # fmt: skip
    save_config(trained, checkpoint)
    assert main(["eval", str(checkpoint)]) == 0, capsys.readouterr().err
    assert f"on 4 held-out {data_file} problems" in capsys.readouterr().out


def test_eval_ends_completions_at_the_runs_stop_strings(tmp_path, data_file, monkeypatch):
    """Held-out completions stop where training's did (rollout.stop): running on past a stop
    string, a completion could score an answer made up after it."""
    import yatt.evaluate

    seen = []
    real = yatt.evaluate.evaluate_engine

    def recording(engine, tokenizer, examples, **kwargs):
        return real(_Recorder(engine, seen), tokenizer, examples, **kwargs)

    monkeypatch.setattr(yatt.evaluate, "evaluate_engine", recording)
    checkpoint = tmp_path / "step_000001"
    save_checkpoint(*tiny_model(seed=0), checkpoint / "policy")
    trained = load_config("tiny_test", [f"data.path={data_file}", "data.n_heldout=2",
                                        "eval.n=2", 'rollout.stop=["</answer>"]'])  # fmt: skip
    save_config(trained, checkpoint)
    assert main(["eval", str(checkpoint)]) == 0
    assert seen and all(stop == ("</answer>",) for stop in seen)


class _Recorder:
    """An engine that notes the stop strings of each request, then generates."""

    def __init__(self, engine, seen: list) -> None:
        self.engine, self.seen = engine, seen

    def generate(self, prompt_ids, params, *args):
        self.seen.append(params.stop)
        return self.engine.generate(prompt_ids, params, *args)


def test_sft_refuses_control_settings_it_would_ignore(tmp_path, capsys) -> None:
    run_dir = tmp_path / "sft"
    argv = ["sft", "tiny_test", "control.backend=ray", f"logging.run_dir={run_dir}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "yatt: error: yatt sft runs in one process and reads no control.* key: ['control.backend']"
    )
    assert not run_dir.exists()


def test_sft_refuses_bf16_autocast_it_would_not_act_on(tmp_path, capsys) -> None:
    run_dir = tmp_path / "sft"
    argv = ["sft", "tiny_test", "train.bf16_autocast=true", f"logging.run_dir={run_dir}"]
    assert main(argv) == 2
    assert "yatt sft does not act on train.bf16_autocast" in capsys.readouterr().err
    assert not run_dir.exists()
