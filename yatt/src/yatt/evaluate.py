"""Held-out evaluation: greedy decoding, then the task's reward function as the judge.

Accuracy = fraction of examples whose greedy completion scores >= 1 (e.g. `math_answer`).
A reward function that fails on an example raises RewardError naming the example's source.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["evaluate_engine", "evaluate_run", "examples_due"]

logger = logging.getLogger(__name__)


def examples_due(cfg: Any, step: int, total: int, out_of_time: bool = False) -> int:
    """How many held-out problems to evaluate once step `step` of `total` is done (0: none).

    `cfg` is an EvalConfig. The final evaluation (`at_end`: after the last step, or after the
    step that reached `train.time_limit_s`) takes all `n`; a periodic one (every `every`
    steps) the first `n_periodic` of them (0, or more than `n`: all `n`), unless it is also
    the last step.
    """
    if cfg.n == 0:
        return 0
    final = step == total or out_of_time
    if not (cfg.every > 0 and step % cfg.every == 0) and not (final and cfg.at_end):
        return 0
    return cfg.n if final else min(cfg.n_periodic or cfg.n, cfg.n)  # (never more than n)


def evaluate_engine(
    engine: Any,
    tokenizer: Any,
    examples: list[Any],
    *,
    batch_size: int = 64,
    max_new_tokens: int = 16,
    reward_fn: str = "math_answer",
    use_chat_template: bool = True,
    numbers: Sequence[int] | None = None,
    stop: Sequence[str] = (),
) -> tuple[float, list[dict[str, Any]]]:
    """(accuracy in [0, 1], one record per example) for greedy completions of `examples`,
    each ending where training's do (`stop`: the run's `rollout.stop` strings; a completion
    that ran on past one could score an answer made up after it).

    `numbers`: each example's position in the whole held-out set, for error messages (a data-
    parallel rank scores every world-th one); by default 0, 1, 2, ...
    Raises ConfigError for no examples, RewardError when `reward_fn` fails on one.
    """
    from yatt.data import render_prompt
    from yatt.errors import ConfigError
    from yatt.rewards import get_reward_fn
    from yatt.rollout import SamplingParams

    if not examples:
        raise ConfigError("nothing to evaluate: no held-out examples (data.n_heldout=0?)")
    score_fn = get_reward_fn(reward_fn, scorers=False)  # called row by row
    params = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=0.0, greedy=True, stop=tuple(stop)
    )
    records: list[dict[str, Any]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        prompts = [render_prompt(e, tokenizer, use_chat_template) for e in chunk]
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completions = engine.generate(prompt_ids, params)
        for index, (example, prompt, completion) in enumerate(zip(chunk, prompts, completions)):
            number = start + index if numbers is None else numbers[start + index]
            where = example.source or f"held-out example {number}"
            score = _score(score_fn, reward_fn, prompt, completion.text, example, where)
            records.append(
                {
                    "prompt": prompt,
                    "completion": completion.text,
                    "answer": example.answer,
                    "correct": score >= 1.0,
                }
            )
    accuracy = sum(r["correct"] for r in records) / len(records)
    return accuracy, records


def evaluate_run(
    engine: Any, tokenizer: Any, examples: list[Any], config: Any,
    numbers: Sequence[int] | None = None,
) -> tuple[float, list[dict[str, Any]]]:  # fmt: skip
    """`evaluate_engine` with a run's settings (`config`, a Config): eval.batch_size,
    eval.max_new_tokens and eval.reward_fn, the run's stop strings (rollout.stop) and its
    prompt rendering (data.use_chat_template)."""
    cfg = config.eval
    return evaluate_engine(
        engine, tokenizer, examples, batch_size=cfg.batch_size,
        max_new_tokens=cfg.max_new_tokens, reward_fn=cfg.reward_fn, stop=config.rollout.stop,
        use_chat_template=config.data.use_chat_template, numbers=numbers,
    )  # fmt: skip


def _score(score_fn: Any, name: str, prompt: str, text: str, example: Any, where: str) -> float:
    """The score of one completion; a RewardError naming the function and the example when it
    raises or returns no finite number (a NaN or a bool was counted as wrong or right)."""
    from yatt.rewards import RewardError, checked_score

    try:
        value = score_fn(prompt, text, **example.reward_fields())
    except Exception as exc:  # a reward function is user code: name it and the example
        detail = " ".join(str(exc).split())
        raise RewardError(
            f"eval reward {name!r} raised {type(exc).__name__}: {detail} on {where}"
        ) from exc
    return checked_score(value, f"eval reward {name!r}", where)
