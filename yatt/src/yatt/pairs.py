"""Preference pairs for `yatt rm` and `yatt dpo`: a prompt as the policy sees it, a chosen
and a rejected response.

Where they come from (`data.*`): a file's rows (`data.path`: `prompt`, `chosen`, `rejected`), or
a task (`data.task`), `data.rejected` saying how: the reference answer over a nearby wrong
number ("slips"); the model's own worst completion under its best one, or under the reference
answer where none scores better than another ("samples": `rollout.n_samples` completions per
prompt, sampled as `rollout.*` says and scored by `reward.fns`); or a pair of each ("both").
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from yatt.config import Config
from yatt.errors import ConfigError, DataError

__all__ = [
    "PreferencePair",
    "check_sampled_pairs",
    "check_sampling_settings",
    "make_pairs",
    "pair_examples",
    "pairs_of",
    "preference_pairs",
    "preferred_responses",
    "reference_answer",
    "sample_pairs",
    "sampled_responses",
]

logger = logging.getLogger(__name__)

Sampled = tuple[str, str] | None  # a prompt's pair from its samples (chosen, rejected), or none
Responses = tuple[str, str]  # a pair's (chosen, rejected) responses

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
) -> tuple[list[Sampled], int]:
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
    pairs: list[Sampled] = []
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
        references = [reference_answer(example) for example in chunk]
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


def reference_answer(example: Any) -> str:
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


def check_sampling_settings(config: Config) -> None:
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


def sample_pairs(
    causal_lm: Any, tokenizer: Any, train_set: list[Any], heldout_set: list[Any], config: Config,
    prefix: str,
) -> tuple[list[Sampled], list[Sampled], dict[str, float]]:  # fmt: skip
    """The sampled pairs of the training and held-out prompts, and their step-0 metrics (none
    with data.rejected=slips): `prefix` + "samples_best", the share of the samples scored as
    high as the reference answer, and + "sample_pairs", the pairs they gave."""
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
    return train, heldout, {f"{prefix}samples_best": (best + heldout_best) / total,
                            f"{prefix}sample_pairs": float(made)}  # fmt: skip


def check_sampled_pairs(
    config: Config,
    train: list[Sampled],
    heldout: list[Sampled],
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


def pairs_of(
    examples: list[Any], tokenizer: Any, config: Config,
    responses: list[tuple[str, str]], sampled: list[Sampled],
) -> list[PreferencePair]:  # fmt: skip
    """The pairs of `examples`: those of `responses` (file rows or slips), then those of the
    sampled completions that gave one."""
    pairs = preference_pairs(examples, tokenizer, config, responses) if responses else []
    if sampled:
        kept = [(example, pair) for example, pair in zip(examples, sampled, strict=True) if pair]
        pairs += preference_pairs([example for example, _ in kept], tokenizer, config,
                                  [pair for _, pair in kept])  # fmt: skip
    return pairs


def pair_examples(config: Config, command: str) -> tuple[list[Any], list[Any], list[Responses]]:
    """What a pair job (`command`: "yatt rm", "yatt dpo") reads: the training examples, the
    held-out ones (the first `eval.n`, where it scores them before or after training; none
    otherwise) and the (chosen, rejected) responses of file rows or slips, all examples' in
    order (none with data.rejected=samples). Bad rows are refused here, before a run folder
    is claimed.

    Raises:
        DataError: held-out examples to score and none held out; a row without both responses,
            or without a reference answer where sampled pairs need one.
    """
    from yatt.builders import build_data

    train_set, heldout_set = build_data(config.data)
    scored = config.eval.n and (config.eval.at_start or config.eval.at_end)
    if not heldout_set and scored:
        raise DataError(
            f"{command} scores the pairs of eval.n={config.eval.n} held-out prompts, but data "
            "holds none out (set data.n_heldout, or eval.n=0)"
        )
    heldout_set = heldout_set[: config.eval.n] if scored else []
    examples, kind = [*train_set, *heldout_set], config.data.rejected
    responses = preferred_responses(examples, config) if kind != "samples" else []
    if kind != "slips":
        list(map(reference_answer, examples))
    return train_set, heldout_set, responses


def make_pairs(
    causal_lm: Any, tokenizer: Any, examples: tuple[list[Any], list[Any], list[Responses]],
    config: Config, prefix: str,
) -> tuple[list[PreferencePair], list[PreferencePair], dict[str, float]]:  # fmt: skip
    """The training and held-out pairs of `pair_examples`' `examples`, sampling `causal_lm`'s
    completions where data.rejected asks for them, and the step-0 metrics of that sampling
    (`sample_pairs`, under `prefix`).

    Raises:
        DataError: sampled pairs that leave nothing to train on or to score
            (`check_sampled_pairs`).
    """
    train_set, heldout_set, responses = examples
    train_sampled, heldout_sampled, row0 = sample_pairs(
        causal_lm, tokenizer, train_set, heldout_set, config, prefix
    )
    split = len(train_set)
    pairs = pairs_of(train_set, tokenizer, config, responses[:split], train_sampled)
    heldout = pairs_of(heldout_set, tokenizer, config, responses[split:], heldout_sampled)
    check_sampled_pairs(config, train_sampled, heldout_sampled)
    logger.info("%d training pairs, %d held out; the first prefers %r over %r", len(pairs),
                len(heldout), pairs[0].chosen, pairs[0].rejected)  # fmt: skip
    return pairs, heldout, row0
