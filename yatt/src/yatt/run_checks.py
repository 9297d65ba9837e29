"""Checks of a run's settings against what will use them, made where a run starts (the
trainer, the distributed controllers, SFT, `yatt eval`), not when a config is built: the same
config may serve tools that read other parts of it (`yatt eval` loads bf16 weights, SFT needs
no reward, an eval-only run needs no training reward).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from yatt.config import Config, changed_settings
from yatt.data import TASK_PROVIDES
from yatt.errors import ConfigError, DataError
from yatt.rewards import NEED_MEANINGS, NEEDS_ANSWER, REWARD_NEEDS
from yatt.rewards.math import answer_value

__all__ = [
    "check_budgets_fit_model",
    "check_eval_data",
    "check_job_settings",
    "check_no_control_settings",
    "check_no_pair_settings",
    "check_prompts_fit_model",
    "check_rewards_grade_task",
    "check_rows_have_answers",
    "check_short_job_settings",
    "check_training_dtype",
    "warn_if_nothing_kept",
]

logger = logging.getLogger(__name__)


def check_rewards_grade_task(
    config: Config, *, train: bool = True, evaluate: bool | None = False
) -> None:
    """Refuse a built-in reward that cannot grade the rows of the built-in task `data.task`
    (ConfigError, one line naming both settings and the rewards that fit), so that a run does
    not fail (or score every completion 0) only at its first reward or evaluation: a reward
    that compares with a numeric answer on countdown (an expression, one of many correct),
    reasoning_gym's checker on addition rows.

    What is checked is what the caller will use: `reward.fns` with `train` (an RL run), and
    `eval.reward_fn` when the run evaluates (`eval.enabled`) or with `evaluate` (`yatt eval`),
    never with `evaluate=None` (`yatt rm`, whose held-out scores are of pairs); SFT uses
    neither. Not checked: rows from a file (`data.path`: their fields are the
    user's), rewards given as "package.module:function", and names registered without a
    `REWARD_NEEDS` entry.
    """
    if config.data.path:
        return
    task = config.data.task
    provides = TASK_PROVIDES.get(task, frozenset())
    settings = [("reward.fns", name) for name in config.reward.fns] if train else []
    if evaluate or (evaluate is not None and config.eval.enabled):
        settings.append(("eval.reward_fn", config.eval.reward_fn))
    for key, name in settings:
        need = None if ":" in name else REWARD_NEEDS.get(name)
        if need is None or need in provides:
            continue
        fits = [reward for reward, needs in REWARD_NEEDS.items() if needs in provides]
        raise ConfigError(
            f"{key}={name!r} cannot grade data.task={task!r}: {name} needs "
            f"{NEED_MEANINGS[need]}, which {task} rows lack; rewards for {task}: "
            f"{', '.join(fits)} (or your own 'package.module:function')"
        )


def check_rows_have_answers(
    config: Config,
    train_rows: Sequence[Any],
    heldout_rows: Sequence[Any],
    *,
    train: bool = True,
    evaluate: bool = False,
) -> None:
    """With rows from a file (`data.path`, whose fields are the user's), refuse the first row a
    built-in reward would grade against an `answer` it lacks: DataError naming the row's
    file:line, before any work, not at that row's first reward (maybe hours into a run, and
    after `logging.overwrite` deleted the previous one). Which rewards and rows: as in
    `check_rewards_grade_task` (`reward.fns` over the training rows with `train`,
    `eval.reward_fn` over the held-out ones when the run evaluates or with `evaluate`)."""
    if not config.data.path:
        return  # generated tasks carry their answers
    uses = [("reward.fns", name, train_rows) for name in config.reward.fns] if train else []
    if config.eval.enabled or evaluate:
        uses.append(("eval.reward_fn", config.eval.reward_fn, heldout_rows))
    for key, name, rows in uses:
        if name == "reasoning_gym":  # scored by the dataset's own checker, from the row
            for row in rows:
                missing = [f for f in ("rg_dataset", "metadata") if f not in row.fields]
                if missing:
                    raise DataError(
                        f"{row.source or config.data.path}: {key}={name!r} scores with the "
                        f"reasoning_gym dataset's checker, and this row lacks {missing} (rows "
                        "from data.task=... carry them; use a reward of your own otherwise)"
                    )
        if name not in NEEDS_ANSWER:
            continue
        fix = (
            "set eval.reward_fn=package.module:function to grade otherwise, or eval.n=0"
            if key == "eval.reward_fn"
            else "give each row an answer, or use a reward of your own in reward.fns"
        )
        for row in rows:
            if row.answer is None or not str(row.answer).strip():
                raise DataError(
                    f"{row.source or config.data.path}: {key}={name!r} grades each row against "
                    f"its 'answer' field, which this row lacks or leaves blank ({fix})"
                )
            if name == "math_answer":  # compares numbers: an answer must read as one
                try:
                    answer_value(row.answer)
                except ValueError as error:
                    raise DataError(
                        f"{row.source or config.data.path}: {key}={name!r} compares numbers, "
                        f"and this row's {error} (math_boxed compares text too)"
                    ) from None


def try_rewards_once(combined: Any, prompt: str, example: Any) -> None:
    """Call a run's rewards once, on its first training prompt (rendered) with that row's
    answer as the completion, before `logging.overwrite` deletes the previous run: a reward
    that fails on every call (a dependency it cannot import, a None it returns) then fails
    with the previous run kept, not after it was deleted. Raises what the reward raises (a
    one-line RewardError naming it)."""
    row = example.reward_fields()
    combined([prompt], ["" if example.answer is None else str(example.answer)], [row])


def check_eval_data(config: Config) -> None:
    """Raise ConfigError if a run would evaluate with no held-out prompts (the trainer and the
    distributed controllers call it before any work).

    Not part of Config validation: `yatt eval`, SFT and other tools load configs whose eval.*
    they read, or do not use, with any held-out split.
    """
    if config.data.n_heldout == 0 and config.eval.enabled:
        raise ConfigError(
            f"data.n_heldout=0 leaves nothing to evaluate (eval.n={config.eval.n}): set eval.n=0 "
            "(or disable eval: eval.at_start=false eval.at_end=false eval.every=0)"
        )


def check_training_dtype(config: Config) -> None:
    """Raise ConfigError if a training run (RL or SFT) would train low-precision weights.

    AdamW updates (lr x a normalised step, ~1e-6) are far below bf16's resolution near a
    weight (~4e-3 relative), so nearly all of them round away and the run silently does not
    train. Not part of Config validation: `yatt eval` loads bf16 weights for inference.
    """
    if config.model.dtype != "float32":
        raise ConfigError(
            f"model.dtype={config.model.dtype} would train {config.model.dtype} weights, whose "
            "small AdamW updates round away (the run would barely train); train with "
            "model.dtype=float32, and for bf16 speed sample with rollout.dtype=bfloat16 and/or "
            "compute in bf16 with train.bf16_autocast=true (model.dtype=bfloat16 is for yatt eval)"
        )


def warn_if_nothing_kept(config: Config) -> None:
    """Warn (one line, at the start) when an RL run will keep no checkpoint, so no trained
    policy: `checkpoint.every=0` and `checkpoint.at_end=false`, the defaults."""
    if not config.checkpoint.every and not config.checkpoint.at_end:
        logger.warning(
            "this run keeps no checkpoint (checkpoint.every=0, checkpoint.at_end=false): the "
            "trained policy is lost when it ends; set checkpoint.at_end=true to keep it"
        )


def check_job_settings(config: Config, command: str) -> None:
    """Refuse, before any work, what a training `command` ("yatt train", "yatt sft", "yatt rm"
    or "yatt dpo") would get wrong or ignore: bf16 training weights (`check_training_dtype`);
    control.* for the one-process jobs, SFT, reward models and DPO
    (`check_no_control_settings`); and the preference-pair settings for the jobs that read
    none (`check_no_pair_settings`)."""
    check_training_dtype(config)
    if command in ("yatt sft", "yatt rm", "yatt dpo"):
        check_no_control_settings(config, command)
    check_no_pair_settings(config, command)


def check_short_job_settings(
    config: Config, command: str, unread: Sequence[str], does: str
) -> None:
    """Refuse, for a `command` that keeps no checkpoints (`yatt rm`, `yatt dpo`: a run is
    short, a stopped one starts again), checkpoint.resume and checkpoint.every, and any of the
    dotted settings `unread` changed from its default (`does` says what it does instead)."""
    if config.checkpoint.resume or config.checkpoint.every:
        raise ConfigError(
            f"{command} keeps no checkpoints (a run is short; a stopped one starts again): drop "
            "checkpoint.resume and checkpoint.every"
        )
    check_unread_settings(config, command, unread, does)


def check_unread_settings(config: Config, command: str, unread: Sequence[str], does: str) -> None:
    """Refuse any of the dotted settings `unread` changed from its default, which `command`
    does not act on (`does` says what it does instead)."""
    changed = [
        dotted
        for dotted in unread
        if dotted.split(".")[1] in changed_settings(getattr(config, dotted.split(".")[0]))
    ]
    if changed:
        them = "them" if len(changed) > 1 else "it"
        raise ConfigError(f"{command} does not act on {', '.join(changed)} ({does}): drop {them}")


# algo.*, read by yatt dpo alone
DPO_SETTINGS = ("dpo_beta", "dpo_loss", "dpo_label_smoothing", "dpo_sft_weight")


def check_no_pair_settings(config: Config, command: str) -> None:
    """Refuse `data.rejected` (how `yatt rm` and `yatt dpo` make their pairs) and DPO's
    `algo.dpo_*` settings for a `command` that reads them not, rather than ignore them."""
    if config.data.rejected != "slips" and command not in ("yatt rm", "yatt dpo"):
        raise ConfigError(
            f"{command} makes no preference pairs and reads no data.rejected (a setting of yatt "
            f"rm and yatt dpo): drop data.rejected={config.data.rejected}"
        )
    changed = [name for name in DPO_SETTINGS if name in changed_settings(config.algo)]
    if changed and command != "yatt dpo":
        given = " ".join(f"algo.{name}={getattr(config.algo, name)}" for name in changed)
        raise ConfigError(f"{command} reads no algo.dpo_* setting (yatt dpo's): drop {given}")


def check_no_control_settings(config: Config, command: str) -> None:
    """Refuse control.* settings for a `command` that runs in one process and reads none of
    them (SFT), rather than ignore them silently (`yatt train` refuses those it would not use)."""
    changed = [f"control.{name}" for name in changed_settings(config.control)]
    if changed:
        raise ConfigError(f"{command} runs in one process and reads no control.* key: {changed}")


def check_budgets_fit_model(config: Config, model: Any, *, train: bool = True,
                            length_schedule: Sequence[str] | None = None) -> None:  # fmt: skip
    """Refuse a response budget that leaves no room for a prompt in the model's positions
    (`max_position_embeddings`): a rotary model past it samples garbage, and the sampler's
    cache for it is wasted memory. Checked once the model is loaded: `rollout.max_new_tokens`
    and the largest budget of the length schedule the run uses (`length_schedule`, as a
    controller's ControlConfig has it; default `config.control`'s) with `train`,
    `eval.max_new_tokens` when the run evaluates (always for `yatt eval`, which passes
    train=False)."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(positions, int) or positions <= 0:
        return  # a model that states no limit
    budgets = {}
    if train:
        budgets["rollout.max_new_tokens"] = config.rollout.max_new_tokens
        schedule = _schedule_budgets(config, length_schedule)
        if schedule:
            budgets["control.length_schedule"] = max(schedule)
    if not train or config.eval.enabled:
        budgets["eval.max_new_tokens"] = config.eval.max_new_tokens
    window = None
    if config.rollout.backend == "yatt" and hasattr(model.config, "get_text_config"):
        from yatt.rollout.forward import sliding_window

        window = sliding_window(model.config)
    for key, budget in budgets.items():
        if budget >= positions:
            raise ConfigError(
                f"{key} asks for {budget} new tokens, but the model ({config.model.path}) has "
                f"{positions} positions (max_position_embeddings) for prompt and response"
            )
        if window is not None and budget >= window:
            raise ConfigError(
                f"{key} asks for {budget} new tokens, but the model ({config.model.path}) "
                f"attends within a sliding window of {window} tokens, which yatt's rollout "
                "engine does not apply; use rollout.backend=hf or a smaller budget"
            )


def check_prompts_fit_model(
    config: Config, model: Any, tokenizer: Any, train_set: Sequence[Any],
    heldout_set: Sequence[Any], *, rendered: Sequence[str] | None = None,
    length_schedule: Sequence[str] | None = None,
) -> None:  # fmt: skip
    """Refuse, before the first step, a training prompt (or a held-out one the run evaluates)
    that with its response budget needs more positions than the model has: found only when
    the sampler first drew it, it ended the run hours in, and the same step again on every
    resume (the draw order is fixed). `rendered`: the training prompts as the model sees them,
    where the caller has them (else rendered here); budgets as in `check_budgets_fit_model`.
    """
    from yatt.data import render_prompt
    from yatt.rollout.engine import model_positions

    positions = model_positions(model)
    if positions is None:
        return
    use_template = config.data.use_chat_template
    budget = max([config.rollout.max_new_tokens, *_schedule_budgets(config, length_schedule)])
    checks = [("train", train_set, rendered, budget, "the response budget")]
    if config.eval.enabled:
        checks.append(("held-out", heldout_set[: config.eval.n], None, config.eval.max_new_tokens,
                       "eval.max_new_tokens"))  # fmt: skip
    for kind, examples, texts, tokens_out, what in checks:
        if not examples:
            continue
        if texts is None:
            texts = [render_prompt(example, tokenizer, use_template) for example in examples]
        lengths = [
            len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        ]
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        if lengths[longest] + tokens_out > positions:
            where = examples[longest].source or f"{kind} prompt {longest}"
            raise ConfigError(
                f"{where}: the prompt has {lengths[longest]} tokens and, with {what} of "
                f"{tokens_out}, needs {lengths[longest] + tokens_out} positions; the model "
                f"({config.model.path}) has {positions} (max_position_embeddings): shorten the "
                "prompt or the budget"
            )


def _schedule_budgets(config: Config, length_schedule: Sequence[str] | None) -> list[int]:
    """The response budgets of a length schedule (``step:tokens`` items; default
    ``config.control``'s)."""
    if length_schedule is None:
        length_schedule = config.control.length_schedule
    return [int(item.partition(":")[2]) for item in length_schedule]
