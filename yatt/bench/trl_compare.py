"""yatt vs TRL, side by side: the same GRPO run on the same machine, one after the other.

    .venv/bin/python yatt/bench/trl_compare.py --tiny --steps 3     # smoke run, random-init model
    .venv/bin/python yatt/bench/trl_compare.py --steps 30           # SmolLM2-135M-Instruct

Installs `trl` (pinned, with torch held at its installed version) when it is absent, then runs
three GRPO runs, each in its own subprocess: yatt with fp32 rollouts, yatt with bf16 rollouts
(fp32 training), and TRL's GRPOTrainer, on the same model, prompts (in the same order), reward,
group size, lengths, optimiser, schedule, threads and number of steps. Every model is scored by
yatt's greedy fp32 held-out evaluator on the same 200 problems every --eval-every steps
(accuracy curves). Writes docs/bench/yatt_trl.{json,md,png}. The settings that make the
comparison fair are in FAIRNESS.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trl_report  # yatt/bench/trl_report.py, next to this script

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "docs" / "bench"
TRL_VERSION = "1.16.0"
# One subprocess per run, in this order; the yatt runs differ only in the sampler's dtype.
RUNS = ("yatt", "yatt_bf16", "trl")
ROLLOUT_DTYPES = {"yatt": "float32", "yatt_bf16": "bfloat16"}
FAIRNESS = {
    "model": "same weights: SmolLM2-135M-Instruct from yatt.models.prepare_model (or the same "
    "tiny random-init Llama with --tiny), trained in fp32 by all three runs, no bf16 autocast, "
    "gradient checkpointing off",
    "rollout dtype": "yatt fp32 and TRL sample in fp32. 'yatt bf16 rollouts' samples with bf16 "
    "copies of the fp32 weights (rebuilt after every update) and corrects the sampler/trainer "
    "mismatch with a truncated importance weight min(p_fp32 / p_bf16, 2) per token on the loss "
    "(rollout.dtype=bfloat16, algo.tis_cap=2); everything else equals the fp32 yatt run",
    "prompts": "yatt generate_task('addition') split into 5000 train / 200 held-out; both see the "
    "same train prompts in the same order (yatt's PromptSampler order, TRL shuffle_dataset=False), "
    "rendered by the tokenizer chat template with the generation prompt",
    "reward": "1.0 if the last integer of the completion equals a + b, else 0.0 (yatt math_answer "
    "for both; TRL gets it as a reward function)",
    "group": "2 prompts x 4 completions per step, one optimiser step per generation batch "
    "(TRL num_iterations=1, gradient_accumulation_steps=1)",
    "sampling": "16 new tokens max, temperature 1, top_p 1, top_k off",
    "loss": "clipped policy gradient, epsilon 0.2, token-mean aggregation (TRL loss_type='dapo', "
    "yatt loss_agg=token_mean), group-std-normalised advantages, no KL (TRL beta=0, yatt "
    "kl_coef=0); yatt skips the forward/backward of rows whose advantage is exactly 0 (their "
    "gradient is exactly 0) but still takes the AdamW step every step, as TRL does",
    "optimiser": "AdamW lr 5e-6, betas (0.9, 0.999), eps 1e-8, weight decay 0, linear decay to 0 "
    "over --steps, no warm-up, grad-norm clip 1.0",
    "threads": "the same torch intra-op thread count in both subprocesses (--threads)",
    "eval": "greedy, 16 new tokens, 200 held-out problems, yatt's evaluate_engine on both "
    "in-memory models at step 0 and every --eval-every steps, timed apart from the steps (TRL's "
    "final model is also saved, reloaded and scored again as a check); step 0 is the shared "
    "initial model",
    "isolation": "each run has its own subprocess, one after the other",
}


@dataclass(frozen=True)
class BenchSettings:
    """The shared run shape; every run is configured from this one object."""

    model: str = "smollm2"
    steps: int = 30
    threads: int = 2
    seed: int = 0
    prompts_per_step: int = 2
    n_samples: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0
    lr: float = 5e-6
    n_train: int = 5000
    n_heldout: int = 200
    eval_batch_size: int = 64
    eval_every: int = 10  # held-out accuracy every this many steps (and at the start and end)

    def __post_init__(self) -> None:
        if self.model not in ("smollm2", "tiny"):
            raise ValueError(f"model must be 'smollm2' or 'tiny', got {self.model!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")

    def evaluates_after(self, step: int) -> bool:
        """True when the held-out accuracy is measured after training step `step` (1-based)."""
        return step % self.eval_every == 0 or step == self.steps

    @property
    def batch_completions(self) -> int:
        return self.prompts_per_step * self.n_samples


# ---------------------------------------------------------------- config building (no torch)


def yatt_overrides(
    settings: BenchSettings, run_dir: str, rollout_dtype: str = "float32"
) -> list[str]:
    """Dotted overrides on the `grpo_addition` preset that give the shared shape."""
    return [
        f"rollout.dtype={rollout_dtype}", "algo.tis_cap=2.0",
        f"model.path={settings.model}", "model.dtype=float32",
        f"data.n_train={settings.n_train}", f"data.n_heldout={settings.n_heldout}",
        f"data.seed={settings.seed}", "data.use_chat_template=true",
        "algo.name=grpo", f"algo.prompts_per_step={settings.prompts_per_step}",
        "algo.kl_coef=0.0", "algo.ppo_passes=1", "algo.loss_agg=token_mean",
        "algo.clip_low=0.2", "algo.clip_high=0.2", "algo.norm_std=true",
        f"rollout.n_samples={settings.n_samples}",
        f"rollout.max_new_tokens={settings.max_new_tokens}",
        f"rollout.temperature={settings.temperature}", "rollout.top_p=1.0", "rollout.top_k=0",
        f"optim.lr={settings.lr}", "optim.schedule=linear", "optim.warmup_steps=0",
        "optim.weight_decay=0.0", "optim.grad_clip=1.0",
        f"train.steps={settings.steps}", f"train.seed={settings.seed}",
        f"train.torch_threads={settings.threads}", "train.bf16_autocast=false",
        "eval.n=0", f"logging.run_dir={run_dir}", "logging.overwrite=true",
        "logging.progress=false", "logging.plots=false",
    ]  # fmt: skip


def trl_config_kwargs(settings: BenchSettings, output_dir: str) -> dict[str, Any]:
    """Keyword arguments for trl.GRPOConfig that give the shared shape."""
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": settings.batch_completions,  # completions, not prompts
        "num_generations": settings.n_samples,
        "gradient_accumulation_steps": 1,
        "num_iterations": 1,
        "max_completion_length": settings.max_new_tokens,
        "temperature": settings.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "beta": 0.0,
        "epsilon": 0.2,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "learning_rate": settings.lr,
        "lr_scheduler_type": "linear",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "max_grad_norm": 1.0,
        "optim": "adamw_torch",
        "max_steps": settings.steps,
        "seed": settings.seed,
        "shuffle_dataset": False,
        "gradient_checkpointing": False,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "log_completions": False,
    }


def worker_command(run: str, settings: BenchSettings, result_path: Path) -> list[str]:
    """The subprocess command line that does one run (a name in RUNS) and writes its JSON."""
    if run not in RUNS:
        raise ValueError(f"run must be one of {RUNS}, got {run!r}")
    return [
        sys.executable, str(Path(__file__).resolve()), "--worker", run,
        "--result", str(result_path), "--steps", str(settings.steps),
        "--threads", str(settings.threads), "--seed", str(settings.seed),
        "--eval-every", str(settings.eval_every), *(["--tiny"] if settings.model == "tiny" else []),
    ]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps for each run")
    parser.add_argument("--tiny", action="store_true", help="tiny random-init model (smoke run)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eval-every",
        type=int,
        default=10,
        help="held-out accuracy every N steps (timed apart from the steps)",
    )
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--no-install", action="store_true", help="fail if trl is missing")
    parser.add_argument("--report-only", type=Path, help="rebuild md/png/table from this JSON")
    parser.add_argument("--worker", choices=RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.eval_every < 1:
        parser.error(f"--eval-every must be >= 1, got {args.eval_every}")
    if args.worker and args.result is None:
        parser.error("--worker needs --result")
    return args


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(
        model="tiny" if args.tiny else "smollm2",
        steps=args.steps,
        threads=args.threads,
        seed=args.seed,
        eval_every=args.eval_every,
    )


# ---------------------------------------------------------------- installing trl


def ensure_trl(allow_install: bool = True) -> str:
    """Install trl==TRL_VERSION into this interpreter if absent, never changing torch; returns
    the installed trl version. Raises RuntimeError if the install fails or moves torch."""
    import importlib.metadata as md

    try:
        return md.version("trl")
    except md.PackageNotFoundError:
        if not allow_install:
            raise RuntimeError("trl is not installed and --no-install was given") from None
    torch_version = md.version("torch").split("+")[0]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(f"torch=={torch_version}\n")
    command = [sys.executable, "-m", "pip", "install", f"trl=={TRL_VERSION}", "-c", handle.name]
    logger.warning("installing: %s", " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    installed = [line for line in done.stdout.splitlines() if line.startswith("Successfully")]
    logger.warning("pip: %s", installed[-1] if installed else done.stdout.strip()[-300:])
    if done.returncode != 0:
        raise RuntimeError(f"pip install trl=={TRL_VERSION} failed: {done.stderr.strip()[-300:]}")
    if md.version("torch").split("+")[0] != torch_version:
        raise RuntimeError(f"installing trl changed torch from {torch_version}")
    return md.version("trl")


# ---------------------------------------------------------------- shared pieces (workers)


def _data(settings: BenchSettings) -> tuple[list[Any], list[Any]]:
    from yatt.builders import build_data
    from yatt.config import DataConfig

    config = DataConfig(
        task="addition", n_train=settings.n_train, n_heldout=settings.n_heldout, seed=settings.seed
    )
    return build_data(config)


def _prompt_order(settings: BenchSettings, n_train: int) -> list[int]:
    """Train-prompt indices in the order yatt's trainer draws them (data.seed + train.seed)."""
    from yatt.data import PromptSampler

    sampler = PromptSampler(n_train, settings.seed + settings.seed)
    return sampler.take(settings.steps * settings.prompts_per_step)


