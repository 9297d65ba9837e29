"""Rule-based rewards: math answer checkers, an optional format reward, and reasoning_gym scoring.

All follow the reward-function signature of `yatt.rewards`: fn(prompt, completion, **fields).
"""

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

__all__ = [
    "answer_value",
    "extract_boxed",
    "extract_last_number",
    "format_reward",
    "math_answer",
    "math_boxed",
    "reasoning_gym_reward",
    "stated_answer",
]

# A sign counts only when no digit precedes it, so "10-3" reads as 10 and 3, not 10 and -3; a
# fraction a/b is one number ("3/4" is 3/4, not 4).
# (A denominator ends at a digit or a decimal point with a digit after it: "1/2.5" is not a
# fraction, "3/4." ending a sentence is.)
_NUMBER = re.compile(
    r"(?:(?<![\d])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+(?!\d|\.\d))?|(?:(?<![\d])-)?\.\d+"
)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:/\d+)?")
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-"})  # the minus sign, an en dash
_ONLY_A_NUMBER = r"\s*(?:" + _NUMBER.pattern + r")\s*\.?\s*"  # what math_answer reads
# Where a completion states its answer: "#### 42", "the answer is 42", "Answer: 42".
_ANSWER_MARK = re.compile(r"####|\banswer\s*(?:is|:)", re.IGNORECASE)
_MARK_GAP = 12  # at most so many characters, no letters, between the mark and its number
_EXPONENT = re.compile(r"[\^_](?:\{[^{}]*\}|-?\d+(?:\.\d+)?)")  # 12 cm^2, x_{1}, 10^{-3}
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}")
_MIXED = re.compile(r"(-?)(\d+)\s*\\[dt]?frac\{(\d+)\}\{(\d+)\}")  # 3\frac{1}{2} = 7/2


def _to_fraction(text: str) -> Fraction | None:
    """Exact value of a number written with optional sign, thousands commas, decimals, or a/b."""
    cleaned = text.translate(_MINUS).strip().replace("$", "").rstrip(".")
    if "," in cleaned:  # thousands separators only: "1,2" is a list of two, not 12
        if not _THOUSANDS.fullmatch(cleaned):
            return None
        cleaned = cleaned.replace(",", "")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_last_number(text: str) -> Fraction | None:
    """The last number in text ("1,234." -> 1234, "-5" -> -5, "2.50" -> 5/2), or None; a LaTeX
    fraction is one number (mixed ones too), an exponent or subscript none ("cm^2")."""
    text = _EXPONENT.sub(" ", _latex_fractions(text.translate(_MINUS)))
    matches = _NUMBER.findall(text)
    return _to_fraction(matches[-1]) if matches else None


def _latex_fractions(text: str) -> str:
    """\\frac{a}{b} as a/b, a mixed number n\\frac{a}{b} as (n*b + a)/b."""

    def mixed(match: re.Match) -> str:
        sign, whole, top, bottom = match.groups()
        return f"{sign}{int(whole) * int(bottom) + int(top)}/{bottom}"

    return _LATEX_FRAC.sub(r"\1/\2", _MIXED.sub(mixed, text))


def stated_answer(completion: str) -> Fraction | None:
    """The number a completion gives as its answer: the last \\boxed{} one, else the number
    right after its last "####" / "answer is" / "answer:" (a few characters and no words
    between: "the answer is $42$", not "the answer: first, 3 + 4"), else its last number."""
    boxed = extract_boxed(completion)
    if boxed is not None:
        value = _to_fraction(_normalise(boxed))
        if value is not None:
            return value
    marks = list(_ANSWER_MARK.finditer(completion))
    if marks:
        after = completion[marks[-1].end() :]
        text = _EXPONENT.sub(" ", _latex_fractions(after.translate(_MINUS)))
        found = _NUMBER.search(text)
        gap = text[: found.start()] if found is not None else ""
        if found is not None and len(gap) <= _MARK_GAP and not re.search(r"[A-Za-z]", gap):
            return _to_fraction(found.group())
    return extract_last_number(completion)


