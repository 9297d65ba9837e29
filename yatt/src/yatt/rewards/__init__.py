"""Rewards: rule functions, a registry, and CombinedReward (weighted sum with per-part metrics).

A reward setting names a registered function (`REWARD_FNS`) or a user's own, as
"package.module:function" (`load_callable`). A reward function is a plain callable
`fn(prompt: str, completion: str, **fields) -> float`. `fields` are the dataset row's fields
(`PromptExample.reward_fields()`: `answer` plus every extra column), so a function must accept
`**fields` it does not use. It returns a finite number; one that raises or returns anything else
makes CombinedReward raise RewardError naming fn and row. Batch scorers (the Bradley–Terry model
in `rewards.model`, the LLM judge in `rewards.judge`) instead provide
`score_batch(prompts, completions, rows) -> list[float]` and a `name`.
"""

import logging
import numbers
from collections.abc import Callable, Mapping, Sequence
from math import isfinite  # not `import math`: the submodule yatt.rewards.math shadows it
from pathlib import Path
from typing import Any

from yatt.errors import ConfigError, YattError
from yatt.rewards.math import (
    format_reward,
    math_answer,
    math_boxed,
    reasoning_gym_reward,
)

__all__ = [
    "NEEDS_ANSWER",
    "NEED_MEANINGS",
    "REWARD_ABS_MAX",
    "REWARD_FNS",
    "REWARD_NEEDS",
    "CombinedReward",
    "RewardError",
    "RewardFn",
    "checked_score",
    "format_reward",
    "get_reward_fn",
    "is_batch_scorer",
    "load_callable",
    "math_answer",
    "math_boxed",
    "reasoning_gym_reward",
]

logger = logging.getLogger(__name__)

RewardFn = Callable[..., float]


class RewardError(YattError):
    """A reward function raised, or returned something other than a finite number; `row` is
    the batch row it failed on, when known (the trainer names that prompt's source)."""

    def __init__(self, message: str, row: int | None = None) -> None:
        super().__init__(message)
        self.row = row


def _no_options(fn: RewardFn) -> Callable[..., RewardFn]:
    def factory(**options: Any) -> RewardFn:
        if options:
            raise ConfigError(f"reward {fn.__name__!r} takes no options, got {sorted(options)}")
        return fn

    return factory


# name -> factory(**options) -> reward fn. "format" is never on unless a config names it.
REWARD_FNS: dict[str, Callable[..., RewardFn]] = {
    "math_answer": _no_options(math_answer),
    "math_boxed": _no_options(math_boxed),
    "reasoning_gym": _no_options(reasoning_gym_reward),
    "format": format_reward,
}


# name -> what the registered reward grades against, one of the names a built-in task's rows
# provide (yatt.data.TASK_PROVIDES): config loading refuses a built-in task whose rows lack it.
# "format" (default pattern) rewards a completion that is just a number. A name registered
# without an entry here, like a "package.module:function" reward, is never refused.
REWARD_NEEDS: dict[str, str] = {
    "math_answer": "number",
    "math_boxed": "number",
    "reasoning_gym": "reasoning_gym",
    "format": "number",
}
NEED_MEANINGS: dict[str, str] = {
    "number": "answers that are numbers, one correct per problem",
    "reasoning_gym": "the rg_dataset and metadata fields of a reasoning_gym task's rows",
}
# The registered rewards that grade against a row's `answer` field (they raise on a row
# without one; yatt.run_checks refuses such rows from a file when the data loads).
NEEDS_ANSWER = frozenset({"math_answer", "math_boxed"})
# The largest reward magnitude taken (a score, or a weighted total). Advantages are computed in
# float32, whose squares overflow past ~1.8e19: a finite reward of 1e38 would train on inf.
REWARD_ABS_MAX = 1e15


def get_reward_fn(name: str, *, scorers: bool = True, **options: Any) -> RewardFn:
    """The registered reward function `name` built with `options`, or the function (or, with
    `scorers`, the batch scorer) a "package.module:function" path names; ConfigError lists
    the names."""
    if ":" in name:
        if options:
            raise ConfigError(f"reward {name!r} takes no options, got {sorted(options)}")
        return load_callable(name, scorers=scorers)
    if name not in REWARD_FNS:
        raise ConfigError(
            f"unknown reward {name!r}; valid: {sorted(REWARD_FNS)} or 'package.module:function'"
        )
    try:
        return REWARD_FNS[name](**options)
    except TypeError as exc:
        raise ConfigError(f"bad options {options} for reward {name!r}: {exc}") from exc


