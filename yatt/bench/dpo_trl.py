"""yatt dpo vs TRL's DPOTrainer, side by side: the same pairs, model, settings and held-out
problems, one run after the other on the same machine.

    .venv/bin/python yatt/bench/dpo_trl.py --tiny --steps 3     # smoke run, random-init model
    .venv/bin/python yatt/bench/dpo_trl.py                      # SmolLM2-135M-Instruct

First the pairs, made once by yatt (`yatt.pairs.sampled_responses`, what `data.rejected=samples`
does): for each two-digit addition prompt the model samples 4 completions at temperature 1,
math_answer scores them, and the pair is the worst completion under the best one or under the
answer. They go to one JSONL file (prompt, chosen, rejected, answer), which both runs read:
`yatt dpo` from `data.path`, TRL's DPOTrainer as a dataset of the same rows, in the order
yatt's sampler draws them. Each run is its own subprocess. Both compute the reference
log-probs once before training (TRL `precompute_ref_log_probs=True`), so neither holds a second
model. Held-out accuracy (greedy, yatt's evaluator, the same problems) is measured before and
after and timed apart. Writes docs/bench/yatt_dpo_trl.{json,md,png}; FAIRNESS lists what the
two runs share.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trl_compare  # yatt/bench/trl_compare.py, next to this script
import trl_report

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

logger = logging.getLogger(__name__)

OUT_DIR = Path(__file__).resolve().parents[2] / "docs" / "bench"
NAME = "yatt_dpo_trl"
RUNS = ("yatt", "trl")
FAIRNESS = {
    "model": "the same weights (SmolLM2-135M-Instruct prepared by yatt, or the same tiny "
    "random-init Llama with --tiny), trained in fp32, no autocast, gradient checkpointing off",
    "pairs": "one JSONL file both read: the prompt's worst sampled completion (4 at temperature "
    "1, scored by math_answer) under its best one or under the answer; the same held-out split "
    "(yatt's, by data.seed); TRL gets each prompt with the chat template applied, as yatt renders "
    "it, and appends EOS to both responses, as yatt does",
    "order": "the same pairs in the same order: yatt's PromptSampler (data.seed + train.seed); "
    "TRL reads the rows in that order, unshuffled",
    "loss": "sigmoid DPO, beta as given, sequence log-probs summed over the response and its EOS; "
    "the reference is the model before training, its log-probs computed once before the first "
    "step by both (TRL precompute_ref_log_probs=True)",
    "optimiser": "torch's fused AdamW in both (yatt's fused=True, TRL optim='adamw_torch_fused'), "
    "betas (0.9, 0.999), eps 1e-8, weight decay 0, the learning rate linear to 0 over the "
    "steps, no warm-up, grad-norm clip 1.0; one optimiser step per batch of pairs",
    "threads": "the same torch intra-op thread count in both subprocesses",
    "timing": "step times from each framework's own step boundaries; the reference pass is "
    "timed on its own (TRL: its _precompute_ref_logps, which the trainer runs when built); "
    "held-out evaluation is timed apart and counts in neither",
}


@dataclass(frozen=True)
class Settings:
    model: str = "smollm2"
    steps: int = 60
    batch_pairs: int = 8
    beta: float = 0.1
    lr: float = 5e-6
    prompts: int = 500  # prompts sampled for pairs (held out ones included)
    heldout: int = 200
    threads: int = 2
    seed: int = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=Settings.steps)
    parser.add_argument("--tiny", action="store_true", help="tiny random-init model (smoke run)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--report-only", type=Path, help="rebuild md/png from this JSON")
    parser.add_argument("--worker", choices=RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.threads < 1:
        parser.error("--steps and --threads must be >= 1")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    if args.tiny:
        return Settings(model="tiny", steps=args.steps, prompts=48, heldout=16,
                        threads=args.threads)  # fmt: skip
    return Settings(steps=args.steps, threads=args.threads)


# ---------------------------------------------------------------- the pairs (parent)


def make_pairs(settings: Settings, path: Path) -> dict[str, Any]:
    """Sample the pairs once and write them to `path`; returns what sampling measured."""
    import torch

    from yatt.builders import build_data, build_model
    from yatt.config import load_config
    from yatt.pairs import sampled_responses

    torch.set_num_threads(settings.threads)
    config = load_config("dpo_addition", [
        f"model.path={settings.model}", f"data.n_train={settings.prompts}", "data.n_heldout=0",
        f"data.seed={settings.seed}", "rollout.n_samples=4", "rollout.temperature=1.0",
    ])  # fmt: skip
    examples, _ = build_data(config.data)
    model, tokenizer = build_model(config.model)
    start_s = time.perf_counter()
    pairs, best = sampled_responses(model, tokenizer, examples, config)
    rows = [{"prompt": example.prompt, "chosen": pair[0], "rejected": pair[1],
             "answer": example.answer}
            for example, pair in zip(examples, pairs, strict=True) if pair]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    sampling_s = time.perf_counter() - start_s
    return {"prompts": len(examples), "pairs": len(rows), "sampling_s": sampling_s,
            "samples_best": best / (4 * len(examples))}  # fmt: skip


def _split(settings: Settings, path: Path) -> tuple[list[Any], list[Any]]:
    """The file's training and held-out rows, split as `yatt dpo` splits them."""
    from yatt.builders import build_data
    from yatt.config import DataConfig

    return build_data(DataConfig(path=str(path), n_heldout=settings.heldout, seed=settings.seed))


