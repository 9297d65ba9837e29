"""GPU benchmark: yatt's rollout engine vs HF `generate`, training throughput/MFU, a GRPO step.

Usage: ``python yatt/bench/gpu.py [--reduced] [--out-dir DIR] [--shapes qwen2.5-0.5b,...]
[--batches 64,256] [--skip-hf]``

Random-init models of the Qwen2.5-0.5B and -1.5B shapes (Qwen2 architecture, built in code, bf16
weights), the same recipe as ``shared/anchors/h200_hf_baseline.py``: prompts of 128 random token
ids, 256 new tokens sampled at temperature 1 with no EOS, batch 64 and 256; HF `generate` and
yatt's engine run side by side in one process. Training: forward + backward + fused AdamW on
16 x 1024 tokens (8 x 1024 for 1.5B), MFU against a bf16 matmul measured in the same run. GRPO
step: yatt's engine samples 32 prompts x 8 completions, a synthetic reward, yatt's GRPO
advantages and clipped policy loss, one AdamW step; time per phase. Writes ``yatt_gpu.json`` and
``yatt_gpu.md`` to ``--out-dir`` (default ``$OUT``, else ``docs/bench``) and compares with the
anchor figures. ``--reduced`` runs tiny shapes on CPU in well under a minute (a smoke test).
"""

import argparse
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import Qwen2Config, Qwen2ForCausalLM

from yatt.algos.advantages import compute_advantages
from yatt.algos.losses import policy_loss
from yatt.batch import RolloutBatch
from yatt.common.hostfacts import cpu_model, host_facts
from yatt.report import wide_console
from yatt.roles._forward import response_logits, token_logprobs_and_entropy
from yatt.rollout import RolloutEngine, SamplingParams

REPO = Path(__file__).resolve().parents[2]
ANCHORS = REPO.parent / "shared" / "anchors" / "h200_hf_baseline.json"
SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1024,
    ),
}


@dataclass(frozen=True)
class Plan:
    """Sizes of one run (full on a GPU, reduced for a CPU smoke test)."""

    shapes: tuple[str, ...]
    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    train_rows: dict[str, int]
    train_len: int
    grpo_prompts: int
    grpo_group: int
    dtype: torch.dtype


FULL = Plan(
    ("qwen2.5-0.5b", "qwen2.5-1.5b"),
    (64, 256),
    128,
    256,
    {"qwen2.5-0.5b": 16, "qwen2.5-1.5b": 8},
    1024,
    32,
    8,
    torch.bfloat16,
)
REDUCED = Plan(("tiny",), (4, 8), 16, 16, {"tiny": 2}, 64, 2, 4, torch.float32)