def is_batch_scorer(name: str) -> bool:
    """Whether the reward setting `name` is a batch scorer (an object with `score_batch`,
    such as a GenerativeJudge or a reward model: a model of its own) rather than a rule
    function. Registered rewards are all functions; a "package.module:name" path is imported
    (config loading imported it already)."""
    return ":" in name and hasattr(load_callable(name), "score_batch")


def load_callable(path: str, key: str = "reward", *, scorers: bool = True):
    """The reward named by "package.module:name" (`key` names the setting in errors): a
    function, or a batch scorer (an object with `score_batch`, such as a GenerativeJudge the
    module builds), which CombinedReward calls once per batch; `scorers=False` where the
    reward is called row by row (`eval.reward_fn`).

    Raises:
        ConfigError (one line) if the path is malformed, importing the module fails for any
        reason (missing, SyntaxError, an exception raised at import), or the name is missing
        or neither callable nor a batch scorer.
    """
    import importlib

    module_name, _, attr = path.partition(":")
    if not (module_name and attr.isidentifier()):
        raise ConfigError(f"{key}={path!r}: expected 'package.module:function'")
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        dotted = module_name.removesuffix(".py").replace("\\", "/").strip("/").replace("/", ".")
        raise ConfigError(
            f"{key}={path!r} names a file; name the module as Python imports it, e.g. "
            f"'{dotted}:{attr}' (with the folder holding {dotted.partition('.')[0]} on "
            "PYTHONPATH)"
        )
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # user code: what its import raises, one line
        detail = " ".join(str(exc).split())
        hint = ""
        top = module_name.partition(".")[0]
        here = Path(top + ".py").is_file() or Path(top, "__init__.py").is_file()
        if isinstance(exc, ModuleNotFoundError) and exc.name == top and here:
            # `python -m yatt` puts the current folder on the import path; the `yatt` command
            # does not.
            hint = f"; {top} is in the current folder, which is not on the import path: run "
            hint += "with PYTHONPATH=. (or install it)"
        raise ConfigError(
            f"{key}={path!r}: cannot import {module_name!r} ({type(exc).__name__}: {detail}){hint}"
        ) from None
    function = getattr(module, attr, None)
    if function is None:
        raise ConfigError(f"{key}={path!r}: module {module_name!r} has no {attr!r}")
    if callable(function):
        return function
    kind = type(function).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if not scorers:
        raise ConfigError(
            f"{key}={path!r}: {attr!r} is not callable (it is {article} {kind}); this setting "
            "calls its reward as fn(prompt, completion, **row)"
        )
    if not callable(getattr(function, "score_batch", None)):
        raise ConfigError(
            f"{key}={path!r}: {attr!r} is not callable (it is {article} {kind}), nor a batch "
            "scorer with a score_batch method"
        )
    return function


def checked_score(value: Any, label: str, where: str, row: int | None = None) -> float:
    """`value` as a float, or a RewardError naming `label` (``reward 'name'``) and `where`
    (``row 3``); numpy and 0-d torch scalars count as numbers (`numbers.Real`, or a `.item()`
    that is one), bools do not, nor do NaN and infinities."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy / torch scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = type(value).__name__
        raise RewardError(f"{label} returned {value!r:.80} ({kind}) on {where}; need a number", row)
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        number = float("inf")
    if not isfinite(number):
        raise RewardError(f"{label} returned {value!r:.80} on {where}; need a finite number", row)
    if abs(number) > REWARD_ABS_MAX:
        raise RewardError(
            f"{label} returned {number:g} on {where}; need a number within "
            f"+-{REWARD_ABS_MAX:g} (advantages are computed in float32)",
            row,
        )
    return number


def _component_name(component: Any) -> str:
    """A component's metric name: its `name` attribute, function name, or class name."""
    for attribute in ("name", "__name__"):
        if isinstance(getattr(component, attribute, None), str):
            return getattr(component, attribute)
    return type(component).__name__


