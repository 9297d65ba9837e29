"""Direct preference optimisation (`yatt dpo`): train the policy itself on preference pairs,
with no reward model and no sampling during training (Rafailov et al. 2023).

Reads these sections of the RL config tree: model (the causal LM to train; `lora_rank` trains
adapters on it), data (the pairs, as `yatt rm` makes them: `path` rows with `prompt`,
`chosen` and `rejected`, or pairs made from `task` as `rejected` says: "slips", "samples" or
"both", see `yatt.pairs`; `n_heldout`, `n_train`, `seed`, `use_chat_template`),
algo (`dpo_beta`, `dpo_loss`, `dpo_label_smoothing`, `dpo_sft_weight`, and
`micro_batch_size`: pairs per step), optim (lr, betas, eps,
weight_decay, schedule, warmup_steps, grad_clip), train (steps, seed, torch_threads,
time_limit_s), checkpoint (every, at_end, keep_last, resume), eval (n:
held-out prompts; at_start, at_end; max_new_tokens, batch_size, reward_fn), rollout (the
sampling of "samples" pairs, and `stop` for the held-out answers), reward.fns (scoring the
sampled pairs) and logging.

The loss of a pair is -log sigmoid(r_chosen - r_rejected), with the implicit reward
r = dpo_beta * (log pi(response | prompt) - log pi_ref(response | prompt)) summed over the
response's tokens and its EOS; `algo.dpo_loss` picks another function of the same log-ratios
(robust, hinge or ipo: `yatt.algos.losses.dpo_loss`), `algo.dpo_label_smoothing` smooths
sigmoid (conservative DPO) and robust, and `algo.dpo_sft_weight` adds that much of the chosen
responses' NLL per token (RPO). The reference pi_ref is the model before training: its
log-probs of every pair are computed once, before the first step, so no second copy of the
model is held. What a run is for is measured twice: held-out accuracy (`eval/accuracy`, the
share of the first `eval.n` held-out prompts whose greedy answer `eval.reward_fn` scores 1, as
`yatt train` and `yatt eval` measure it) at step 0 and after the last step, and at the end
the held-out pairs' implicit rewards (`dpo/heldout_accuracy`: the share ranked right,
`dpo/heldout_margin`). Writes `<run_dir>/model` (the trained model, its tokenizer and the run's
config.yaml, for `yatt eval` and `yatt train ... model.path=`), `dpo_metrics.jsonl` (per step:
dpo/loss, dpo/accuracy, dpo/margin, dpo/reward_chosen, dpo/reward_rejected, dpo/chosen_nll,
dpo/lr) and
`dpo.png`.

Checkpoints (`checkpoint.every`, `at_end`, `keep_last`, and where `train.time_limit_s` stops
the run early, which then scores the held-out set as at the end) have `yatt sft`'s layout,
marked as DPO's; they also keep the pairs and the reference log-probs, so
`checkpoint.resume` (a folder, `latest` or `auto`) goes on exactly, as the steps would have
run without the stop, without sampling or a reference pass (refused where the data settings
differ from the checkpoint's).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from yatt.algos.losses import dpo_loss
from yatt.common import MetricsLogger, seed_everything
from yatt.config import Config, save_config
from yatt.errors import ConfigError, DataError, ModelError
from yatt.pairs import PreferencePair, check_sampling_settings, make_pairs, pair_examples
from yatt.roles._forward import response_token_logprobs

__all__ = ["pair_sampler", "run_dpo", "sequence_logprobs"]

logger = logging.getLogger(__name__)

METRICS_FILE = "dpo_metrics.jsonl"
MODEL_FOLDER = "model"
# Settings of the sections `yatt dpo` reads that it does not act on: refused when changed.
_UNREAD = ("train.gradient_checkpointing", "train.bf16_autocast", "train.shared_prefix",
           "eval.every")  # fmt: skip

# A pair as token ids: (prompt, chosen response + EOS, rejected response + EOS).
Encoded = tuple[list[int], list[int], list[int]]


def run_dpo(config: Config, progress: Any = None) -> Path:
    """Train the policy on preference pairs as the module docstring says; returns the saved
    model's folder.

    `progress(step, total, metrics)` is called after each step (the CLI's progress bar).
    Raises ConfigError for settings it does not read (`_check_settings`) or a
    `checkpoint.resume` it cannot continue (`_resume_target`), and DataError for bad rows,
    before the run folder is claimed; a model that does not load, or sampled pairs that leave
    nothing to train on (DataError), leave no run folder.
    """
    from yatt.builders import build_model
    from yatt.checkpoint import DPO, OptimizedModel, drop_later_checkpoints, truncate_metrics
    from yatt.roles.policy import adamw_with_schedule
    from yatt.run_dir import RUN_OUTPUTS, claim_run_dir
    from yatt.trainer import configure_threads

    _check_settings(config)
    resume, in_place = _resume_target(config)
    examples = pair_examples(config, "yatt dpo")
    accuracy_set = examples[1] if _measures_accuracy(config, examples[1]) else []
    claim = claim_run_dir(config, RUN_OUTPUTS, resume=resume, in_place=in_place)
    with claim.removed_if_unused():  # a failed set-up (or sampling) leaves no empty folder
        configure_threads(config.train.torch_threads)
        seed_everything(config.train.seed)
        model, tokenizer = build_model(config.model, resume_from=resume or None)
        _without_dropout(model)
        state = _resumed_state(Path(resume)) if resume else None
        if state is None:
            pairs, heldout, row0 = make_pairs(model, tokenizer, examples, config, "dpo/")
            encoded, heldout_encoded = _encode(pairs, tokenizer), _encode(heldout, tokenizer)
        trained = OptimizedModel(model, *adamw_with_schedule(
            model, config.optim, config.optim.lr, config.train.steps, fused=True), DPO)  # fmt: skip
        sampler = pair_sampler(config, len(encoded if state is None else state["pairs"]))
        # (a checkpoint that does not fit is refused before the folder changes)
        done = 0 if state is None else trained.restore(state, sampler, config, Path(resume))
    run_dir = claim.clear()  # logging.overwrite: the previous run goes once the model loaded
    if in_place:
        drop_later_checkpoints(run_dir, Path(resume), done, config.logging.overwrite)
        truncate_metrics(run_dir / METRICS_FILE, done)
    if resume:  # (said once nothing can refuse it any more)
        logger.info("resumed DPO from %s at step %d", resume, done)
    save_config(config, run_dir)
    board = run_dir / "tensorboard" if config.logging.tensorboard else None
    stream = MetricsLogger.to_files(run_dir / METRICS_FILE, board, done)
    try:
        if state is None:
            data = _reference(model, tokenizer, encoded, heldout_encoded, accuracy_set, config,
                              stream, row0)  # fmt: skip
        else:
            data = _Pairs.from_state(state)
        _fit(trained, sampler, done, tokenizer, data, accuracy_set, config, stream, progress,
             run_dir)  # fmt: skip
    finally:
        stream.close()
    folder = trained.save_model(run_dir / MODEL_FOLDER, tokenizer, config)
    logger.info("DPO done: model saved in %s (yatt eval %s)", folder, folder)
    return folder


@dataclass
class _Pairs:
    """What a run trains on and ranks: the training and held-out pairs as token ids, and the
    reference's (chosen, rejected) log-probs of each (None where there are no held-out
    pairs). Checkpoints keep them, so a resumed run neither samples nor runs the reference
    again."""

    train: list[Encoded]
    heldout: list[Encoded]
    reference: tuple[torch.Tensor, torch.Tensor]
    heldout_reference: tuple[torch.Tensor, torch.Tensor] | None

    STATE_KEYS = ("pairs", "heldout_pairs", "reference", "heldout_reference")

    def state(self) -> dict[str, Any]:
        values = (self.train, self.heldout, self.reference, self.heldout_reference)
        return dict(zip(self.STATE_KEYS, values, strict=True))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _Pairs:
        return cls(state["pairs"], state["heldout_pairs"], tuple(state["reference"]),
                   state["heldout_reference"])  # fmt: skip


def _resume_target(config: Config) -> tuple[str, bool]:
    """`checkpoint.resume_target` for a DPO run, refusing (ConfigError) a checkpoint whose
    pairs came from other data settings (its pairs and reference log-probs are carried on)."""
    from yatt.checkpoint import DPO, resume_target
    from yatt.config import load_config

    resume, in_place = resume_target(config, DPO)
    if not resume:
        return "", False
    try:
        saved = load_config(str(Path(resume) / "config.yaml")).data
    except (OSError, ConfigError) as exc:
        raise ConfigError(
            f"checkpoint.resume={resume}: its config.yaml does not load: {exc}"
        ) from None
    changed = [f"data.{name}" for name, value in vars(saved).items()
               if value != getattr(config.data, name)]  # fmt: skip
    if changed:
        differ = "differ" if len(changed) > 1 else "differs"
        raise ConfigError(
            f"checkpoint.resume={resume}: its pairs came from other data ({', '.join(changed)} "
            f"{differ}): resume with the run's data settings, or start a new run"
        )
    return resume, in_place


def _resumed_state(checkpoint: Path) -> dict[str, Any]:
    """A DPO checkpoint's state: the trainer's keys and the pairs (`_Pairs.state`); ConfigError
    (one line) for one that lacks them."""
    from yatt.checkpoint import DPO, load_trainer_state

    state = load_trainer_state(checkpoint, writer=DPO)
    missing = [key for key in _Pairs.STATE_KEYS if key not in state]
    if missing:
        raise ConfigError(f"checkpoint.resume={checkpoint}: its DPO state lacks {missing}")
    return state


def _measures_accuracy(config: Config, heldout_set: list[Any]) -> bool:
    """Whether held-out accuracy is measured on `heldout_set`: rows from a file must carry what
    `eval.reward_fn` grades against. A file none of whose held-out rows holds an answer (a
    plain prompt/chosen/rejected file) has its held-out pairs ranked alone, as a warning says;
    one with some answers missing is a DataError naming the first such row."""
    from yatt.run_checks import check_rows_have_answers

    if not heldout_set:
        return False
    try:
        check_rows_have_answers(config, [], heldout_set, train=False, evaluate=True)
    except DataError:
        if not config.data.path or any(example.answer is not None for example in heldout_set):
            raise
        logger.warning(
            "the held-out rows of %s hold no answer for eval.reward_fn=%s to grade: yatt dpo "
            "ranks the held-out pairs and measures no held-out accuracy",
            config.data.path, config.eval.reward_fn,
        )  # fmt: skip
        return False
    return True


def _without_dropout(model: Any) -> None:
    """Dropout off (as TRL's `disable_dropout` does): the policy's log-probs in training mode
    are then those of the reference, computed in eval mode, at step 1."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def _check_settings(config: Config) -> None:
    """Refuse (ConfigError, one line) what `yatt dpo` would otherwise ignore or get wrong:
    control.*, bf16 training weights (`check_job_settings`), the `_UNREAD` ones, and the vllm
    backend (whose engine would keep its memory through training and not see the trained
    weights); and sampled pairs (`data.rejected`) that `check_sampling_settings` refuses, or
    rewards that cannot grade the task."""
    from yatt.run_checks import (
        check_job_settings,
        check_rewards_grade_task,
        check_unread_settings,
    )

    check_job_settings(config, "yatt dpo")
    if config.data.rejected != "slips":
        check_sampling_settings(config)
    check_rewards_grade_task(config, train=config.data.rejected != "slips", evaluate=None)
    if config.eval.n and (config.eval.at_start or config.eval.at_end):
        check_rewards_grade_task(config, train=False, evaluate=True)
    if config.rollout.backend == "vllm":
        raise ConfigError(
            "yatt dpo samples and evaluates with rollout.backend=yatt or hf: vllm's engine "
            "would keep its memory through training and not see the trained weights"
        )
    check_unread_settings(config, "yatt dpo", _UNREAD,
                          "it scores held-out prompts before and after training, at full "
                          "precision, with each pair's prompt run once")  # fmt: skip


def _encode(pairs: list[PreferencePair], tokenizer: Any) -> list[Encoded]:
    """Each pair as token ids: the prompt, and each response followed by EOS (what the policy
    generates after the prompt, and where it stops). ModelError for a tokenizer without EOS."""
    eos = tokenizer.eos_token_id
    if eos is None:
        name = getattr(tokenizer, "name_or_path", "?")
        raise ModelError(f"yatt dpo ends each response with EOS, and tokenizer {name!r} has none")
    encoded = []
    for pair in pairs:
        prompt = tokenizer(pair.prompt, add_special_tokens=False)["input_ids"]
        chosen, rejected = (
            [*tokenizer(text, add_special_tokens=False)["input_ids"], eos]
            for text in (pair.chosen, pair.rejected)
        )
        encoded.append((prompt, chosen, rejected))
    return encoded


def sequence_logprobs(
    model: Any, prompts: list[list[int]], responses: list[list[int]],
    groups: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """log pi(response | prompt) of each row (N,): the sum of its response tokens'
    log-probs, in one forward pass over the rows; rows of one of `groups` (N,), which share
    their prompt, run it once, and a start every prompt shares (a chat template's system
    turn) runs once for all (`response_token_logprobs`: the same log-probs and gradients)."""
    logp, mask = response_token_logprobs(model, prompts, responses, groups, common_start=True)
    return (logp * mask).sum(dim=1)


def _pair_logprobs(model: Any, pairs: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) sequence log-probs (N,) of `pairs`, their 2N rows in one pass that
    runs each pair's prompt once (and the prompts' common start once)."""
    prompts = [prompt for prompt, _, _ in pairs] * 2
    responses = [chosen for _, chosen, _ in pairs] + [rejected for _, _, rejected in pairs]
    groups = torch.arange(len(pairs)).repeat(2)
    logps = sequence_logprobs(model, prompts, responses, groups)
    return logps[: len(pairs)], logps[len(pairs) :]


@torch.no_grad()
def _eval_logprobs(
    model: Any, pairs: list[Encoded], batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's (chosen, rejected) log-probs of every pair, in eval mode, without
    gradients (before the first step: the frozen reference)."""
    training = model.training
    model.eval()
    try:
        parts = [_pair_logprobs(model, pairs[start : start + batch_size])
                 for start in range(0, len(pairs), batch_size)]  # fmt: skip
    finally:
        model.train(training)
    return torch.cat([c for c, _ in parts]), torch.cat([r for _, r in parts])


def _reference(model: Any, tokenizer: Any, encoded: list[Encoded], heldout: list[Encoded],
               heldout_set: list[Any], config: Config, stream: MetricsLogger,
               row0: dict[str, float]) -> _Pairs:  # fmt: skip
    """The reference log-probs of the pairs (the model before training), and step 0's row:
    the pairs, and the held-out prompts scored (`heldout_set`, none where accuracy is not
    measured)."""
    batch = config.algo.micro_batch_size
    start_s = time.perf_counter()
    reference = _eval_logprobs(model, encoded, batch)
    # (the held-out pairs' too, even where this run does not rank them at its end: a resume
    # may ask it to)
    data = _Pairs(encoded, heldout, reference,
                  _eval_logprobs(model, heldout, batch) if heldout else None)  # fmt: skip
    row0 = {**row0, "dpo/pairs": float(len(encoded)), "dpo/heldout_pairs": float(len(heldout)),
            "timing_s/reference": time.perf_counter() - start_s}  # fmt: skip
    if heldout_set and config.eval.at_start:
        row0.update(_heldout_accuracy(model, tokenizer, heldout_set, config))
    stream.log(0, row0)
    return data


def _fit(trained: Any, sampler: Any, done: int, tokenizer: Any, data: _Pairs,
         heldout_set: list[Any], config: Config, stream: MetricsLogger, progress: Any,
         run_dir: Path) -> None:  # fmt: skip
    """Train `trained` (the model, its optimizer and schedule) from step `done` to
    `train.steps`, or until `train.time_limit_s`; then score the held-out prompts again and
    rank the held-out pairs; every row into `stream`, checkpoints as `checkpoint.*` says."""
    from yatt.checkpoint import checkpoint_due
    from yatt.common.seeding import rng_state
    from yatt.common.timers import time_limit_reached
    from yatt.roles.policy import FiniteSteps, step_schedule

    algo, total = config.algo, config.train.steps
    model, optimizer, scheduler = trained.model, trained.optimizer, trained.scheduler
    finite = FiniteSteps("dpo")
    params = optimizer.param_groups[0]["params"]
    encoded, reference = data.train, data.reference
    model.train()
    run_start_s = time.perf_counter()
    for step in range(done + 1, total + 1):
        step_s = time.perf_counter()
        rows = sampler.take(algo.micro_batch_size)
        batch = [encoded[i] for i in rows]
        chosen, rejected = _pair_logprobs(model, batch)
        lengths = (torch.tensor([len(c) for _, c, _ in batch]),
                   torch.tensor([len(r) for _, _, r in batch]))  # fmt: skip
        loss, reward_chosen, reward_rejected = dpo_loss(
            chosen, rejected, reference[0][rows], reference[1][rows], algo.dpo_beta,
            algo.dpo_loss, algo.dpo_label_smoothing, lengths,
        )  # fmt: skip
        chosen_nll = -chosen.sum() / lengths[0].sum()  # the chosen responses' NLL per token
        if algo.dpo_sft_weight:
            loss = loss + algo.dpo_sft_weight * chosen_nll
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = optimizer.param_groups[0]["lr"]  # this step's rate, before the schedule moves
        finite.clip_and_step(optimizer, params, config.optim.grad_clip)
        step_schedule(scheduler)
        margin = reward_chosen - reward_rejected
        row = {"dpo/loss": float(loss.detach()), "dpo/accuracy": float((margin > 0).float().mean()),
               "dpo/margin": float(margin.mean()), "dpo/reward_chosen": float(reward_chosen.mean()),
               "dpo/reward_rejected": float(reward_rejected.mean()),
               "dpo/chosen_nll": float(chosen_nll.detach()), "dpo/lr": lr,
               "timing_s/step": time.perf_counter() - step_s}  # fmt: skip
        out_of_time = time_limit_reached(config.train.time_limit_s, run_start_s, step, total)
        if (step == total or out_of_time) and config.eval.at_end:
            if data.heldout_reference is not None:
                row.update(_heldout_pairs(model, data.heldout, data.heldout_reference, config))
            if heldout_set:
                row.update(_heldout_accuracy(model, tokenizer, heldout_set, config))
        stream.log(step, row)
        if progress is not None:
            progress(step, total, row)
        if checkpoint_due(config, step, out_of_time):
            kept = {"sampler": sampler.state_dict(), "rng": rng_state(), **data.state()}
            trained.save(run_dir, step, config, tokenizer, kept)
        if out_of_time:
            break
    model.eval()


def pair_sampler(config: Config, count: int) -> Any:
    """The order the training pairs are taken in: `yatt.data.PromptSampler` over `count`
    pairs, seeded by `data.seed + train.seed` (each step takes `algo.micro_batch_size`)."""
    from yatt.data import PromptSampler

    return PromptSampler(count, config.data.seed + config.train.seed)


@torch.no_grad()
def _heldout_pairs(model: Any, pairs: list[Encoded], reference: tuple[torch.Tensor, torch.Tensor],
                   config: Config) -> dict[str, float]:  # fmt: skip
    """The share of held-out pairs whose implicit rewards rank them right, and their mean
    margin (eval mode, no gradients)."""
    chosen, rejected = _eval_logprobs(model, pairs, config.algo.micro_batch_size)
    beta = config.algo.dpo_beta
    margin = beta * ((chosen - reference[0]) - (rejected - reference[1]))
    return {"dpo/heldout_accuracy": float((margin > 0).float().mean()),
            "dpo/heldout_margin": float(margin.mean())}  # fmt: skip


def _heldout_accuracy(model: Any, tokenizer: Any, examples: list[Any],
                      config: Config) -> dict[str, float]:  # fmt: skip
    """`eval/accuracy` of greedy answers to `examples`, as `yatt train` measures it (a fresh
    engine: it reads the weights as they are now)."""
    from yatt.evaluate import evaluate_run
    from yatt.rollout import make_engine

    start_s = time.perf_counter()
    training = model.training
    model.eval()
    try:
        engine = make_engine(config.rollout.backend, model, tokenizer)
        accuracy, _ = evaluate_run(engine, tokenizer, examples, config)
    finally:
        model.train(training)
    eval_s = time.perf_counter() - start_s
    logger.info("held-out accuracy %.1f%% on %d (%.1f s)", 100 * accuracy, len(examples), eval_s)
    return {"eval/accuracy": accuracy, "eval/problems": float(len(examples)),
            "timing_s/eval": eval_s}  # fmt: skip
