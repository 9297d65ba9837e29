"""Generative reward model: an LLM judge run through any rollout engine, its reply parsed into a
score in [0, 1]. Works with every engine offering `generate(prompt_ids, params, seeds)`.

Fallback policy: a reply without a parseable score gets `fallback` (default 0.0) and is counted
in `last_metrics["judge/parse_failures"]`; with `fallback=None` it raises RewardError instead.
"""

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from yatt.rewards import RewardError

__all__ = ["DEFAULT_TEMPLATE", "GenerativeJudge", "parse_score"]

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "Rate how well the answer solves the question, from 0 (wrong) to 10 (fully correct).\n"
    "Question: {prompt}\nAnswer: {completion}\n"
    "Reply with one line in the form 'Score: N/10'."
)

# (Markdown emphasis may sit around the word or the colon: "**Score:** 8", "**Score**: 8".)
_SCORE = re.compile(
    r"score[\s*_]*[:=]?[\s*_]*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE
)
_FRACTION = re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")


def parse_score(text: str, max_score: float = 10.0) -> float | None:
    """Score in [0, 1] from a judge reply, or None if there is none.

    Reads the last "Score: N" or "Score: N/D" (case-insensitive), else the last bare "N/D";
    N/D when D is given (D > 0), else N / max_score; clamped to [0, 1].
    """
    matches = _SCORE.findall(text) or _FRACTION.findall(text)
    if not matches:
        return None
    numerator, denominator = matches[-1]
    scale = float(denominator) if denominator else max_score
    if scale <= 0:
        return None
    return min(max(float(numerator) / scale, 0.0), 1.0)


class GenerativeJudge:
    """Batch scorer for CombinedReward: asks an LLM (via `engine`) to grade each completion.

    template: str.format'ed with prompt, completion and the row's fields; rendered through the
    tokenizer's chat template when it has one. params: the engine's SamplingParams (default:
    greedy, 32 new tokens). parse: reply -> score in [0, 1] or None.
    """

    name = "judge"
    metric_names = ("judge/parse_failures",)  # set on every call (CombinedReward.counted_metrics)

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
        self.engine, self.tokenizer, self.template = engine, tokenizer, template
        self.params, self.parse, self.fallback, self.seed = params, parse, fallback, seed
        self.last_metrics: dict[str, float] = {}
        self.last_replies: list[str] = []

    def _prompt_ids(self, prompt: str, completion: str, fields: dict[str, Any]) -> list[int]:
        text = self.template.format(**{**fields, "prompt": prompt, "completion": completion})
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
        prompt_ids = []
        for row, (prompt, completion, fields) in enumerate(zip(prompts, completions, rows)):
            try:
                prompt_ids.append(self._prompt_ids(prompt, completion, fields))
            except KeyError as exc:
                raise RewardError(
                    f"judge template needs field {exc} missing on row {row}", row
                ) from exc
        seeds = [self.seed + index for index in range(len(prompt_ids))]
        replies = [done.text for done in self.engine.generate(prompt_ids, self.params, seeds)]
        scores, failures = [], 0
        for row, reply in enumerate(replies):
            score = self.parse(reply)
            if score is None:
                if self.fallback is None:
                    shown = " ".join(reply.split())[:80]
                    raise RewardError(f"judge reply on row {row} has no score: {shown!r}", row)
                failures += 1
                score = self.fallback
            scores.append(score)
        if failures:
            logger.debug("judge: %d of %d replies had no score", failures, len(replies))
        self.last_replies = replies
        self.last_metrics = {"judge/parse_failures": float(failures)}
        return scores
