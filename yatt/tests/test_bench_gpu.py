"""The GPU benchmark script in its reduced CPU mode: it runs end to end and reports sane numbers.

Method: run `yatt/bench/gpu.py --reduced` in-process (tiny Qwen2 shape on CPU) into a temporary
folder and check the JSON and markdown it writes: every throughput positive and finite, yatt's
engine produced every requested token (no EOS on random models), the GRPO step timed by phase.
"""

import json
import math

import torch


def test_reduced_gpu_bench_writes_json_and_table(tmp_path, bench_script):
    torch.set_num_threads(1)
    bench = bench_script("gpu")
    assert bench.main(["--reduced", "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "yatt_gpu.json").read_text())
    plan = result["plan"]
    assert plan["shapes"] == ["tiny"] and plan["batches"] == [4, 8]
    for batch in plan["batches"]:
        cell = result[f"tiny/gen_bs{batch}"]
        assert cell["tokens"] == batch * plan["new_tokens"]
        for key in ("yatt_tok_per_s", "hf_tok_per_s", "speedup"):
            assert math.isfinite(cell[key]) and cell[key] > 0, (key, cell)
    train = result["tiny/train"]
    assert train["tok_per_s"] > 0 and 0 < train["mfu_vs_measured_peak"] < 10
    step = result["tiny/grpo_step"]
    assert step["completions"] == 8
    assert set(step["phase_s"]) == {"gen", "reward", "adv", "update"}
    assert step["step_s"] == sum(step["phase_s"].values())
    assert 0 <= step["reward_mean"] <= 1
    table = (tmp_path / "yatt_gpu.md").read_text()
    assert "| tiny | 8 |" in table and "GRPO step" in table


def test_gpu_control_check_on_cpu_runs_both_parts(tmp_path, bench_script):
    """`gpu_control.py --device-kind cpu` with small settings: the controller modes agree, the
    shaped run's steps are timed by phase, and the report names the result."""
    torch.set_num_threads(1)
    bench = bench_script("gpu_control")
    argv = ["--device-kind", "cpu", "--steps", "2", "--prompts", "2", "--samples", "2",
            "--new-tokens", "4", "--layers", "1", "--out-dir", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads((tmp_path / "yatt_gpu_control.json").read_text())
    assert result["modes"]["equal_weights"] and result["modes"]["tensors"] > 0
    steps = result["smollm2_shape"]["steps"]
    assert len(steps) == 2
    for step in steps:
        assert step["timing_s/step"] >= step["timing_s/gen"] + step["timing_s/update_actor"] > 0
        assert 0 < step["response_length/mean"] <= 4
    assert result["smollm2_shape"]["summary"]["perf/gen_tokens_per_s"] > 0
    table = (tmp_path / "yatt_gpu_control.md").read_text()
    assert "trained weights **equal**" in table and "| update_actor |" in table


def test_gpu_update_diagnostic_on_cpu_times_each_setting(bench_script, monkeypatch, capsys):
    torch.set_num_threads(1)
    bench = bench_script("gpu_update")
    monkeypatch.setitem(bench.SHAPE, "num_hidden_layers", 1)
    assert bench.main(["cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("cpu, torch") and "8 rows x (48 + 16) tokens" in lines[0]
    labels = [line.split(":")[0] for line in lines[1:]]
    assert labels == ["micro-batch 8", "micro-batch 32", "micro-batch 8, TF32"]
    assert all(float(line.split(": ")[1].split(" s")[0]) > 0 for line in lines[1:])
