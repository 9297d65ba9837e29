"""Generative reward model: an LLM judge run through any rollout engine, its reply parsed into a
score in [0, 1]. Works with every engine offering `generate(prompt_ids, params, seeds)`.

Fallback policy: a reply without a parseable score gets `fallback` (default 0.0) and is counted
in `last_metrics["judge/parse_failures"]`; with `fallback=None` it raises RewardError instead.
A request longer than the judge model's positions keeps the end of the completion (where the
answer is), counted in `judge/truncated`; one whose question alone is too long gets the
fallback too (counted as a parse failure).
"""

import logging
import re
import string
from collections.abc import Callable, Sequence
from typing import Any

from yatt.rewards import RewardError

__all__ = ["DEFAULT_TEMPLATE", "GenerativeJudge", "parse_score"]

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "Rate how well the answer solves the question, from 0 (wrong) to 10 (fully correct).\n"
    "Question: {question}\nAnswer: {completion}\n"
    "Reply with one line in the form 'Score: N/10'."
)

# (Markdown emphasis may sit around the word or the colon: "**Score:** 8", "**Score**: 8". No
# two stars over the same characters side by side: a long run of them scans in linear time.)
_SCORE = re.compile(
    r"score[\s*_]*(?:[:=][\s*_]*)?(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?",
    re.IGNORECASE,
)
_FRACTION = re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")


def parse_score(text: str, max_score: float = 10.0) -> float | None:
    """Score in [0, 1] from a judge reply, or None if there is none.

    Reads the last "Score: N" or "Score: N/D" (case-insensitive), else the last bare "N/D" after
    the last "score" (or anywhere, in a reply that never says "score"): a fraction in a reply
    cut off before its score is no score. N/D when D is given (D > 0), else N / max_score; a
    score outside [0, max_score] (or N/D outside [0, 1]) is no score: the judge answered on
    another scale.
    """
    lowered = text.lower()
    if "score" in lowered:  # "Score: 8/10", else an N/D after the last "score" ("I'd score
        matches = _SCORE.findall(text)  # it 7/10"); a fraction before it is no score
        matches = matches or _FRACTION.findall(text[lowered.rindex("score") :])
    else:
        matches = _FRACTION.findall(text)
    if not matches:
        return None
    numerator, denominator = matches[-1]
    scale = float(denominator) if denominator else max_score
    if scale <= 0:
        return None
    value = float(numerator) / scale
    return value if 0.0 <= value <= 1.0 else None


def _check_template(template: str) -> None:
    """A stray or empty brace fails here, when the judge is built, not at its first scoring.

    Raises:
        ValueError: the template does not format with named fields.
    """
    try:
        fields = [
            field for _, field, _, _ in string.Formatter().parse(template) if field is not None
        ]
    except ValueError as error:
        raise ValueError(f"judge template does not format: {error} (write a brace twice)") from None
    positional = [field for field in fields if field == "" or field.isdigit()]
    if positional:
        raise ValueError(
            f"judge template does not format: {{{positional[0]}}} names no field (a literal "
            "brace is written twice: \\boxed{{}})"
        )


class GenerativeJudge:
    """Batch scorer for CombinedReward: asks an LLM (via `engine`) to grade each completion.

    template: str.format'ed with question (the prompt's own text: the row's `question` field,
    else `prompt`), prompt (as the policy saw it, its chat markup included), completion and
    the row's fields; rendered through the judge tokenizer's chat template when it has one.
    params: the engine's SamplingParams (default: greedy, 32 new tokens). parse: reply ->
    score in [0, 1] or None.
    """

    name = "judge"
    # set on every call (CombinedReward.counted_metrics)
    metric_names = ("judge/parse_failures", "judge/truncated")

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        template: str = DEFAULT_TEMPLATE,
        *,
        params: Any = None,
        parse: Callable[[str], float | None] = parse_score,
        fallback: float | None = 0.0,
        seed: int = 0,
    ) -> None:
        if params is None:
            from yatt.rollout.sampling import SamplingParams  # local: keeps rewards light

            params = SamplingParams(max_new_tokens=32, greedy=True)
        _check_template(template)
        self.engine, self.tokenizer, self.template = engine, tokenizer, template
        self.params, self.parse, self.fallback, self.seed = params, parse, fallback, seed
        self.last_metrics: dict[str, float] = {}
        self.last_replies: list[str] = []

    def _fitted_ids(self, prompt: str, completion: str, fields: dict[str, Any]
                    ) -> tuple[list[int] | None, bool]:  # fmt: skip
        """The request's tokens, and whether the completion was cut to fit the judge model's
        positions (keeping its end); None when even an empty completion does not fit."""
        from yatt.rollout.engine import model_positions  # local: keeps rewards light

        ids = self._prompt_ids(prompt, completion, fields)
        positions = model_positions(getattr(self.engine, "model", None))
        if positions is None or len(ids) + self.params.max_new_tokens <= positions:
            return ids, False
        excess = len(ids) + self.params.max_new_tokens - positions
        tokens = self.tokenizer(completion, add_special_tokens=False)["input_ids"]
        if excess >= len(tokens):
            return None, True
        kept = "..." + self.tokenizer.decode(tokens[excess + 2 :])  # (room for the "...")
        ids = self._prompt_ids(prompt, kept, fields)
        return (ids if len(ids) + self.params.max_new_tokens <= positions else None), True

    def _prompt_ids(self, prompt: str, completion: str, fields: dict[str, Any]) -> list[int]:
        values = {"question": prompt, **fields, "prompt": prompt, "completion": completion}
        text = self.template.format(**values)
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": text}]
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def score_batch(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[dict]
    ) -> list[float]:
        """One judged score in [0, 1] per row (see the module's fallback policy)."""
        requests: list[list[int] | None] = []
        truncated = 0
        for row, (prompt, completion, fields) in enumerate(zip(prompts, completions, rows)):
            try:
                ids, cut = self._fitted_ids(prompt, completion, fields)
            except KeyError as exc:
                raise RewardError(
                    f"judge template needs field {exc} missing on row {row}", row
                ) from exc
            if ids is None and self.fallback is None:
                raise RewardError(f"judge request on row {row} does not fit the judge model", row)
            requests.append(ids)
            truncated += cut
        asked = [ids for ids in requests if ids is not None]
        seeds = [self.seed + row for row, ids in enumerate(requests) if ids is not None]
        answers = iter(self.engine.generate(asked, self.params, seeds) if asked else [])
        replies = ["" if ids is None else next(answers).text for ids in requests]
        scores, failures = [], 0
        for row, reply in enumerate(replies):
            score = self.parse(reply) if requests[row] is not None else None
            if score is None:
                if self.fallback is None:
                    shown = " ".join(reply.split())[:80]
                    raise RewardError(f"judge reply on row {row} has no score: {shown!r}", row)
                failures += 1
                score = self.fallback
            scores.append(score)
        if failures * 2 > len(replies):
            logger.warning("judge: %d of %d replies had no score (scored %s): is the template's "
                           "reply format one the judge follows?", failures, len(replies),
                           self.fallback)  # fmt: skip
        self.last_replies = replies
        self.last_metrics = {"judge/parse_failures": float(failures),
                             "judge/truncated": float(truncated)}  # fmt: skip
        return scores
