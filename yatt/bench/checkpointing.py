"""Gradient checkpointing (`train.gradient_checkpointing`) against the plain update: the memory
an update needs beyond the resident model and optimizer, and its time, by response length.

    .venv/bin/python yatt/bench/checkpointing.py                       # 128 and 512 tokens
    .venv/bin/python yatt/bench/checkpointing.py --model tiny --tokens 16,32 --updates 1  # smoke

Each (length, setting) runs in its own process: SmolLM2-135M-Instruct in fp32, the policy's
real update (`PolicyRole.update`: forward, GRPO loss, backward, AdamW step) on a synthetic
batch of one micro-batch (`RolloutBatch.synthetic`: one prompt sampled `--rows` times, a GRPO
group, every row trains, every response as long as the budget). One untimed update first
allocates the optimizer state; then the memory it freed goes back to the system
(`malloc_trim`) and the process's peak resident memory is reset (`/proc/self/clear_refs`); the
timed updates' peak over the memory resident then (model, AdamW's moments, gradients) is the
update's working memory (activations, logits, gradients' temporaries). The plain update shares
the group's prompt pass across its rows (`train.shared_prefix`, the default); a checkpointed
one runs whole rows. Writes docs/bench/yatt_checkpointing.{json,md,png}.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "docs" / "bench"
PROMPT = "What is 4821 + 377? Think step by step, then give the answer after 'Answer:'."


def _status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _child(model_path: str, tokens: int, checkpointing: bool, rows: int, updates: int) -> dict:
    """One (length, setting) in this process: the timed updates' seconds and working memory."""
    import torch

    from yatt.batch import RolloutBatch
    from yatt.builders import build_model
    from yatt.config import AlgoConfig, ModelConfig, OptimConfig
    from yatt.roles.policy import PolicyRole

    model, tokenizer = build_model(ModelConfig(path=model_path))
    policy = PolicyRole(
        model, algo=AlgoConfig(micro_batch_size=rows), optim=OptimConfig(lr=1e-6),
        total_updates=updates + 1, norm_len=tokens, gradient_checkpointing=checkpointing,
    )  # fmt: skip
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    vocab = model.get_input_embeddings().num_embeddings
    batch = RolloutBatch.synthetic(prompt, rows, tokens, vocab, group=rows)  # one GRPO group
    policy.update(batch)  # allocates AdamW's moments
    # What the warm-up freed goes back to the system (glibc keeps it otherwise, and it would
    # count as resident), then the peak resident set starts again from the live memory.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    resident_mb = _status_mb("VmRSS")
    seconds, norms = [], []
    for _ in range(updates):
        start_s = time.perf_counter()
        metrics = policy.update(batch)
        seconds.append(time.perf_counter() - start_s)
        norms.append(metrics["actor/grad_norm"])
    peak_mb = _status_mb("VmHWM")
    return {
        "tokens": tokens,
        "checkpointing": checkpointing,
        "rows": rows,
        "prompt_tokens": len(prompt),
        "update_s": statistics.median(seconds),
        "update_s_all": seconds,
        "resident_mb": resident_mb,
        "peak_mb": peak_mb,
        "working_mb": peak_mb - resident_mb,
        "grad_norms": norms,
        "threads": torch.get_num_threads(),
    }


def _pairs(results: list[dict]) -> list[tuple[dict, dict]]:
    """(plain, checkpointed) per response length, in the order measured."""
    by = {(r["tokens"], r["checkpointing"]): r for r in results}
    lengths = dict.fromkeys(r["tokens"] for r in results)
    return [(by[t, False], by[t, True]) for t in lengths if (t, False) in by and (t, True) in by]


