"""The DPO comparison script's settings, yatt config and report (no TRL, no runs)."""

import pytest

from yatt.config import load_config


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("dpo_trl")


def test_the_yatt_run_takes_the_shared_settings(bench, tmp_path):
    settings = bench.Settings(model="tiny", steps=7, threads=3, heldout=16)
    pairs, run_dir = tmp_path / "pairs.jsonl", tmp_path / "run"
    config = load_config("dpo_addition", bench.yatt_overrides(settings, pairs, run_dir))
    assert (config.model.path, config.data.path) == ("tiny", str(pairs))
    assert config.data.rejected == "slips"  # the file's own pairs
    assert (config.algo.micro_batch_size, config.algo.dpo_beta) == (8, 0.1)
    assert (config.algo.dpo_loss, config.algo.dpo_sft_weight) == ("sigmoid", 0.0)  # TRL's loss
    assert (config.optim.lr, config.optim.schedule) == (5e-6, "linear")
    assert config.optim.warmup_steps == 0
    assert (config.optim.weight_decay, config.optim.grad_clip) == (0.0, 1.0)
    assert (config.train.steps, config.train.torch_threads) == (7, 3)
    assert (config.data.n_heldout, config.eval.n) == (16, 16)
    assert (config.data.seed, config.train.seed) == (0, 0)
    assert (config.optim.beta1, config.optim.beta2, config.optim.eps) == (0.9, 0.999, 1e-8)


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--threads", "0"]])
def test_bad_arguments_exit(bench, argv):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def _run(step_s: float, reference_s: float) -> dict:
    return {"version": "x", "reference_s": reference_s, "step_s": [step_s] * 10,
            "loss": [0.6931] + [0.3] * 9, "accuracy_before": 0.1, "accuracy_after": 0.3,
            "pairs": 80, "heldout_pairs_right": 0.9, "token_mismatches": 0}  # fmt: skip


def test_the_report_gives_the_ratios_it_measured(bench, tmp_path):
    host = {"cpus": 2, "processor": "cpu", "python": "3", "torch": "t", "transformers": "tf",
            "trl": "1", "git_commit": "abc", "load_avg_1m": 1.0}  # fmt: skip
    payload = {"settings": vars(bench.Settings(steps=10)),
               "pairs": {"prompts": 100, "pairs": 96, "sampling_s": 30.0, "samples_best": 0.03},
               "runs": {"yatt": _run(2.0, 10.0), "trl": _run(5.0, 20.0)},
               "fairness": bench.FAIRNESS, "host": host}  # fmt: skip
    bench.write_report(tmp_path, payload)
    text = (tmp_path / "yatt_dpo_trl.md").read_text()
    assert "**2.50x** faster than TRL (median)" in text  # 5.0 / 2.0
    assert "reference pass plus steps: 2.33x" in text  # (20 + 50) / (10 + 20)
    assert "| held-out accuracy after | 30.0% | 30.0% |" in text
    assert "Responses TRL tokenised otherwise than yatt: 0 of 160" in text
    assert (tmp_path / "yatt_dpo_trl.png").stat().st_size > 0
