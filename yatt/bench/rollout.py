"""Rollout throughput: yatt's RolloutEngine against HF `generate` on the same model and prompts.

Usage: ``python yatt/bench/rollout.py [--quick] [--device cpu|cuda] [--repeats 3]
[--batch-sizes 1,8,32] [--new-tokens 16,64] [--group-size 4] [--threads N] [--out-dir DIR]``

Prompts are the two-digit addition task ("What is a + b? Answer with just the number.") in the
model's chat template (~45 tokens), in groups of ``--group-size`` identical prompts as a GRPO
step samples them. Each cell runs both engines with the same prompts, batch size and limit,
greedy and sampled (temperature 1, one seed per request), alternating which goes first. Tokens
are counted honestly: the tokens each engine produced up to EOS or the limit. Writes
``yatt_rollout.json``, ``yatt_rollout.md`` (a section for docs/benchmarks.md) and
``yatt_rollout.png`` to ``--out-dir`` (``docs/bench``; a temp folder with ``--quick``, which
uses a tiny random-init model).
"""

import argparse
import copy
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from yatt.common.hostfacts import host_facts
from yatt.models import load_model, load_tokenizer, tiny_model
from yatt.report import wide_console
from yatt.rollout import HFGenerateEngine, RolloutEngine, SamplingParams

REPO = Path(__file__).resolve().parents[2]
PAIRS = (("hf", "yatt"), ("hf-bf16", "yatt-bf16"))  # (baseline, ours), same dtype
MODES = ("greedy", "sample")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    console = wide_console()  # 160 columns off a terminal (logs)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, model_name = _model(args.quick, device)
    cells = [
        (batch, new_tokens, mode)
        for batch in args.batch_sizes
        for new_tokens in args.new_tokens
        for mode in MODES
    ]
    records = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("rollout bench", total=len(cells) * args.repeats)
        engines = _engines(model, tokenizer, args.bf16)
        for batch, new_tokens, mode in cells:
            prompts = _addition_prompts(tokenizer, batch, args.group_size, seed=batch)
            params = SamplingParams(
                max_new_tokens=new_tokens, temperature=1.0, greedy=(mode == "greedy")
            )
            runs = _cell_runs(
                engines, prompts, params, args.repeats, lambda: progress.advance(task)
            )
            records.append(_record(batch, new_tokens, mode, runs))
    facts = _host_facts(device, model_name, args)
    facts["refresh_cpu_s"] = _refresh_cpu_s(model, engines)
    _report(console, records, facts, _out_dir(args))
    return 0


def _model(quick: bool, device: torch.device):
    if quick:
        model, tokenizer = tiny_model("llama", seed=0, hidden_size=64, num_layers=2)
        return model.to(device), tokenizer, "tiny-llama (random init, 2 layers, hidden 64)"
    return load_model("smollm2", device=str(device)), load_tokenizer("smollm2"), "SmolLM2-135M"