class DigitsTokenizer:
    """Stands in for a tokenizer on random-init models: no EOS, ids decode to their digits."""

    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    console = wide_console()  # 160 columns off a terminal (logs)
    device = torch.device("cpu" if args.reduced else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --reduced for the CPU smoke test")
    plan = REDUCED if args.reduced else FULL
    shapes = tuple(args.shapes.split(",")) if args.shapes else plan.shapes
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else plan.batches
    result: dict = {"host": _host(device), "plan": _plan_dict(plan, shapes, batches)}
    result["peak_tflops"] = _peak_tflops(device, plan.dtype)
    for name in shapes:
        console.print(f"[bold]{name}[/bold]: building the model")
        model = _model(name, device, plan.dtype)
        for batch in batches:
            result[f"{name}/gen_bs{batch}"] = _rollout(model, batch, plan, args.skip_hf)
            console.print(f"  rollout bs{batch}: {result[f'{name}/gen_bs{batch}']}")
        result[f"{name}/train"] = _train(model, plan.train_rows[name], plan.train_len, result)
        result[f"{name}/grpo_step"] = _grpo_step(model, plan)
        console.print(f"  train: {result[f'{name}/train']}")
        console.print(f"  grpo step: {result[f'{name}/grpo_step']}")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _compare_anchors(result, shapes, batches, args.anchors)
    out_dir = args.out_dir or Path(os.environ.get("OUT") or REPO / "docs" / "bench")
    _report(console, result, shapes, batches, out_dir)
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--shapes", default="", help=f"comma-separated, from {sorted(SHAPES)}")
    parser.add_argument("--batches", default="", help="rollout batch sizes, e.g. 64,256")
    parser.add_argument("--skip-hf", action="store_true", help="time yatt only (no HF generate)")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--anchors", type=Path, default=ANCHORS, help="plain-HF H200 figures")
    args = parser.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s and s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape {unknown[0]!r}; valid: {sorted(SHAPES)}")
    return args


def _model(name: str, device: torch.device, dtype: torch.dtype) -> Qwen2ForCausalLM:
    config = Qwen2Config(max_position_embeddings=4096, tie_word_embeddings=True, **SHAPES[name])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with device:  # initialise on the device: a 1.5B init on the host takes long
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(device: torch.device, fn) -> tuple[object, float]:
    _sync(device)
    start_s = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - start_s


def _rollout(model, batch: int, plan: Plan, skip_hf: bool) -> dict:
    """Generated tokens/s of yatt's engine and of HF generate on the same random prompts."""
    device = model.device
    generator = torch.Generator().manual_seed(batch)
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab - 1, (batch, plan.prompt_len), generator=generator)
    engine = RolloutEngine(model, DigitsTokenizer(), static=True)
    params = SamplingParams(max_new_tokens=plan.new_tokens, temperature=1.0)
    prompts, seeds = ids.tolist(), list(range(batch))
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=8), seeds[:2])  # warm-up
    completions, yatt_s = _timed(device, lambda: engine.generate(prompts, params, seeds))
    tokens = sum(len(c.token_ids) for c in completions)
    out = {"yatt_tok_per_s": tokens / yatt_s, "yatt_s": yatt_s, "tokens": tokens}
    if not skip_hf:
        hf_tokens, hf_s = _hf_generate(model, ids.to(device), plan.new_tokens)
        out |= {"hf_tok_per_s": hf_tokens / hf_s, "hf_s": hf_s}
        out["speedup"] = out["yatt_tok_per_s"] / out["hf_tok_per_s"]
    return out


def _hf_generate(model, ids: torch.Tensor, new_tokens: int) -> tuple[int, float]:
    """The anchor's measurement: sampling, no EOS, every row generates `new_tokens`."""
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=0,
        eos_token_id=None,
    )
    with torch.no_grad():
        model.generate(ids[:, :16], **(kwargs | dict(max_new_tokens=8, min_new_tokens=8)))
        out, elapsed_s = _timed(model.device, lambda: model.generate(ids, **kwargs))
    return (out.shape[1] - ids.shape[1]) * ids.shape[0], elapsed_s