# ---------------------------------------------------------------- yatt worker


def yatt_overrides(settings: Settings, pairs: Path, run_dir: Path) -> list[str]:
    """`yatt dpo` overrides on the dpo_addition preset that give the shared shape."""
    return [
        f"model.path={settings.model}", "model.dtype=float32", f"data.path={pairs}",
        "data.rejected=slips", f"data.n_heldout={settings.heldout}", f"data.seed={settings.seed}",
        f"algo.micro_batch_size={settings.batch_pairs}", f"algo.dpo_beta={settings.beta}",
        "algo.dpo_loss=sigmoid", "algo.dpo_label_smoothing=0", "algo.dpo_sft_weight=0",
        f"optim.lr={settings.lr}", "optim.schedule=linear", "optim.warmup_steps=0",
        "optim.weight_decay=0.0", "optim.beta1=0.9", "optim.beta2=0.999", "optim.eps=1e-8",
        "optim.grad_clip=1.0", f"train.steps={settings.steps}", f"train.seed={settings.seed}",
        f"train.torch_threads={settings.threads}", f"eval.n={settings.heldout}",
        f"logging.run_dir={run_dir}", "logging.progress=false", "logging.plots=false",
    ]  # fmt: skip


def run_yatt(settings: Settings, pairs: Path) -> dict[str, Any]:
    from yatt.config import load_config
    from yatt.dpo import run_dpo

    run_dir = Path(tempfile.mkdtemp(prefix="yatt_dpo_trl_")) / "run"
    config = load_config("dpo_addition", yatt_overrides(settings, pairs, run_dir))
    run_dpo(config)
    rows = [json.loads(line) for line in (run_dir / "dpo_metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "dpo/loss" in row]
    evals = [row for row in rows if "eval/accuracy" in row]
    return {
        "run": "yatt", "version": trl_report.version("yatt"),
        "reference_s": rows[0]["timing_s/reference"],
        "step_s": [row["timing_s/step"] for row in steps],
        "loss": [row["dpo/loss"] for row in steps],
        "accuracy_before": evals[0]["eval/accuracy"], "accuracy_after": evals[-1]["eval/accuracy"],
        "heldout_pairs_right": steps[-1].get("dpo/heldout_accuracy"),
        "pairs": int(rows[0]["dpo/pairs"]),
    }  # fmt: skip


# ---------------------------------------------------------------- TRL worker


def run_trl(settings: Settings, pairs: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from yatt.config import load_config
    from yatt.data import render_prompt
    from yatt.dpo import pair_sampler

    torch.manual_seed(settings.seed)
    train, heldout = _split(settings, pairs)
    config = load_config("dpo_addition", yatt_overrides(settings, pairs, Path("unused")))
    order = pair_sampler(config, len(train)).take(settings.steps * settings.batch_pairs)
    model, tokenizer = trl_compare._load_model(_compare_settings(settings))
    rows = [{"prompt": render_prompt(train[i], tokenizer, True),
             "chosen": train[i].fields["chosen"], "rejected": train[i].fields["rejected"]}
            for i in order]  # fmt: skip
    token_mismatches = _token_mismatches(tokenizer, rows)
    accuracy_before = _accuracy(model, tokenizer, heldout)
    step_s: list[float] = []
    losses: list[float] = []

    class _Recorder(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start_s = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_s.append(time.perf_counter() - self.start_s)
            logger.warning("trl step %d/%d: %.2f s", len(step_s), settings.steps, step_s[-1])

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    reference_s: list[float] = []

    class _InOrder(DPOTrainer):
        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            return SequentialSampler(self.train_dataset)

        def _precompute_ref_logps(self, *args: Any, **kwargs: Any) -> Any:  # (in __init__)
            return trl_compare._timed(super()._precompute_ref_logps, reference_s)(*args, **kwargs)

    torch.set_num_threads(settings.threads)
    trainer = _InOrder(
        model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
        args=DPOConfig(**_trl_kwargs(settings, tempfile.mkdtemp(prefix="trl_dpo_"))),
        callbacks=[_Recorder()],
    )  # fmt: skip
    torch.set_num_threads(settings.threads)
    trainer.train()
    return {
        "run": "trl", "version": trl_report.version("trl"),
        "reference_s": sum(reference_s), "step_s": step_s, "loss": losses,
        "accuracy_before": accuracy_before,
        "accuracy_after": _accuracy(model, tokenizer, heldout), "pairs": len(rows),
        "token_mismatches": token_mismatches,
    }  # fmt: skip


def _trl_kwargs(settings: Settings, output_dir: str) -> dict[str, Any]:
    return {
        "output_dir": output_dir, "per_device_train_batch_size": settings.batch_pairs,
        "gradient_accumulation_steps": 1, "max_steps": settings.steps, "beta": settings.beta,
        "loss_type": ["sigmoid"], "precompute_ref_log_probs": True,
        "precompute_ref_batch_size": settings.batch_pairs, "learning_rate": settings.lr,
        "lr_scheduler_type": "linear", "warmup_steps": 0, "weight_decay": 0.0,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
        "optim": "adamw_torch_fused", "seed": settings.seed, "gradient_checkpointing": False,
        "bf16": False, "fp16": False, "use_cpu": True, "logging_steps": 1,
        "save_strategy": "no", "report_to": [], "disable_tqdm": True,
        "dataloader_num_workers": 0, "dataloader_pin_memory": False,
    }  # fmt: skip


def _compare_settings(settings: Settings) -> Any:
    return trl_compare.BenchSettings(model=settings.model, threads=settings.threads)


def _accuracy(model: Any, tokenizer: Any, heldout: list[Any]) -> float:
    return trl_compare.heldout_accuracy(model, tokenizer, heldout, batch_size=64)


def _token_mismatches(tokenizer: Any, rows: list[dict[str, str]]) -> int:
    """How many of the responses TRL trains on (chosen and rejected of every row) it tokenises
    otherwise than yatt: TRL tokenises prompt, response and EOS text together, yatt the prompt
    and the response apart and appends the EOS id."""
    mismatches = 0
    for row in rows:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        for key in ("chosen", "rejected"):
            trl_ids = tokenizer(row["prompt"] + row[key] + tokenizer.eos_token,
                                add_special_tokens=False)["input_ids"]  # fmt: skip
            response = tokenizer(row[key], add_special_tokens=False)["input_ids"]
            mismatches += trl_ids != [*prompt, *response, tokenizer.eos_token_id]
    return mismatches


# ---------------------------------------------------------------- report


def write_report(out_dir: Path, payload: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.json").write_text(json.dumps(payload, indent=2))
    (out_dir / f"{NAME}.md").write_text(markdown(payload))
    _plot(payload, out_dir / f"{NAME}.png")
    print(markdown(payload))


def _summary(run: dict[str, Any]) -> dict[str, float]:
    steps = run["step_s"]
    return {"median": statistics.median(steps), "mean": statistics.fmean(steps),
            "total": run["reference_s"] + sum(steps)}  # fmt: skip


def markdown(payload: dict[str, Any]) -> str:
    runs, settings, made = payload["runs"], payload["settings"], payload["pairs"]
    yatt, trl = _summary(runs["yatt"]), _summary(runs["trl"])
    model = "SmolLM2-135M-Instruct" if settings["model"] == "smollm2" else "A tiny Llama"
    lines = [
        "## yatt dpo vs TRL: DPO side by side (`yatt/bench/dpo_trl.py`)",
        "",
        f"{model}, {made['pairs']} pairs from {made['prompts']} two-digit addition prompts "
        f"({100 * made['samples_best']:.1f}% of the samples scored as high as the answer), "
        f"{settings['heldout']} held out; {settings['steps']} steps of {settings['batch_pairs']} "
        f"pairs, beta {settings['beta']}, lr {settings['lr']}, {settings['threads']} torch "
        f"threads, one run after the other. Step time: yatt dpo **"
        f"{trl['median'] / yatt['median']:.2f}x** faster than TRL (median); reference pass plus "
        f"steps: {trl['total'] / yatt['total']:.2f}x.",
        "",
        "| | yatt dpo | TRL DPOTrainer |",
        "|---|---:|---:|",
        f"| version | {runs['yatt']['version']} | {runs['trl']['version']} |",
        f"| reference log-probs, s | {runs['yatt']['reference_s']:.1f} | "
        f"{runs['trl']['reference_s']:.1f} |",
        f"| step s (median) | {yatt['median']:.2f} | {trl['median']:.2f} |",
        f"| step s (mean) | {yatt['mean']:.2f} | {trl['mean']:.2f} |",
        f"| reference + steps, s | {yatt['total']:.1f} | {trl['total']:.1f} |",
        f"| loss, first step | {runs['yatt']['loss'][0]:.4f} | {runs['trl']['loss'][0]:.4f} |",
        f"| loss, last 10 steps (mean) | {statistics.fmean(runs['yatt']['loss'][-10:]):.4f} | "
        f"{statistics.fmean(runs['trl']['loss'][-10:]):.4f} |",
        f"| held-out accuracy before | {100 * runs['yatt']['accuracy_before']:.1f}% | "
        f"{100 * runs['trl']['accuracy_before']:.1f}% |",
        f"| held-out accuracy after | {100 * runs['yatt']['accuracy_after']:.1f}% | "
        f"{100 * runs['trl']['accuracy_after']:.1f}% |",
        "",
        f"yatt's reference pass also covers the {settings['heldout']} held-out pairs (it ranks "
        f"them at the end: {_share(runs['yatt'].get('heldout_pairs_right'))} right), TRL's the "
        f"{runs['trl']['pairs']} pairs of its steps alone. "
        f"Sampling the pairs took {made['sampling_s']:.0f} s (once, for both). Responses TRL "
        f"tokenised otherwise than yatt: {_mismatches(runs['trl'])}. yatt runs "
        "each pair's prompt once for its two responses (the KV cache of the prompt shared), and "
        "the start all of a step's prompts share (the chat template's system turn) once a step; "
        "TRL runs the chosen and the rejected rows whole.",
        "",
        "Fairness settings:",
        "",
        *[f"- **{key}**: {value}" for key, value in payload["fairness"].items()],
        "",
        _host_line(payload["host"]),
        "",
        f"![DPO loss and step time, yatt and TRL]({NAME}.png)",
        "",
    ]
    return "\n".join(lines)


def _mismatches(run: dict[str, Any]) -> str:
    return f"{run['token_mismatches']} of {2 * run['pairs']}"


def _share(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


def _host_line(host: dict[str, Any]) -> str:
    return (
        f"Machine: {host['cpus']} CPUs ({host['processor']}), python {host['python']}, torch "
        f"{host['torch']}, transformers {host['transformers']}, trl {host['trl']}, commit "
        f"{host['git_commit']}; 1-min load average at the end {host['load_avg_1m']:.1f}."
    )


def _plot(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_step) = plt.subplots(1, 2, figsize=(11, 4))
    for run, label in (("yatt", "yatt dpo"), ("trl", "TRL DPOTrainer")):
        data = payload["runs"][run]
        ax_loss.plot(range(1, len(data["loss"]) + 1), data["loss"], label=label)
        ax_step.plot(range(1, len(data["step_s"]) + 1), data["step_s"], label=label)
    ax_loss.set(xlabel="step", ylabel="DPO loss", title="loss (same pairs, same order)")
    ax_step.set(xlabel="step", ylabel="seconds", title="step time")
    for ax in (ax_loss, ax_step):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------- entry points


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.report_only:
        write_report(args.out_dir, json.loads(args.report_only.read_text()))
        return 0
    settings = settings_from(args)
    if args.worker:
        import torch

        torch.set_num_threads(settings.threads)
        work = run_yatt if args.worker == "yatt" else run_trl
        args.result.write_text(json.dumps(work(settings, args.pairs)))
        return 0
    trl_compare.ensure_trl()
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads),
           "MKL_NUM_THREADS": str(settings.threads), "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dpo_trl_") as scratch:
        pairs = Path(scratch) / "pairs.jsonl"
        made = make_pairs(settings, pairs)
        logger.warning("pairs: %s", made)
        runs = {}
        for run in RUNS:
            result = Path(scratch) / f"{run}.json"
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", run,
                       "--pairs", str(pairs), "--result", str(result),
                       "--steps", str(args.steps), "--threads", str(args.threads),
                       *(["--tiny"] if args.tiny else [])]  # fmt: skip
            subprocess.run(command, env=env, check=True)
            runs[run] = json.loads(result.read_text())
    from yatt.common.hostfacts import host_facts

    payload = {"settings": asdict(settings), "pairs": made, "runs": runs, "fairness": FAIRNESS,
               "host": host_facts() | {"trl": trl_report.version("trl")}}  # fmt: skip
    write_report(args.out_dir, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