def _addition_prompts(tokenizer, batch: int, group_size: int, seed: int) -> list[list[int]]:
    """`batch` chat-templated addition prompts, in groups of `group_size` identical ones."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    while len(prompts) < batch:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        text = f"What is {a} + {b}? Answer with just the number."
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        prompts.extend([ids] * min(group_size, batch - len(prompts)))
    return prompts


def _engines(model, tokenizer, bf16: bool) -> dict:
    """The engines to compare; with `bf16`, HF on a bf16 copy and yatt with bf16 compute."""
    engines = {"hf": HFGenerateEngine(model, tokenizer), "yatt": RolloutEngine(model, tokenizer)}
    if bf16:
        model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
        engines["hf-bf16"] = HFGenerateEngine(model_bf16, tokenizer)
        engines["yatt-bf16"] = RolloutEngine(model, tokenizer, dtype=torch.bfloat16)
    prompts = [tokenizer.encode("Hello", add_special_tokens=False)] * 2
    for engine in engines.values():  # warm-up: first-call allocations and kernel choices
        engine.generate(prompts, SamplingParams(max_new_tokens=4), seeds=[0, 1])
    return engines


def _refresh_cpu_s(model, engines: dict) -> dict[str, float]:
    """CPU seconds each yatt engine spends rebuilding its fused (and prepacked) weights after a
    weight update, which an RL loop pays once per optimizer step; median of 3."""
    costs = {}
    for name, engine in engines.items():
        if not isinstance(engine, RolloutEngine):
            continue
        times = []
        for _ in range(3):
            with torch.no_grad():
                model.model.norm.weight.mul_(1.0)  # bumps the version as an optimizer step does
            start = time.process_time()
            with torch.inference_mode():  # as in `generate`, which built the copies
                engine._forward.prepare(1, engine.device)
            times.append(time.process_time() - start)
        costs[name] = statistics.median(times)
    return costs


def _cell_runs(engines: dict, prompts, params, repeats: int, advance) -> list[dict[str, dict]]:
    """``repeats`` timed runs of every engine on one cell, after one untimed run of each at the
    cell's shape: a first call at a new batch size and token limit pays allocations that an RL
    loop, sampling the same shape every step, does not (with 2 repeats, a cold first run was
    half of each median)."""
    seeds = list(range(len(prompts)))
    for engine in engines.values():
        engine.generate(prompts, params, seeds)
    runs = []
    for repeat in range(repeats):
        runs.append(_run_cell(engines, prompts, params, repeat))
        advance()
    return runs


def _run_cell(engines: dict, prompts, params, repeat: int) -> dict[str, dict]:
    """Time every engine on the same request; the order rotates with `repeat`."""
    names = list(engines)
    order = names[repeat % len(names) :] + names[: repeat % len(names)]
    seeds = list(range(len(prompts)))
    out: dict = {}
    outputs = {}
    for name in order:
        _sync(engines[name].model)
        start, start_cpu = time.perf_counter(), time.process_time()
        completions = engines[name].generate(prompts, params, seeds)
        _sync(engines[name].model)
        elapsed_s = time.perf_counter() - start
        cpu_s = time.process_time() - start_cpu
        tokens = sum(len(c.token_ids) for c in completions)
        out[name] = {
            "elapsed_s": elapsed_s,
            "cpu_s": cpu_s,
            "tokens": tokens,
            "tokens_per_s": tokens / elapsed_s,
            "tokens_per_cpu_s": tokens / cpu_s,
        }
        outputs[name] = [c.token_ids for c in completions]
    if params.is_greedy:
        # Greedy outputs must agree within a dtype, so both engines did the same work.
        for hf, ours in PAIRS:
            if hf in outputs:
                out[f"identical/{ours}"] = outputs[hf] == outputs[ours]
    return out


def _sync(model) -> None:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def _record(batch: int, new_tokens: int, mode: str, runs: list[dict]) -> dict:
    record: dict = {"batch": batch, "new_tokens": new_tokens, "mode": mode}
    names = [name for name in runs[0] if not name.startswith("identical/")]
    for name in names:
        for key in ("tokens_per_s", "tokens_per_cpu_s", "tokens", "elapsed_s", "cpu_s"):
            record[f"{name}/{key}"] = statistics.median(r[name][key] for r in runs)
    for hf, ours in PAIRS:
        if hf not in names:
            continue
        for key, speedup in (("tokens_per_s", "speedup"), ("tokens_per_cpu_s", "speedup_cpu_time")):
            record[f"{speedup}/{ours}"] = record[f"{ours}/{key}"] / record[f"{hf}/{key}"]
        if mode == "greedy":
            record[f"identical/{ours}"] = all(r[f"identical/{ours}"] for r in runs)
    return record


def _host_facts(device: torch.device, model_name: str, args) -> dict:
    facts = host_facts() | {
        "model": model_name,
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "group_size": args.group_size,
    }
    if device.type == "cuda":
        facts["cuda"] = torch.cuda.get_device_name(device)
    return facts


def _pairs(records: list[dict]) -> list[tuple[str, str]]:
    return [(hf, ours) for hf, ours in PAIRS if f"{hf}/tokens_per_s" in records[0]]


def _report(console: Console, records: list[dict], facts: dict, out_dir: Path) -> None:
    pairs = _pairs(records)
    title = f"generated tokens/s, yatt vs HF generate ({facts['model']}, {facts['device']})"
    table = Table(title=title)
    for column in ["batch", "new", "mode", *_columns(pairs)]:
        table.add_column(column, justify="right")
    for r in records:
        table.add_row(*_cells(r, pairs))
    console.print(table)
    geo_means = {
        ours: statistics.geometric_mean(r[f"speedup/{ours}"] for r in records) for _, ours in pairs
    }
    cpu_means = {
        ours: statistics.geometric_mean(r[f"speedup_cpu_time/{ours}"] for r in records)
        for _, ours in pairs
    }
    summary = " ".join(
        f"speedup_geomean/{k}={v:.2f} speedup_cpu_time_geomean/{k}={cpu_means[k]:.2f}"
        for k, v in geo_means.items()
    )
    console.print(f"[summary] {summary}", markup=False, soft_wrap=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "facts": facts,
        "records": records,
        "speedup_geomean": geo_means,
        "speedup_cpu_time_geomean": cpu_means,
    }
    (out_dir / "yatt_rollout.json").write_text(json.dumps(payload, indent=2) + "\n")
    _plot(records, pairs, facts, out_dir / "yatt_rollout.png")
    markdown = _markdown(records, pairs, facts, geo_means, cpu_means)
    (out_dir / "yatt_rollout.md").write_text(markdown)
    console.print(f"wrote {out_dir}/yatt_rollout.{{json,md,png}}")


def _columns(pairs: list[tuple[str, str]]) -> list[str]:
    columns = []
    for hf, ours in pairs:
        columns += [hf, ours, "speedup", "cpu-time speedup"]
    return columns


def _cells(record: dict, pairs: list[tuple[str, str]]) -> list[str]:
    mode = record["mode"]
    if record.get("identical/yatt") is False:  # fp32 greedy must match HF exactly
        mode += " (DIFFERS)"
    cells = [str(record["batch"]), str(record["new_tokens"]), mode]
    for hf, ours in pairs:
        cells += [
            f"{record[f'{hf}/tokens_per_s']:.1f}",
            f"{record[f'{ours}/tokens_per_s']:.1f}",
            f"{record[f'speedup/{ours}']:.2f}x",
            f"{record[f'speedup_cpu_time/{ours}']:.2f}x",
        ]
    return cells


def _markdown(records: list[dict], pairs, facts: dict, geo_means: dict, cpu_means: dict) -> str:
    lines = [
        "## Rollout engine: yatt vs HF generate",
        "",
        f"Model {facts['model']} on {facts['device']} ({facts['cuda'] or facts['processor']}, "
        f"{facts['cpus']} cores, {facts['torch_threads']} torch threads), torch "
        f"{facts['torch']}, transformers {facts['transformers']}, commit {facts['git_commit']}, "
        f"{facts['time_utc']}. Produced by `python yatt/bench/rollout.py`.",
        "",
        "How measured: the two-digit addition prompt in the chat template (~45 tokens), in "
        f"groups of {facts['group_size']} identical prompts as a GRPO step samples them; every "
        "engine gets the same prompts, batch size and token limit, greedy and sampled "
        "(temperature 1, one seed per request), taking turns going first; median of "
        f"{facts['repeats']} runs after one untimed run of each engine at the cell's shape. "
        "Tokens are those each engine produced up to EOS or the limit "
        "(fp32 greedy outputs are checked identical; in bf16 rounding differs between the two, "
        "since HF's bf16 copy also rounds the rotary buffers). HF `generate` keeps finished "
        "rows in the batch; yatt drops them and prefills identical prompts and the prefix they all "
        "share (the chat template's system prompt) once, and runs its own fused Llama forward "
        "(Q|K|V and gate|up as one matmul each, keys/values written in place into one "
        "preallocated cache, grouped-query attention without repeating keys); on CPU its "
        "matmuls run on oneDNN copies of the weights reordered once per weight update "
        "(prepacked) instead of `F.linear`. `*-bf16`: HF on "
        "a bf16 copy of the model, yatt with bf16 compute on fused bf16 copies of the shared "
        "fp32 weights (refreshed when the weights change).",
        "",
        "Columns give generated tokens/s (wall clock); speedup is yatt over HF in the same "
        "dtype, by wall clock and by the process's CPU time (tokens per CPU-second), which "
        "other load on a shared machine disturbs less.",
        "",
        "| batch | new tokens | mode | " + " | ".join(_columns(pairs)) + " |",
        "|---:|---:|:---|" + "---:|" * (4 * len(pairs)),
    ]
    lines += ["| " + " | ".join(_cells(r, pairs)) + " |" for r in records]
    means = ", ".join(f"{ours} **{value:.2f}x**" for ours, value in geo_means.items())
    cpu = ", ".join(f"{ours} {value:.2f}x" for ours, value in cpu_means.items())
    lines += [
        "",
        f"Geometric-mean speedup over HF in the same dtype: {means} (wall clock); by process "
        f"CPU time, which a busy machine disturbs less: {cpu}.",
    ]
    if len(pairs) > 1:
        vs_fp32 = statistics.geometric_mean(
            r["yatt-bf16/tokens_per_s"] / r["hf/tokens_per_s"] for r in records
        )
        vs_fp32_cpu = statistics.geometric_mean(
            r["yatt-bf16/tokens_per_cpu_s"] / r["hf/tokens_per_cpu_s"] for r in records
        )
        lines.append(
            f"yatt-bf16 against HF in fp32 (the model's own dtype): {vs_fp32:.2f}x wall clock, "
            f"{vs_fp32_cpu:.2f}x by CPU time."
        )
    refresh = ", ".join(f"{k} {v:.2f} s" for k, v in facts.get("refresh_cpu_s", {}).items())
    if refresh:
        lines.append(
            f"Not in the timings: rebuilding yatt's fused and prepacked weights after a weight "
            f"update costs {refresh} of CPU time; an RL loop pays it once per optimizer step."
        )
    lines += ["", "![](yatt_rollout.png)", ""]
    return "\n".join(lines)


def _plot(records: list[dict], pairs, facts: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for pair in pairs for name in pair]
    labels = [f"B{r['batch']} N{r['new_tokens']}\n{r['mode']}" for r in records]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(7, len(records) * 1.1), 4.5))
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(records))]
        ax.bar(xs, [r[f"{name}/tokens_per_s"] for r in records], width, label=name)
    ax.set_xticks(range(len(records)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("generated tokens / s (log)")
    ax.set_title(f"Rollout throughput, {facts['model']} on {facts['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _out_dir(args) -> Path:
    if args.out_dir:
        return Path(args.out_dir)
    if args.quick:
        return Path(tempfile.gettempdir()) / "yatt_rollout_quick"
    return REPO / "docs" / "bench"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive ints, got {text!r}")
    return values


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, small grid, temp dir")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batch-sizes", type=_int_list, default=None)
    parser.add_argument("--new-tokens", type=_int_list, default=None)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--no-bf16", dest="bf16", action="store_false", help="skip the bf16 engine pair"
    )
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.batch_sizes = args.batch_sizes or ([1, 8] if args.quick else [1, 8, 32])
    args.new_tokens = args.new_tokens or ([16] if args.quick else [16, 64])
    if args.group_size < 1:
        parser.error(f"--group-size must be >= 1, got {args.group_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda given but no CUDA device is available")
    return args


if __name__ == "__main__":
    sys.exit(main())