def answer_value(answer: Any) -> Fraction:
    """The numeric value of a reference answer: a number as `_to_fraction` reads one, or one
    in LaTeX or with a percent sign as `math_boxed` normalises it ("\\frac{1}{2}", "50%").

    Raises:
        ValueError: no answer, or one that is not a number.
    """
    if answer is None:
        raise ValueError("needs an 'answer' field, got None")
    value = _to_fraction(str(answer))
    if value is None:
        value = _to_fraction(_normalise(str(answer)))
    if value is None:
        raise ValueError(f"reference answer {answer!r} is not a number")
    return value


def math_answer(prompt: str, completion: str, *, answer: Any = None, **_fields: Any) -> float:
    """1.0 if the completion's stated answer (`stated_answer`: a boxed one, one after "the
    answer is", else its last number) equals the numeric reference answer, else 0.0."""
    reference = answer_value(answer)
    return 1.0 if stated_answer(completion) == reference else 0.0


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None


def _normalise(text: str) -> str:
    """Boxed or reference text as a plain string: no spaces, $ or \\$, the minus sign as -,
    LaTeX thousands spacing ({,} \\, \\!) read, a leading "x =" dropped, \\frac{a}{b} as a/b,
    a \\text or \\mathrm unit after a number dropped and other \\text{...} unwrapped, no percent
    sign, no enclosing braces."""
    text = re.sub(r"(?<=\d)\s+(?=\d{3}(?!\d))", "", text.translate(_MINUS))  # "1 000"
    text = re.sub(r"(?<=\d)\s+(?=\d)", "|", text)  # "1 2" is two numbers, never 12
    text = re.sub(r"\s+|\\?\$", "", text).rstrip(".")
    text = text.replace("{,}", ",").replace("\\!", "").replace("\\,", "")  # 1{,}000, 1\,000
    text = re.sub(r"^[A-Za-z]\w*=(?=.)", "", text)  # "x = 5": the value
    text = _latex_fractions(text)
    # a unit after a number ("5\text{ cm}", "3\mathrm{kg}"): the number
    text = re.sub(r"^(-?[\d.,/]+)\\(?:text|mathrm)\{[^{}]*\}$", r"\1", text)
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\\?%$", "", text)
    while text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    return text


def math_boxed(prompt: str, completion: str, *, answer: Any = None, **_fields: Any) -> float:
    """1.0 if the last \\boxed{} content equals the answer (numerically if both are numbers)."""
    if answer is None or not str(answer).strip():
        raise ValueError(f"needs a non-empty 'answer' field, got {answer!r}")
    boxed = extract_boxed(completion)
    if boxed is None:
        return 0.0
    got, want = _to_fraction(_normalise(boxed)), _to_fraction(_normalise(str(answer)))
    if got is not None and want is not None:
        return 1.0 if got == want else 0.0
    return 1.0 if _normalise(boxed) == _normalise(str(answer)) else 0.0


def format_reward(pattern: str = _ONLY_A_NUMBER) -> Callable[..., float]:
    """A reward of 1.0 when the whole completion matches `pattern` (default: just a number).

    Off unless a config asks for it: a small bonus for "only a number" can make a model collapse
    to well-formatted wrong answers, so weigh it far below the correctness reward if used.
    """
    compiled = re.compile(pattern, re.DOTALL)

    def format_match(prompt: str, completion: str, **_fields: Any) -> float:
        return 1.0 if compiled.fullmatch(completion) else 0.0

    return format_match


def _extract_final_answer(completion: str) -> str:
    tagged = re.findall(r"<answer>(.*?)</answer>", completion, re.DOTALL)
    if tagged:
        return tagged[-1].strip()
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def reasoning_gym_reward(
    prompt: str, completion: str, *, answer: Any = None, **fields: Any
) -> float:
    """Score with the reasoning_gym dataset's own checker (rows from `generate_task` carry
    `rg_dataset` and `metadata`); the final answer is the last <answer>...</answer> block or
    else the last non-empty line of the completion."""
    import reasoning_gym  # local: ~1 s import, only rows from reasoning_gym tasks need it

    if "rg_dataset" not in fields or "metadata" not in fields:
        raise ValueError("needs 'rg_dataset' and 'metadata' fields (rows from generate_task)")
    score_fn = reasoning_gym.get_score_answer_fn(fields["rg_dataset"])
    question = fields.get("question", prompt)  # the prompt's text, no chat markup
    entry = {"question": question, "answer": answer, "metadata": fields["metadata"]}
    return float(score_fn(_extract_final_answer(completion), entry))