def _declared_metrics(scorer: Any) -> tuple[str, ...]:
    """A batch scorer's `metric_names` (the `last_metrics` keys it sets on every call)."""
    names = getattr(scorer, "metric_names", ())
    if not isinstance(names, tuple | list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(
            f"{_component_name(scorer)}.metric_names must be a tuple of names, got {names!r:.80}"
        )
    clash = [name for name in names if name.startswith("reward/")]
    if clash:
        raise ConfigError(
            f"{_component_name(scorer)}.metric_names {clash}: reward/* names are the "
            "combined reward's own"
        )
    return tuple(names)


class CombinedReward:
    """Weighted sum of reward components; `last_metrics` holds each part's mean of the last call.

    components: (fn or registry name or batch scorer, weight) pairs. Metric keys:
    `reward/<name>/mean` per component (unweighted), `reward/total/mean`, plus any batch
    scorer's own `last_metrics` (the judge's `judge/parse_failures`). `counted_metrics` lists
    the names of those that the scorers declare in a `metric_names` attribute: counts of one
    call, which the distributed controllers add up over every call of a step (they log only
    declared ones, since every rank must sum the same keys).
    """

    def __init__(self, components: Sequence[tuple[RewardFn | str | Any, float]]) -> None:
        if not components:
            raise ConfigError("CombinedReward needs at least one (reward, weight) component")
        self.parts: list[tuple[str, Any, float]] = []
        for component, weight in components:
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise ConfigError(f"reward weight must be a number, got {weight!r}")
            fn = get_reward_fn(component) if isinstance(component, str) else component
            named = isinstance(component, str) and ":" not in component  # a registered name
            name = component if named else _component_name(fn)
            if name in {part[0] for part in self.parts}:
                name = f"{name}_{len(self.parts)}"
            self.parts.append((name, fn, float(weight)))
        self.last_metrics: dict[str, float] = {}
        self.counted_metrics = tuple(
            dict.fromkeys(key for _, fn, _ in self.parts for key in _declared_metrics(fn))
        )

    def _score_part(self, name: str, fn: Any, prompts, completions, rows) -> list[float]:
        if hasattr(fn, "score_batch"):
            try:
                values = fn.score_batch(prompts, completions, rows)
            except RewardError:
                raise
            except (Exception, SystemExit) as exc:  # a user-supplied scorer: name it
                detail = " ".join(str(exc).split())
                raise RewardError(f"reward {name!r} raised {type(exc).__name__}: {detail}") from exc
            sized = hasattr(values, "__len__") and hasattr(values, "__getitem__")
            if not sized or isinstance(values, Mapping | str | bytes):  # None, a generator ...
                raise RewardError(
                    f"reward {name!r} returned {type(values).__name__} {values!r:.60}; need a "
                    f"list of {len(prompts)} numbers, one per row"
                )
            if len(values) != len(prompts):
                raise RewardError(
                    f"reward {name!r} returned {len(values)} scores for {len(prompts)} rows"
                )
            return [
                checked_score(value, f"reward {name!r}", f"row {row}", row)
                for row, value in enumerate(values)
            ]
        scores = []
        for row, (prompt, completion, fields) in enumerate(zip(prompts, completions, rows)):
            try:
                value = fn(prompt, completion, **fields)
            except (Exception, SystemExit) as exc:  # a user callback: name fn and row
                detail = " ".join(str(exc).split())  # keep the message on one line
                message = f"reward {name!r} raised {type(exc).__name__}: {detail} on row {row}"
                raise RewardError(message, row) from exc
            scores.append(checked_score(value, f"reward {name!r}", f"row {row}", row))
        return scores

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[dict[str, Any]]
    ) -> list[float]:
        """Total reward per row = sum of weight * component score. Raises RewardError."""
        assert len(prompts) == len(completions) == len(rows), (
            f"{len(prompts)} prompts, {len(completions)} completions, {len(rows)} rows"
        )
        totals = [0.0] * len(prompts)
        metrics = {}
        for name, fn, weight in self.parts:
            scores = self._score_part(name, fn, prompts, completions, rows)
            totals = [total + weight * score for total, score in zip(totals, scores)]
            metrics[f"reward/{name}/mean"] = sum(scores) / max(len(scores), 1)
            for key, value in (getattr(fn, "last_metrics", None) or {}).items():
                if key.startswith("reward/"):
                    continue  # the combined reward's own names
                if isinstance(value, bool) or not isinstance(value, numbers.Real):
                    raise RewardError(
                        f"reward {name!r} set its metric {key!r} to {type(value).__name__} "
                        f"{value!r:.60}; need a number"
                    )
                if key in self.counted_metrics:  # counts: two judges' failures add up
                    value = metrics.get(key, 0.0) + value
                metrics[key] = value  # e.g. judge/parse_failures
        for row, total in enumerate(totals):  # weights can push a sum past the bound
            checked_score(total, "the weighted sum of reward.fns", f"row {row}", row)
        metrics["reward/total/mean"] = sum(totals) / max(len(totals), 1)
        self.last_metrics = metrics
        return totals