def _train(model, rows: int, length: int, result: dict, steps: int = 3) -> dict:
    """Forward + backward + fused AdamW tokens/s on (rows, length) random ids, and MFU."""
    device = model.device
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(100, model.config.vocab_size - 1, (rows, length), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: optimizer state, kernel choices
    _, elapsed_s = _timed(device, lambda: [step() for _ in range(steps)])
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_s = rows * length * steps / elapsed_s
    mfu = 6 * n_params * tokens_per_s / (result["peak_tflops"] * 1e12)
    out = {"tok_per_s": tokens_per_s, "mfu_vs_measured_peak": mfu, "params": n_params}
    return out | (_swap(optimizer, device) if device.type == "cuda" else {})


def _swap(optimizer: torch.optim.Optimizer, device: torch.device) -> dict:
    """Seconds to park AdamW's moments in pinned host memory and bring them back, as a
    time-shared (colocated) policy rank does around each update (`yatt.control.rank._moved`)."""
    from yatt.control.rank import _moved

    tensors = [
        (state, key)
        for state in optimizer.state.values()
        for key, value in state.items()
        if torch.is_tensor(value) and value.dim()
    ]
    nbytes = sum(state[key].numel() * state[key].element_size() for state, key in tensors)

    def move(target: torch.device) -> float:
        _sync(device)
        start_s = time.perf_counter()
        for state, key in tensors:
            state[key] = _moved(state[key], target)
        _sync(device)
        return time.perf_counter() - start_s

    for _ in range(2):  # the second round reuses the pinned buffers, as later steps do
        seconds = {"offload_s": move(torch.device("cpu")), "onload_s": move(device)}
    gb_per_s = 2 * nbytes / 1e9 / sum(seconds.values())
    return seconds | {"swap_bytes": nbytes, "swap_gb_per_s": gb_per_s}


def _grpo_step(model, plan: Plan) -> dict:
    """One GRPO step on the device, timed by phase: gen, reward, adv, update."""
    device = model.device
    timings: dict[str, float] = {}
    generator = torch.Generator().manual_seed(7)
    prompts = torch.randint(
        100, model.config.vocab_size - 1, (plan.grpo_prompts, plan.prompt_len), generator=generator
    ).tolist()
    requests = [p for p in prompts for _ in range(plan.grpo_group)]
    engine = RolloutEngine(model, DigitsTokenizer(), static=True)
    params = SamplingParams(max_new_tokens=plan.new_tokens, temperature=1.0)
    seeds = list(range(len(requests)))
    completions, timings["gen"] = _timed(device, lambda: engine.generate(requests, params, seeds))
    start_s = time.perf_counter()
    # Synthetic reward: the share of even token ids, so groups differ and advantages are real.
    rewards = torch.tensor(
        [sum(t % 2 == 0 for t in c.token_ids) / len(c.token_ids) for c in completions]
    )
    timings["reward"] = time.perf_counter() - start_s
    batch = RolloutBatch.from_token_lists(requests, [c.token_ids for c in completions])
    group_ids = torch.arange(plan.grpo_prompts).repeat_interleave(plan.grpo_group)
    (advantages, _), timings["adv"] = _timed(
        device, lambda: compute_advantages("grpo", rewards=rewards, group_ids=group_ids)
    )
    _, timings["update"] = _timed(device, lambda: _update(model, batch, advantages))
    tokens = sum(len(c.token_ids) for c in completions)
    return {
        "step_s": sum(timings.values()),
        "phase_s": timings,
        "completions": len(completions),
        "gen_tok_per_s": tokens / timings["gen"],
        "reward_mean": float(rewards.mean()),
    }


def _update(model, batch: RolloutBatch, advantages: torch.Tensor, micro_rows: int = 16) -> None:
    """Clipped policy-gradient loss over the batch in micro-batches, then one AdamW step."""
    device = model.device
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")
    mask = batch.response_mask.to(device)
    normalizer = float(mask.sum())
    for start in range(0, batch.size, micro_rows):
        rows = slice(start, start + micro_rows)
        ids = batch.input_ids[rows].to(device)
        logits = response_logits(
            model, ids, batch.attention_mask[rows].to(device), batch.prompt_width
        )
        response = ids[:, batch.prompt_width :]
        logp, _ = token_logprobs_and_entropy(logits, response, 1.0, False)
        loss, _ = policy_loss(
            logp.float(),
            logp.detach().float(),
            advantages[rows].to(device).expand_as(logp),
            mask[rows],
            normalizer=normalizer,
        )
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


def _peak_tflops(device: torch.device, dtype: torch.dtype) -> float:
    """Measured dense matmul throughput (TFLOP/s), the MFU denominator."""
    size = 8192 if device.type == "cuda" else 512
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    repeats = 10
    _, elapsed_s = _timed(device, lambda: [a @ b for _ in range(repeats)])
    return 2 * size**3 * repeats / elapsed_s / 1e12


def _compare_anchors(result: dict, shapes: tuple[str, ...], batches: tuple[int, ...],
                     path: Path) -> None:  # fmt: skip
    """Add yatt's ratio to the anchor figures (plain HF on an H200) where they exist."""
    if not path.is_file():
        return
    anchors = json.loads(path.read_text())
    result["anchors_file"] = path.name
    for name in shapes:
        for batch in batches:
            anchor = anchors.get(f"{name}/hf_generate_bs{batch}_tok_per_s")
            if anchor:
                cell = result[f"{name}/gen_bs{batch}"]
                cell["anchor_hf_tok_per_s"] = anchor
                cell["speedup_vs_anchor"] = cell["yatt_tok_per_s"] / anchor
        anchor_train = anchors.get(f"{name}/train_tok_per_s")
        if anchor_train:
            result[f"{name}/train"]["anchor_tok_per_s"] = anchor_train


def _host(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return host_facts() | {"device": name}


def _plan_dict(plan: Plan, shapes: tuple[str, ...], batches: tuple[int, ...]) -> dict:
    return {
        "shapes": list(shapes),
        "batches": list(batches),
        "prompt_len": plan.prompt_len,
        "new_tokens": plan.new_tokens,
        "dtype": str(plan.dtype),
        "train_len": plan.train_len,
        "grpo": f"{plan.grpo_prompts} prompts x {plan.grpo_group}",
    }


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _report(console: Console, result: dict, shapes, batches, out_dir: Path) -> None:
    table = Table(title="yatt on GPU: rollout tokens/s, training, GRPO step")
    for column in ("model", "batch", "hf tok/s", "yatt tok/s", "speedup", "anchor hf tok/s"):
        table.add_column(column, justify="right")
    lines = [
        "| model | batch | hf tok/s | yatt tok/s | speedup | anchor hf tok/s | vs anchor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in shapes:
        for batch in batches:
            cell = result[f"{name}/gen_bs{batch}"]
            row = [
                name,
                str(batch),
                _fmt(cell.get("hf_tok_per_s")),
                _fmt(cell["yatt_tok_per_s"]),
                _fmt(cell.get("speedup"), ".2f") + "x",
                _fmt(cell.get("anchor_hf_tok_per_s")),
            ]
            table.add_row(*row)
            lines.append(
                "| " + " | ".join(row) + f" | {_fmt(cell.get('speedup_vs_anchor'), '.1f')}x |"
            )
    lines += [
        "",
        "| model | train tok/s | MFU | AdamW moments out + back s (GB/s) | GRPO step s | gen "
        "| reward | adv | update |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in shapes:
        train, step = result[f"{name}/train"], result[f"{name}/grpo_step"]
        phases = " | ".join(f"{step['phase_s'][p]:.2f}" for p in ("gen", "reward", "adv", "update"))
        swap = (
            f"{train['offload_s']:.3f} + {train['onload_s']:.3f} ({train['swap_gb_per_s']:.1f})"
            if "offload_s" in train
            else "-"
        )
        lines.append(
            f"| {name} | {train['tok_per_s']:.0f} | {100 * train['mfu_vs_measured_peak']:.1f}% "
            f"| {swap} | {step['step_s']:.2f} | {phases} |"
        )
    console.print(table)
    host = result["host"]
    header = [
        "## yatt on GPU",
        "",
        f"{host['device']}, torch {host['torch']}, commit {host['git_commit']}, "
        f"{host['time_utc']}. Produced by "
        "`python yatt/bench/gpu.py`. Random-init Qwen2-architecture models of the given shapes "
        f"({result['plan']['dtype']}), prompts of {result['plan']['prompt_len']} random ids, "
        f"{result['plan']['new_tokens']} new tokens sampled at temperature 1 without EOS. "
        f"Measured bf16 matmul peak: {result['peak_tflops']:.0f} TFLOP/s (the MFU denominator). "
        f"GRPO step: {result['plan']['grpo']} completions.",
        "",
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "yatt_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    (out_dir / "yatt_gpu.md").write_text("\n".join(header + lines) + "\n")
    console.print(f"wrote {out_dir / 'yatt_gpu.json'} and {out_dir / 'yatt_gpu.md'}")
    gen = [result[f"{n}/gen_bs{b}"]["yatt_tok_per_s"] for n in shapes for b in batches]
    print(f"[summary] yatt_gen_tok_per_s_geomean={statistics.geometric_mean(gen):.0f}")


if __name__ == "__main__":
    sys.exit(main())
