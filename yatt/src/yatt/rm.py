"""Reward-model training (`yatt rm`): a Bradley–Terry scalar-head model learned from preference
pairs, for `reward.model_path` (RLHF with a learned reward).

Reads these sections of the RL config tree: model (path: the causal LM whose decoder the
reward model starts from; its LM head gives way to a new scalar head), data (`path`: JSONL or
parquet rows with `prompt`, `chosen` and `rejected`, the two responses as strings; or `task`:
pairs made in-process from a task, `rejected` saying how: the reference answer over a
nearby wrong number, "slips"; the model's own worst completion under its best one or the
reference answer, "samples", sampled as `rollout.*` says and scored by `reward.fns`; or a pair
of each, "both"; `n_heldout` pairs held out, `n_train`, `seed`, `use_chat_template`),
algo.micro_batch_size (pairs per step), optim (lr, weight_decay, grad_clip), train (steps,
seed, torch_threads), eval (n: held-out prompts whose pairs are scored before and after
training; at_start, at_end), rollout and reward.fns (with sampled pairs) and logging
(run_dir, overwrite, progress, plots, tensorboard).

Each pair's texts are the prompt as the policy sees it (its chat template applied with
`data.use_chat_template`), followed by each response: what `reward.model_path` scores in a
run. The loss is -log sigmoid(s_chosen - s_rejected). Writes `<run_dir>/reward_model` (the
backbone, the head, the tokenizer and the run's config.yaml, whole or not at all),
`rm_metrics.jsonl` (per step: rm/loss and rm/accuracy over the step's pairs; at step 0 and at
the end: rm/heldout_accuracy, the share of held-out pairs scored the right way round, and
rm/heldout_margin, the mean s_chosen - s_rejected, over rm/heldout_pairs pairs, and with
"both" rm/heldout_accuracy_slips and rm/heldout_accuracy_samples, each kind's share; with
sampled pairs, at step 0 also rm/samples_best, the share of the samples scored as high as the
reference answer, and rm/sample_pairs, the pairs they gave) and `rm.png`. No checkpoints: a
run is short, and a stopped one starts again.

Why sample: a reward model learns only the differences its pairs show. Pairs of bare numbers
never show it what the policy writes (sentences, working, other numbers), so its scores there
say nothing; the policy's own completions, worst against best, show it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from yatt.common import MetricsLogger, seed_everything
from yatt.config import Config, changed_settings, save_config
from yatt.errors import ConfigError, DataError

__all__ = [
    "PreferencePair",
    "preference_pairs",
    "preferred_responses",
    "run_reward_model",
    "sampled_responses",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "rm_metrics.jsonl"
MODEL_FOLDER = "reward_model"
# What a wrong answer of a generated pair is off by: the slips of carrying and of a digit.
_SLIPS = (-11, -10, -9, -2, -1, 1, 2, 9, 10, 11)
SAMPLE_PROMPTS = 16  # prompts per sampling call (times rollout.n_samples completions)
SAMPLE_LOG_EVERY_S = 15.0  # a progress line while sampling, at most this often


@dataclass(frozen=True)
class PreferencePair:
    """A prompt as the policy sees it and two responses to it, `chosen` preferred."""

    prompt: str
    chosen: str
    rejected: str

    def texts(self) -> tuple[str, str]:
        return self.prompt + self.chosen, self.prompt + self.rejected


def preference_pairs(
    examples: list[Any], tokenizer: Any, config: Config,
    responses: list[tuple[str, str]] | None = None,
) -> list[PreferencePair]:  # fmt: skip
    """The pairs of `examples` (PromptExamples): their `responses` (`preferred_responses`
    when not given), each after its prompt as the policy sees it (`data.use_chat_template`)."""
    from yatt.data import render_prompt

    if responses is None:
        responses = preferred_responses(examples, config)
    return [
        PreferencePair(render_prompt(example, tokenizer, config.data.use_chat_template), *pair)
        for example, pair in zip(examples, responses, strict=True)
    ]


def preferred_responses(examples: list[Any], config: Config) -> list[tuple[str, str]]:
    """(chosen, rejected) of each of `examples`: their `chosen` and `rejected` fields (a
    preference file), or, for a generated task, the reference answer over a wrong number
    (seeded by `data.seed`).

    Raises:
        DataError: a file row without both responses as different non-empty strings, named
            by file and line; a task whose answers are not whole numbers.
    """
    rng = random.Random(config.data.seed)
    if config.data.path:
        pairs = [_responses(example) for example in examples]
    else:
        pairs = [_generated_responses(example, config.data.task, rng) for example in examples]
    return pairs


def _responses(example: Any) -> tuple[str, str]:
    where = example.source or "a row"
    responses = []
    for key in ("chosen", "rejected"):
        value = example.fields.get(key)
        if not isinstance(value, str) or not value.strip():
            shown = "missing" if value is None else f"{type(value).__name__} {value!r:.40}"
            raise DataError(
                f"{where}: a preference row needs '{key}', a non-empty string (the response); "
                f"it is {shown}"
            )
        responses.append(value)
    if responses[0] == responses[1]:
        raise DataError(f"{where}: 'chosen' and 'rejected' are the same text: no preference")
    return responses[0], responses[1]


def _generated_responses(example: Any, task: str, rng: random.Random) -> tuple[str, str]:
    answer = example.answer
    try:
        value = int(answer)
    except (TypeError, ValueError):
        raise DataError(
            f"data.task={task}: pairs are made from whole-number answers (the answer chosen over "
            f"a wrong number), but an answer is {answer!r:.40}; give data.path, a file of "
            "prompt/chosen/rejected rows"
        ) from None
    return str(value), str(value + rng.choice(_SLIPS))


def sampled_responses(
    causal_lm: Any,
    tokenizer: Any,
    examples: list[Any],
    config: Config,
    part: str = "train",
    advance: Callable[[int], None] | None = None,
) -> tuple[list[tuple[str, str] | None], int]:
    """(chosen, rejected) of each of `examples` from `rollout.n_samples` completions of
    `causal_lm` (sampled as `rollout.*` says) scored by `reward.fns`: the lowest-scoring
    completion, under the highest-scoring one where they differ, else under the reference
    answer where that scores higher, else None (every completion scored as well as the
    reference). Also how many completions scored as high as the reference.

    Example i of `part` ("train" or "heldout") samples with seeds of its own, drawn from
    `data.seed`, `part` and i: the held-out pairs stay the same whatever `data.n_train` is.
    `advance(n)` is told of each call's n completions (a progress bar); without it, a log line
    says how far sampling got, at most every `SAMPLE_LOG_EVERY_S` seconds and at the end.

    Raises:
        DataError: an example without a reference answer.
        RewardError: a reward function failed on a completion.
    """
    from yatt.data import render_prompt
    from yatt.rewards import CombinedReward
    from yatt.roles.rollout import RolloutRole

    rollout = RolloutRole.build(causal_lm, tokenizer, config.rollout)
    reward = CombinedReward(list(zip(config.reward.fns, config.reward.weights, strict=True)))
    n_samples, total = config.rollout.n_samples, len(examples) * config.rollout.n_samples
    pairs: list[tuple[str, str] | None] = []
    best = 0
    started_s = logged_s = time.perf_counter()
    for start in range(0, len(examples), SAMPLE_PROMPTS):
        chunk = examples[start : start + SAMPLE_PROMPTS]
        prompts = [render_prompt(example, tokenizer, config.data.use_chat_template)
                   for example in chunk]  # fmt: skip
        rows = [example.reward_fields() for example in chunk]
        seeds = []
        for index in range(start, start + len(chunk)):
            rng = random.Random(f"yatt rm samples {config.data.seed} {part} {index}")
            seeds += [rng.getrandbits(62) for _ in range(n_samples)]
        batch = rollout.generate(prompts, rows, list(range(len(chunk))), seeds)
        references = [_reference(example) for example in chunk]
        scores = reward([*batch.prompts, *prompts], [*batch.completions, *references],
                        [*batch.rows, *rows])  # fmt: skip
        for k, reference in enumerate(references):
            reference_score = scores[len(batch.completions) + k]
            own = [(scores[i], batch.completions[i])
                   for i in range(k * n_samples, (k + 1) * n_samples)]  # fmt: skip
            best += sum(score >= reference_score for score, _ in own)
            pairs.append(_sampled_pair(own, reference, reference_score))
        done, now_s = (start + len(chunk)) * n_samples, time.perf_counter()
        if advance is not None:
            advance(len(chunk) * n_samples)
        if (now_s - logged_s >= SAMPLE_LOG_EVERY_S and advance is None) or done == total:
            logged_s = now_s
            logger.info("sampled %d/%d completions (%s) in %.0f s; %.1f%% scored as high as "
                        "the reference answer", done, total, part, now_s - started_s,
                        100 * best / done)  # fmt: skip
    return pairs, best


def _reference(example: Any) -> str:
    if example.answer is None or not str(example.answer).strip():
        where = example.source or "a generated prompt"
        raise DataError(f"{where}: data.rejected needs a reference answer, and it has none")
    return str(example.answer).strip()


def _sampled_pair(
    own: list[tuple[float, str]], reference: str, reference_score: float
) -> tuple[str, str] | None:
    """The worst of a prompt's scored completions under its best one, or under the reference
    answer where none of them scores better than another; None where that is no preference."""
    worst_score, rejected = min(own, key=lambda scored: scored[0])
    best_score, chosen = max(own, key=lambda scored: scored[0])
    if best_score <= worst_score:
        if reference_score <= worst_score:
            return None
        chosen = reference
    return None if chosen == rejected else (chosen, rejected)


def run_reward_model(config: Config, progress: Any = None) -> Path:
    """Train a reward model as the module docstring says; returns its folder.

    `progress(step, total, metrics)` is called after each step (the CLI's progress bar).
    Raises ConfigError for settings it does not read (`_check_settings`) and DataError for bad
    rows, before the run folder is claimed; a model that does not load, or sampled pairs that
    leave nothing to train on or to score (DataError), leave no run folder.
    """
    from yatt.builders import build_data, build_model
    from yatt.run_dir import RUN_OUTPUTS, claim_run_dir
    from yatt.trainer import configure_threads

    _check_settings(config)
    train_set, heldout_set = build_data(config.data)
    scored = config.eval.n and (config.eval.at_start or config.eval.at_end)
    if not heldout_set and scored:
        raise DataError(
            f"yatt rm scores the pairs of eval.n={config.eval.n} held-out prompts, but data "
            "holds none out (set data.n_heldout, or eval.n=0)"
        )
    heldout_set = heldout_set[: config.eval.n] if scored else []
    examples, kind = [*train_set, *heldout_set], config.data.rejected
    responses = preferred_responses(examples, config) if kind != "samples" else []
    if kind != "slips":
        list(map(_reference, examples))  # bad rows fail here, before the folder is claimed
    claim = claim_run_dir(config, RUN_OUTPUTS, resume="", in_place=False)
    with claim.removed_if_unused():  # a failed set-up (or sampling) leaves no empty folder
        configure_threads(config.train.torch_threads)
        seed_everything(config.train.seed)
        causal_lm, tokenizer = build_model(config.model)
        train_sampled, heldout_sampled, row0 = _sample(causal_lm, tokenizer, train_set,
                                                       heldout_set, config)  # fmt: skip
        model = _reward_model(causal_lm, config)
        del causal_lm  # its LM head, if untied, is not needed again
        split = len(train_set)
        pairs = _pairs(train_set, tokenizer, config, responses[:split], train_sampled)
        heldout = _pairs(heldout_set, tokenizer, config, responses[split:], heldout_sampled)
        _check_sampled_pairs(config, train_sampled, heldout_sampled)
    logger.info("%d training pairs, %d held out; the first prefers %r over %r", len(pairs),
                len(heldout), pairs[0].chosen, pairs[0].rejected)  # fmt: skip
    run_dir = claim.clear()  # logging.overwrite: the previous run goes once the model loaded
    save_config(config, run_dir)
    board = run_dir / "tensorboard" if config.logging.tensorboard else None
    stream = MetricsLogger.to_files(run_dir / METRICS_FILE, board)
    try:
        heldout_slips = len(heldout_set) if kind == "both" else 0
        if heldout and config.eval.at_start:
            row0.update(_heldout_metrics(model, tokenizer, heldout, heldout_slips))
        if row0:
            stream.log(0, row0)
        _train(model, tokenizer, pairs, heldout, heldout_slips, config, stream, progress)
    finally:
        stream.close()
    folder = _save(model, tokenizer, config, run_dir / MODEL_FOLDER)
    logger.info("reward model saved in %s (reward.model_path=%s)", folder, folder)
    return folder


# Settings of the sections `yatt rm` reads that it does not act on: refused when changed.
_UNREAD = ("train.time_limit_s", "train.gradient_checkpointing", "train.bf16_autocast",
           "eval.every", "optim.warmup_steps", "model.lora_rank")  # fmt: skip


def _check_settings(config: Config) -> None:
    """Refuse (ConfigError, one line) what `yatt rm` would otherwise ignore: control.*, the
    checkpoint settings (no checkpoints: a run is short, a stopped one starts again) and the
    `_UNREAD` ones, and bf16 training weights; and sampled pairs (`data.rejected`) with a
    data.path file, or without reward functions that can grade the task."""
    from yatt.run_checks import check_job_settings, check_rewards_grade_task

    check_job_settings(config, "yatt rm")
    if config.data.rejected != "slips":
        _check_sampling_settings(config)
        check_rewards_grade_task(config, evaluate=None)
    checkpoint = config.checkpoint
    if checkpoint.resume or checkpoint.every:
        raise ConfigError(
            "yatt rm keeps no checkpoints (a run is short; a stopped one starts again): drop "
            "checkpoint.resume and checkpoint.every"
        )
    changed = [
        dotted
        for dotted in _UNREAD
        if dotted.split(".")[1] in changed_settings(getattr(config, dotted.split(".")[0]))
    ]
    if changed:
        raise ConfigError(
            f"yatt rm does not act on {', '.join(changed)} (it trains the whole reward model "
            "at optim.lr, a constant rate, and scores held-out pairs before and after): drop "
            "them"
        )


def _check_sampling_settings(config: Config) -> None:
    """Sampled pairs (data.rejected=samples|both) come from data.task, are scored by
    reward.fns alone, and are sampled on a backend that gives its memory back."""
    kind = config.data.rejected
    problem = None
    if config.data.path:
        problem = ("makes pairs from data.task; a data.path file gives its own chosen and "
                   "rejected responses: drop one of them")  # fmt: skip
    elif not config.reward.fns:
        problem = "scores the sampled completions with reward.fns, which is empty: name one"
    elif config.reward.model_path:
        problem = ("scores the sampled completions with reward.fns alone: drop "
                   "reward.model_path, which it would leave out")  # fmt: skip
    elif config.rollout.backend == "vllm":
        problem = ("samples with rollout.backend=yatt or hf: vllm's engine would keep its "
                   "memory through the training")  # fmt: skip
    if problem:
        raise ConfigError(f"data.rejected={kind} {problem}")


def _sample(
    causal_lm: Any, tokenizer: Any, train_set: list[Any], heldout_set: list[Any], config: Config
) -> tuple[list[tuple[str, str] | None], list[tuple[str, str] | None], dict[str, float]]:
    """The sampled pairs of the training and held-out prompts, and their step-0 metrics (none
    with data.rejected=slips)."""
    if config.data.rejected == "slips":
        return [], [], {}
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from yatt.report import console

    total = (len(train_set) + len(heldout_set)) * config.rollout.n_samples
    shown = config.logging.progress and (console.is_terminal or console.is_jupyter)
    columns = (TextColumn("[bold]sampling"), BarColumn(), MofNCompleteColumn(),
               TextColumn("completions"), TimeElapsedColumn(), TextColumn("eta"),
               TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=console, disable=not shown) as bar:
        task = bar.add_task("sampling", total=total)
        advance = (lambda n: bar.advance(task, n)) if shown else None
        train, best = sampled_responses(causal_lm, tokenizer, train_set, config, "train",
                                        advance)  # fmt: skip
        heldout, heldout_best = sampled_responses(causal_lm, tokenizer, heldout_set, config,
                                                  "heldout", advance)  # fmt: skip
    made = sum(pair is not None for pair in (*train, *heldout))
    return train, heldout, {"rm/samples_best": (best + heldout_best) / total,
                            "rm/sample_pairs": float(made)}  # fmt: skip


def _check_sampled_pairs(
    config: Config,
    train: list[tuple[str, str] | None],
    heldout: list[tuple[str, str] | None],
) -> None:
    """Sampled pairs must leave something to train on and, where held-out prompts are
    scored, to score (DataError); with data.rejected=both, a kind that made none is said."""
    kind = config.data.rejected
    for part, made in (("training", train), ("held-out", heldout)):
        if not made or any(pair is not None for pair in made):
            continue
        why = (f"no {part} pair from samples: each of the {len(made) * config.rollout.n_samples}"
               " sampled completions scored as high as its reference answer")  # fmt: skip
        if kind == "samples":
            fix = "; try data.rejected=both" + (", or eval.n=0" if part == "held-out" else "")
            raise DataError(why + fix)
        logger.warning("%s: the %s pairs are slips alone", why, part)


def _reward_model(causal_lm: Any, config: Config) -> Any:
    """A ScalarHeadModel on the decoder of `causal_lm` (its weights, not a copy)."""
    from yatt.heads import ScalarHeadModel

    return ScalarHeadModel.from_causal_lm(causal_lm, seed=config.train.seed)


def _pairs(
    examples: list[Any], tokenizer: Any, config: Config,
    responses: list[tuple[str, str]], sampled: list[tuple[str, str] | None],
) -> list[PreferencePair]:  # fmt: skip
    """The pairs of `examples`: those of `responses` (file rows or slips), then those of the
    sampled completions that gave one."""
    pairs = preference_pairs(examples, tokenizer, config, responses) if responses else []
    if sampled:
        kept = [(example, pair) for example, pair in zip(examples, sampled, strict=True) if pair]
        pairs += preference_pairs([example for example, _ in kept], tokenizer, config,
                                  [pair for _, pair in kept])  # fmt: skip
    return pairs


def _train(model: Any, tokenizer: Any, pairs: list[PreferencePair],
           heldout: list[PreferencePair], heldout_slips: int, config: Config,
           stream: MetricsLogger, progress: Any) -> None:  # fmt: skip
    from yatt.rewards.model import train_reward_model

    total = config.train.steps
    start_s = time.perf_counter()

    def step_done(step: int, metrics: dict[str, float]) -> None:
        row = {"rm/loss": metrics["loss"], "rm/accuracy": metrics["accuracy"],
               "timing_s/step": metrics["step_s"]}  # fmt: skip
        if step == total and heldout and config.eval.at_end:
            row.update(_heldout_metrics(model, tokenizer, heldout, heldout_slips))
        stream.log(step, row)
        if progress is not None:
            progress(step, total, row)

    optim = config.optim
    train_reward_model(
        model, tokenizer, [pair.texts() for pair in pairs], steps=total,
        batch_size=config.algo.micro_batch_size, lr=optim.lr, weight_decay=optim.weight_decay,
        max_grad_norm=optim.grad_clip, seed=config.train.seed, on_step=step_done,
    )  # fmt: skip
    logger.info("reward model: %d steps in %.1f s", total, time.perf_counter() - start_s)


def _heldout_metrics(
    model: Any, tokenizer: Any, heldout: list[PreferencePair], slips: int = 0
) -> dict:
    """The share of held-out pairs scored the right way round, and the mean score margin;
    with `slips` (data.rejected=both: the first `slips` pairs are of slips, the rest of
    samples), the share of each kind too."""
    from yatt.rewards.model import score_texts

    start_s = time.perf_counter()
    texts = [text for pair in heldout for text in pair.texts()]  # chosen, rejected, ...
    scores = score_texts(model, tokenizer, texts, groups=[k // 2 for k in range(len(texts))])
    chosen, rejected = scores[0::2], scores[1::2]
    right = ((chosen - rejected) > 0).float()
    row = {"rm/heldout_accuracy": float(right.mean()),
           "rm/heldout_margin": float((chosen - rejected).mean()),
           "rm/heldout_pairs": float(len(heldout))}  # fmt: skip
    if 0 < slips < len(heldout):
        row["rm/heldout_accuracy_slips"] = float(right[:slips].mean())
        row["rm/heldout_accuracy_samples"] = float(right[slips:].mean())
    return row | {"timing_s/eval": time.perf_counter() - start_s}


def _save(model: Any, tokenizer: Any, config: Config, folder: Path) -> Path:
    """The reward model, its tokenizer and the run's config, written whole or not at all."""
    from yatt.checkpoint import write_folder

    def write(staging: Path) -> None:
        model.save(staging, tokenizer)
        save_config(config, staging / "config.yaml")

    with torch.no_grad():
        return write_folder(folder, write)
