"""The TRL comparison script's argument parsing, config building and report (no TRL, no network)."""

import dataclasses
import importlib.metadata

import pytest

from yatt.config import load_config


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("trl_compare")


@pytest.fixture(scope="module")
def report(bench_module):
    return bench_module("trl_report")  # what the script imports


def test_defaults_are_the_reference_shape(bench):
    settings = bench.settings_from_args(bench.parse_args(["--threads", "2"]))
    assert (settings.model, settings.steps, settings.threads) == ("smollm2", 30, 2)
    assert settings.batch_completions == 8
    assert (settings.max_new_tokens, settings.temperature, settings.lr) == (16, 1.0, 5e-6)
    assert bench.settings_from_args(bench.parse_args(["--tiny"])).model == "tiny"


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--threads", "0"], ["--worker", "trl"]])
def test_bad_arguments_exit(bench, argv):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_bad_settings_raise_naming_the_value(bench):
    with pytest.raises(ValueError, match="'gpt2'"):
        bench.BenchSettings(model="gpt2")
    with pytest.raises(ValueError, match="-1"):
        bench.BenchSettings(steps=-1)


def test_yatt_overrides_build_the_shared_config(bench, tmp_path):
    settings = bench.BenchSettings(model="tiny", steps=7, threads=3, seed=5)
    config = load_config("grpo_addition", bench.yatt_overrides(settings, str(tmp_path)))
    assert (config.model.path, config.model.dtype) == ("tiny", "float32")
    assert (config.algo.name, config.algo.prompts_per_step, config.algo.kl_coef) == ("grpo", 2, 0)
    assert (config.rollout.n_samples, config.rollout.max_new_tokens) == (4, 16)
    assert (config.rollout.temperature, config.rollout.top_p, config.rollout.top_k) == (1, 1, 0)
    assert (config.optim.lr, config.optim.schedule) == (5e-6, "linear")
    assert config.optim.warmup_steps == 0
    assert (config.train.steps, config.train.torch_threads, config.train.seed) == (7, 3, 5)
    assert not config.train.bf16_autocast
    assert (config.data.n_train, config.data.n_heldout, config.data.seed) == (5000, 200, 5)
    assert config.eval.n == 0  # the bench evaluates both frameworks itself, the same way


def test_trl_kwargs_mirror_the_yatt_config(bench, tmp_path):
    settings = bench.BenchSettings(steps=9, seed=2)
    kwargs = bench.trl_config_kwargs(settings, str(tmp_path))
    config = load_config("grpo_addition", bench.yatt_overrides(settings, str(tmp_path)))
    completions = config.algo.prompts_per_step * config.rollout.n_samples
    assert kwargs["per_device_train_batch_size"] == completions
    assert kwargs["num_generations"] == config.rollout.n_samples
    assert kwargs["max_completion_length"] == config.rollout.max_new_tokens
    assert kwargs["learning_rate"] == config.optim.lr
    assert kwargs["max_grad_norm"] == config.optim.grad_clip
    assert kwargs["epsilon"] == config.algo.clip_low == config.algo.clip_high
    assert (kwargs["beta"], kwargs["max_steps"], kwargs["seed"]) == (0.0, 9, 2)
    assert (kwargs["gradient_accumulation_steps"], kwargs["num_iterations"]) == (1, 1)
    assert not (kwargs["bf16"] or kwargs["fp16"] or kwargs["gradient_checkpointing"])
    assert kwargs["shuffle_dataset"] is False  # prompts come in yatt's sampler order


def test_worker_command_passes_the_settings(bench, tmp_path):
    settings = bench.BenchSettings(model="tiny", steps=4, threads=1, seed=3, eval_every=2)
    command = bench.worker_command("trl", settings, tmp_path / "r.json")
    back = bench.settings_from_args(bench.parse_args(command[2:]))
    assert back == settings
    with pytest.raises(ValueError, match="'jax'"):
        bench.worker_command("jax", settings, tmp_path / "r.json")


def test_missing_trl_without_install_raises(bench, monkeypatch):
    real_version = importlib.metadata.version

    def version(name):
        if name == "trl":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(RuntimeError, match="no-install"):
        bench.ensure_trl(allow_install=False)


def test_summary_counts_completions_and_tokens(bench, report):
    settings = bench.BenchSettings(steps=2)
    steps = [
        {"step_s": 2.0, "reward": 0.5, "completion_tokens": 80.0, "phases_s": {"gen": 1.0}},
        {"step_s": 6.0, "reward": 0.0, "completion_tokens": 40.0, "phases_s": {"gen": 3.0}},
    ]
    result = {"framework": "x", "version": "0", "steps": steps, "accuracy_before": 0.1,
              "accuracy_after": 0.2, "torch_threads": 2}  # fmt: skip
    summary = report.summarize(result, settings)
    assert summary["samples_per_s"] == pytest.approx(16 / 8)
    assert summary["tokens_per_s"] == pytest.approx(120 / 8)
    assert summary["step_s_median"] == pytest.approx(4.0)
    assert summary["phase_s_median"]["gen"] == pytest.approx(2.0)


