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