def _markdown(results: list[dict], host: dict, run: dict) -> str:
    lines = [
        "## yatt: gradient checkpointing (`train.gradient_checkpointing`)",
        "",
        f"The policy's update on `{run['model']}` (fp32), one micro-batch of {run['rows']} rows "
        f"({results[0]['prompt_tokens']}-token prompt), every response as long as the budget, "
        f"{run['updates']} timed update(s) per setting after an untimed one, each setting in its "
        f"own process with {results[0]['threads']} torch threads: `{run['command']}`. Working "
        "memory is the peak resident set of the timed updates over the memory resident before "
        "them (model, AdamW's moments, gradients; what the untimed update freed was handed "
        "back to the system first): what activations, logits and the backward pass add. The "
        "plain update shares each prompt's pass across its rows; a checkpointed one keeps only "
        "each decoder layer's input and runs whole rows. Host: "
        f"{host['cpus']} CPUs ({host['processor']}), torch {host['torch']}, transformers "
        f"{host['transformers']}, commit {host['git_commit']}, 1-min load average at the end "
        f"{host['load_avg_1m']:.1f}.",
        "",
        "| response tokens | checkpointing | update s (median) | resident MiB | peak MiB "
        "| working MiB | grad norm (first timed update) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['tokens']} | {'on' if r['checkpointing'] else 'off'} | {r['update_s']:.2f} "
            f"| {r['resident_mb']:,.0f} | {r['peak_mb']:,.0f} | {r['working_mb']:,.0f} "
            f"| {r['grad_norms'][0]:.6g} |"
        )
    lines.append("")
    for plain, checked in _pairs(results):
        memory = (
            f"{checked['working_mb'] / plain['working_mb']:.2f}x"
            if plain["working_mb"] > 0
            else "(the plain update's rose above none: no ratio)"
        )
        lines.append(
            f"- {plain['tokens']} response tokens: checkpointing needs {memory} the plain "
            f"update's working memory ({plain['working_mb']:,.0f} -> "
            f"{checked['working_mb']:,.0f} MiB) and "
            f"{checked['update_s'] / plain['update_s']:.2f}x its time."
        )
    lines += ["", "![gradient checkpointing](yatt_checkpointing.png)", ""]
    return "\n".join(lines)


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = _pairs(results)
    labels = [str(plain["tokens"]) for plain, _ in pairs]
    x = range(len(pairs))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for offset, index, name in ((-0.2, 0, "off"), (0.2, 1, "on")):
        left.bar([i + offset for i in x], [p[index]["working_mb"] for p in pairs], width=0.4,
                 label=f"checkpointing {name}")  # fmt: skip
        right.bar([i + offset for i in x], [p[index]["update_s"] for p in pairs], width=0.4,
                  label=f"checkpointing {name}")  # fmt: skip
    left.set(xticks=list(x), xticklabels=labels, xlabel="response tokens", ylabel="MiB",
             title="update's working memory")  # fmt: skip
    right.set(xticks=list(x), xticklabels=labels, xlabel="response tokens",
              ylabel="seconds (median)", title="update time")  # fmt: skip
    left.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected lengths like 128,512, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be >= 1, got {text!r}")
    return lengths


def _run_child(args: argparse.Namespace, tokens: int, checkpointing: bool) -> dict | None:
    """One setting in a fresh process (its own peak memory); None, with its error shown, where
    it failed."""
    command = [sys.executable, __file__, "--child", "--model", args.model, "--tokens",
               str(tokens), "--rows", str(args.rows), "--updates", str(args.updates),
               *(["--checkpointing"] if checkpointing else [])]  # fmt: skip
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        print(done.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(line.removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="model.path (tiny: smoke run)")
    parser.add_argument("--tokens", type=_lengths, default=[128, 512], help="response lengths")
    parser.add_argument("--rows", type=int, default=4, help="rows of the micro-batch")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per setting")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all CPUs)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.updates < 1:
        parser.error(f"--rows and --updates must be >= 1, got {args.rows}, {args.updates}")
    if args.child:
        [tokens] = args.tokens
        result = _child(args.model, tokens, args.checkpointing, args.rows, args.updates)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    from rich.progress import track

    from yatt.common.hostfacts import host_facts

    settings = [(tokens, on) for tokens in args.tokens for on in (False, True)]
    results = []
    for tokens, on in track(settings, description="checkpointing bench"):
        result = _run_child(args, tokens, on)
        if result is None:
            print(f"checkpointing bench: {tokens} tokens, checkpointing {on} failed",
                  file=sys.stderr)  # fmt: skip
            return 1
        results.append(result)
        print(f"[summary] tokens={tokens} checkpointing={on} update_s={result['update_s']:.2f} "
              f"working_mb={result['working_mb']:.0f} peak_mb={result['peak_mb']:.0f}",
              flush=True)  # fmt: skip
    model = "SmolLM2-135M-Instruct" if args.model == "smollm2" else args.model
    given = sys.argv[1:] if argv is None else argv
    run = {"command": " ".join(["python yatt/bench/checkpointing.py", *given]), "model": model,
           "rows": args.rows, "updates": args.updates, "threads": args.threads}  # fmt: skip
    host = host_facts()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    document = {"host": host, "run": run, "results": results}
    (args.out_dir / "yatt_checkpointing.json").write_text(json.dumps(document, indent=2) + "\n")
    markdown = _markdown(results, host, run)
    (args.out_dir / "yatt_checkpointing.md").write_text(markdown)
    _plot(results, args.out_dir / "yatt_checkpointing.png")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