def _load_model(settings: BenchSettings) -> tuple[Any, Any]:
    import torch

    from yatt.builders import build_model
    from yatt.config import ModelConfig

    model, tokenizer = build_model(ModelConfig(path=settings.model, dtype="float32"))
    assert next(model.parameters()).dtype == torch.float32
    return model, tokenizer


def heldout_accuracy(model: Any, tokenizer: Any, heldout: list[Any], batch_size: int) -> float:
    """yatt's greedy fp32 held-out accuracy (the one measure used for every run)."""
    import torch

    from yatt.evaluate import evaluate_engine
    from yatt.rollout import make_engine

    was_training = model.training
    model.eval()
    with torch.no_grad():
        accuracy, _ = evaluate_engine(
            make_engine("yatt", model, tokenizer), tokenizer, heldout, batch_size=batch_size,
            max_new_tokens=16, reward_fn="math_answer", use_chat_template=True,
        )  # fmt: skip
    model.train(was_training)
    return accuracy


def trl_prompt_ids_match(tokenizer: Any, example: Any) -> bool:
    """True when TRL's tokenisation of a conversational prompt (the chat template applied with
    tokenize=True) gives the same ids as yatt's (render_prompt, then add_special_tokens=False)."""
    from yatt.data import render_prompt

    messages = [{"role": "user", "content": example.prompt}]
    trl_ids = tokenizer.apply_chat_template(
        conversation=[messages], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"][0]
    yatt_text = render_prompt(example, tokenizer, use_chat_template=True)
    return list(trl_ids) == tokenizer(yatt_text, add_special_tokens=False)["input_ids"]


def _step_record(
    step_s: float, reward: float, completion_tokens: float, phases: dict, **extra: float
) -> dict:
    """One step's measurements; `extra`: cpu_s (process CPU time), zero_signal_frac (share of
    groups whose rewards are all equal, so their policy gradient is exactly zero)."""
    return {"step_s": step_s, "reward": reward, "completion_tokens": completion_tokens,
            "phases_s": phases, **extra}  # fmt: skip


# ---------------------------------------------------------------- yatt worker


def run_yatt(settings: BenchSettings, run: str) -> dict[str, Any]:
    from yatt.config import load_config
    from yatt.trainer import Trainer

    run_dir = tempfile.mkdtemp(prefix="yatt_trl_compare_")
    overrides = yatt_overrides(settings, run_dir, ROLLOUT_DTYPES[run])
    trainer = Trainer(load_config("grpo_addition", overrides))
    heldout = trainer.heldout_set
    curve = _AccuracyCurve(settings, heldout)
    curve.measure(0, trainer.policy.model, trainer.tokenizer)
    steps = []
    curve.start_training()
    while trainer.step < settings.steps:
        metrics = trainer.train_step()
        trainer.step += 1
        phases = {key.removeprefix("timing_s/"): value for key, value in metrics.items()
                  if key.startswith("timing_s/") and key != "timing_s/step"}  # fmt: skip
        steps.append(_step_record(
            metrics["timing_s/step"], metrics["critic/score/mean"],
            metrics["response_length/mean"] * settings.batch_completions, phases,
            cpu_s=metrics["perf/step_cpu_s"],
            zero_signal_frac=1.0 - metrics["actor/trained_rows_frac"],
        ))  # fmt: skip
        logger.warning("%s step %d/%d: %.2f s, reward %.2f", run, trainer.step, settings.steps,
                       steps[-1]["step_s"], steps[-1]["reward"])  # fmt: skip
        if settings.evaluates_after(trainer.step):
            curve.measure(trainer.step, trainer.policy.model, trainer.tokenizer)
    train_wall_s = curve.train_wall_s()
    return {
        "run": run,
        "framework": "yatt",
        "rollout_dtype": ROLLOUT_DTYPES[run],
        "version": trl_report.version("yatt"),
        "steps": steps,
        "train_wall_s": train_wall_s,
        **curve.result(),
        "torch_threads": _threads(),
    }


class _AccuracyCurve:
    """Held-out greedy accuracy at step 0 and every `eval_every` steps; the time it takes is
    kept apart (`spent_s`) so that it never counts as training time."""

    def __init__(self, settings: BenchSettings, heldout: list[Any]) -> None:
        self.settings, self.heldout = settings, heldout
        self.points: list[tuple[int, float]] = []
        self.spent_s = 0.0
        self._train_start_s = self._spent_at_start_s = 0.0

    def start_training(self) -> None:
        """Training starts now (after the step-0 evaluation, which it does not include)."""
        self._train_start_s, self._spent_at_start_s = time.perf_counter(), self.spent_s

    def train_wall_s(self) -> float:
        """Wall time since ``start_training``, less the evaluations made since."""
        evaluating_s = self.spent_s - self._spent_at_start_s
        return time.perf_counter() - self._train_start_s - evaluating_s

    def measure(self, step: int, model: Any, tokenizer: Any) -> None:
        start_s = time.perf_counter()
        accuracy = heldout_accuracy(model, tokenizer, self.heldout, self.settings.eval_batch_size)
        self.spent_s += time.perf_counter() - start_s
        self.points.append((step, accuracy))
        logger.warning("step %d: held-out accuracy %.1f%%", step, 100 * accuracy)

    def result(self) -> dict[str, Any]:
        return {"accuracy_curve": self.points, "accuracy_before": self.points[0][1],
                "accuracy_after": self.points[-1][1]}  # fmt: skip


# ---------------------------------------------------------------- TRL worker


def _timed(function: Any, sink: list[float]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start_s = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start_s)

    return wrapper


def _trl_reward(completions: list[Any], answer: list[str], **_kwargs: Any) -> list[float]:
    """yatt's math_answer on TRL's (conversational) completions."""
    from yatt.rewards.math import math_answer

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [math_answer("", text, answer=ref) for text, ref in zip(texts, answer)]


def run_trl(settings: BenchSettings) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(settings.seed)
    train, heldout = _data(settings)
    order = _prompt_order(settings, len(train))
    rows = [{"prompt": [{"role": "user", "content": train[i].prompt}], "answer": train[i].answer}
            for i in order]  # fmt: skip
    model, tokenizer = _load_model(settings)
    prompts_match = trl_prompt_ids_match(tokenizer, train[order[0]])
    gen_s: list[float] = []
    reward_s: list[float] = []
    score_s: list[float] = []
    model.generate = _timed(model.generate, gen_s)  # TRL calls the unwrapped model's generate
    reward_fn = _timed(_trl_reward, reward_s)
    reward_fn.__name__ = "math_answer"
    records: list[dict[str, float]] = []
    step_s: list[float] = []
    cpu_s: list[float] = []

    curve = _AccuracyCurve(settings, heldout)

    class _Recorder(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start_s, self.start_cpu_s = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_s.append(time.perf_counter() - self.start_s)
            cpu_s.append(time.process_time() - self.start_cpu_s)
            logger.warning("trl step %d/%d: %.2f s", len(step_s), settings.steps, step_s[-1])
            if settings.evaluates_after(len(step_s)):  # before the last log: reward is logged
                curve.measure(len(step_s), model, tokenizer)  # after on_step_end

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            records.append(dict(logs or {}))

    class _TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
            return _timed(super()._generate_and_score_completions, score_s)(*args, **kwargs)

    output_dir = tempfile.mkdtemp(prefix="trl_compare_")
    torch.set_num_threads(settings.threads)
    curve.measure(0, model, tokenizer)
    trainer = _TimedGRPOTrainer(
        model=model, reward_funcs=[reward_fn], processing_class=tokenizer,
        args=GRPOConfig(**trl_config_kwargs(settings, output_dir)),
        train_dataset=Dataset.from_list(rows), callbacks=[_Recorder()],
    )  # fmt: skip
    torch.set_num_threads(settings.threads)
    curve.start_training()
    trainer.train()
    train_wall_s = curve.train_wall_s()
    final_dir = Path(output_dir) / "final"
    saved = _saved_model_accuracy(trainer, tokenizer, final_dir, heldout, settings)
    if saved != curve.points[-1][1]:
        logger.warning("TRL's saved model scores %.3f, in memory %.3f", saved, curve.points[-1][1])
    timings = {"step": step_s, "cpu": cpu_s, "gen": gen_s, "reward": reward_s, "score": score_s}
    steps = _trl_steps([log for log in records if "reward" in log], timings, settings)
    return {"run": "trl", "framework": "trl", "version": trl_report.version("trl"), "steps": steps,
            "train_wall_s": train_wall_s, **curve.result(),
            "torch_threads": _threads(), "accuracy_saved_model": saved,
            "final_model_dir": str(final_dir),
            "prompt_ids_match_yatt": prompts_match}  # fmt: skip


def _saved_model_accuracy(trainer: Any, tokenizer: Any, final_dir: Path, heldout: Any,
                          settings: BenchSettings) -> float:  # fmt: skip
    """TRL's trained model saved into `final_dir`, loaded back as yatt loads a model, and its
    held-out accuracy (the in-memory one should match)."""
    import torch

    from yatt.models import load_model, load_tokenizer

    trainer.save_model(str(final_dir))
    tokenizer.save_pretrained(str(final_dir))
    reloaded = load_model(final_dir, dtype=torch.float32)
    return heldout_accuracy(reloaded, load_tokenizer(final_dir), heldout, settings.eval_batch_size)


def _trl_steps(step_logs: list[dict], timings: dict[str, list[float]],
               settings: BenchSettings) -> list[dict[str, Any]]:  # fmt: skip
    """One step record per TRL step from its logged row and the step's timings (wall and CPU
    seconds of the step, of generate, of the reward function, of generating and scoring; the
    update is the step's rest)."""
    assert len(step_logs) == len(timings["step"]) == settings.steps, (
        len(step_logs), len(timings["step"]),
    )  # fmt: skip
    steps = []
    for index, log in enumerate(step_logs):
        step_s, score_s = timings["step"][index], timings["score"][index]
        phases = {"gen": timings["gen"][index], "reward": timings["reward"][index],
                  "gen_and_score": score_s, "update": step_s - score_s}  # fmt: skip
        if "step_time" in log:
            phases["trl_step_time"] = log["step_time"]
        tokens = log["completions/mean_length"] * settings.batch_completions
        steps.append(_step_record(step_s, log["reward"], tokens, phases,
                                  cpu_s=timings["cpu"][index],
                                  zero_signal_frac=log["frac_reward_zero_std"]))  # fmt: skip
    return steps


def _threads() -> int:
    import torch

    return torch.get_num_threads()


# ---------------------------------------------------------------- entry points


def _run_worker(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import torch

    torch.set_num_threads(settings.threads)
    result = run_trl(settings) if args.worker == "trl" else run_yatt(settings, args.worker)
    result["settings"] = dataclasses.asdict(settings)
    args.result.write_text(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return _run_worker(args)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.report_only:
        if not args.report_only.is_file():
            raise SystemExit(f"trl_compare.py: --report-only {args.report_only}: no such file")
        payload = json.loads(args.report_only.read_text())
        settings = BenchSettings(**payload["settings"])
        fairness = payload.get("fairness", FAIRNESS)  # what the stored runs were held to
        trl_report.write_report(
            args.out_dir, settings, payload["runs"], fairness, payload.get("host")
        )
        return 0
    settings = settings_from_args(args)
    try:
        trl_version = ensure_trl(allow_install=not args.no_install)
    except RuntimeError as error:  # missing with --no-install, or the install failed
        raise SystemExit(f"trl_compare.py: {error}") from None
    logger.warning("trl %s; runs %s, %d steps each", trl_version, RUNS, settings.steps)
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads),
           "MKL_NUM_THREADS": str(settings.threads), "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="trl_compare_") as scratch:
        for run in RUNS:
            result_path = Path(scratch) / f"{run}.json"
            start_s = time.perf_counter()
            subprocess.run(worker_command(run, settings, result_path), env=env, check=True)
            results[run] = json.loads(result_path.read_text())
            print(f"[summary] run={run} wall_s={time.perf_counter() - start_s:.0f}",
                  flush=True)  # fmt: skip
    trl_report.write_report(args.out_dir, settings, results, FAIRNESS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