def test_trl_and_yatt_tokenise_the_prompt_identically(bench):
    from yatt.data import generate_task
    from yatt.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    assert bench.trl_prompt_ids_match(tokenizer, generate_task("addition", 1, seed=0)[0])


def test_accuracy_is_measured_every_n_steps_and_at_the_end(bench):
    settings = bench.BenchSettings(steps=25, eval_every=10)
    assert [s for s in range(1, 26) if settings.evaluates_after(s)] == [10, 20, 25]
    with pytest.raises(ValueError, match="eval_every must be >= 1, got 0"):
        bench.BenchSettings(eval_every=0)


def test_curve_table_lines_up_every_run_by_step(report):
    curves = {"yatt": [(0, 0.1), (10, 0.5)], "yatt_bf16": [(0, 0.1), (10, 0.4)],
              "trl": [(0, 0.1), (10, 0.25)]}  # fmt: skip
    rows = report.curve_table(curves)
    assert "| step | yatt fp32 | yatt bf16 rollouts | TRL |" in rows
    assert "| 10 | 50.0% | 40.0% | 25.0% |" in rows
    assert report.curve_table({"yatt": [], "trl": [(0, 0.1)]}) == []


def test_bf16_run_differs_from_the_fp32_run_only_in_the_rollout_dtype(bench, tmp_path):
    settings = bench.BenchSettings(model="tiny", steps=3)
    fp32 = load_config("grpo_addition", bench.yatt_overrides(settings, str(tmp_path)))
    bf16 = load_config(
        "grpo_addition",
        bench.yatt_overrides(settings, str(tmp_path), bench.ROLLOUT_DTYPES["yatt_bf16"]),
    )
    assert (fp32.rollout.dtype, bf16.rollout.dtype) == ("float32", "bfloat16")
    assert bf16.model.dtype == "float32" and not bf16.train.bf16_autocast  # training stays fp32
    assert bf16.algo.tis_cap == 2.0
    assert dataclasses.replace(bf16, rollout=fp32.rollout) == fp32
    assert bench.RUNS == ("yatt", "yatt_bf16", "trl")
    command = bench.worker_command("yatt_bf16", settings, tmp_path / "r.json")
    assert bench.parse_args(command[2:]).worker == "yatt_bf16"


def test_report_has_one_column_and_one_ratio_per_run(bench, report):
    settings = bench.BenchSettings(steps=1, eval_every=1)
    summaries = {}
    for run, step_s in (("yatt", 2.0), ("yatt_bf16", 1.0), ("trl", 4.0)):
        result = {"run": run, "framework": run.split("_")[0], "version": "0",
                  "steps": [{"step_s": step_s, "reward": 0.5, "completion_tokens": 80.0,
                             "phases_s": {"gen": 1.0}}],
                  "accuracy_before": 0.1, "accuracy_after": 0.3,
                  "accuracy_curve": [(0, 0.1), (1, 0.3)], "torch_threads": 2}  # fmt: skip
        summaries[run] = report.summarize(result, settings)
    host = {"cpus": 2, "processor": "x", "python": "3", "torch": "t", "transformers": "5",
            "trl": "1", "load_avg_1m_end": 0.0}  # fmt: skip
    text = report.markdown(summaries, settings, host, bench.FAIRNESS)
    assert "| | yatt fp32 | yatt bf16 rollouts | TRL |" in text
    assert "| completions/s | 4.00 | 8.00 | 2.00 |" in text
    assert "yatt fp32 is **2.00x** TRL" in text and "yatt bf16 rollouts is **4.00x** TRL" in text
    assert "| 1 | 30.0% | 30.0% | 30.0% |" in text


def test_training_wall_time_leaves_out_the_evaluations_made_during_training(bench, monkeypatch):
    """The step-0 evaluation runs before training starts: only the ones after it are taken
    out of the training wall time (it used to take out every one, step 0's included)."""
    clock = iter([0.0, 5.0, 5.0, 12.0, 15.0, 20.0])  # eval 0-5 s, train from 5, eval 12-15
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(bench, "heldout_accuracy", lambda *args: 0.5)
    curve = bench._AccuracyCurve(bench.BenchSettings(), [])
    curve.measure(0, None, None)
    curve.start_training()
    curve.measure(10, None, None)
    assert curve.spent_s == 8.0 and curve.train_wall_s() == 12.0  # 15 s less 3 s evaluating
