"""Prompt datasets: JSONL/parquet loading with row validation, built-in task generators, the
held-out split, and rendering prompts through the tokenizer's chat template.

Row format: `prompt` (a string, or a list of chat messages {"role", "content"}, roles from
CHAT_ROLES, at least one user message with text; `messages` is
accepted when `prompt` is absent), optional `answer` (string or number), and any extra fields,
which are kept and passed to reward functions (so none may be named `completion`, which reward
functions take as an argument of their own). A malformed row fails the load with a DataError
naming file, line and problem; `skip_bad_rows=True` skips such rows instead and reports the count.
"""

import hashlib
import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yatt.errors import ConfigError, DataError, ModelError

__all__ = [
    "ADDITION_TEMPLATE",
    "CHAT_ROLES",
    "TASKS",
    "TASK_PROVIDES",
    "PromptDataset",
    "PromptExample",
    "PromptSampler",
    "check_draw_order",
    "draw_order",
    "generate_task",
    "load_prompts",
    "render_prompt",
    "save_prompts",
    "split_heldout",
]

logger = logging.getLogger(__name__)

ADDITION_TEMPLATE = "What is {a} + {b}? Answer with just the number."
_RG_TASKS = {
    "arithmetic": "basic_arithmetic",
    "countdown": "countdown",
    "gsm8k_style": "gsm_symbolic",
}
TASKS = ("addition", *_RG_TASKS)
# What each built-in task's rows give a reward function to grade against (the names a
# reward's entry in yatt.rewards.REWARD_NEEDS asks for): "number", a numeric reference answer
# that is the only correct one; "reasoning_gym", the `rg_dataset` and `metadata` fields that
# reasoning_gym's own checker reads. A countdown answer is one of many valid expressions, so
# only its checker grades it.
TASK_PROVIDES: dict[str, frozenset[str]] = {
    "addition": frozenset({"number"}),
    "arithmetic": frozenset({"number", "reasoning_gym"}),
    "countdown": frozenset({"reasoning_gym"}),
    "gsm8k_style": frozenset({"number", "reasoning_gym"}),
}
_SUFFIXES = (".jsonl", ".parquet")
# Reward functions are called fn(prompt, completion, **fields): a field named like an argument
# would clash (`prompt` never reaches `fields`: _parse_row reads it as the prompt).
_RESERVED_FIELDS = ("completion",)


@dataclass(frozen=True)
class PromptExample:
    """One prompt: text or chat messages, the reference answer, and any other row fields.

    `source` is where the row came from ("file:line", "file row n"; empty for generated tasks),
    for error messages only: it is not a row field and takes no part in comparisons.
    """

    prompt: str | list[dict[str, str]]
    answer: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    source: str = field(default="", compare=False, repr=False)

    def reward_fields(self) -> dict[str, Any]:
        """Keyword arguments for a reward function: `answer` plus the extra fields, and the
        prompt's own text as `question` unless the row has that field (a reward's `prompt`
        argument is the prompt as the policy saw it, chat template and all; an LLM judge
        quotes the question, not the policy's markup)."""
        return {"question": self.question(), **self.fields, "answer": self.answer}

    def question(self) -> str:
        """The prompt's text: itself, or the last user message's content (else all joined)."""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [m["content"] for m in self.prompt if m.get("role") == "user"]
        return users[-1] if users else "\n".join(m["content"] for m in self.prompt)

    def to_row(self) -> dict[str, Any]:
        """The row as written to JSONL/parquet (inverse of loading)."""
        return {"prompt": self.prompt, "answer": self.answer, **self.fields}


class PromptDataset(list):
    """A list of PromptExample plus `skipped`: one message per bad row skipped while loading."""

    def __init__(self, examples: list[PromptExample], skipped: list[str] | None = None) -> None:
        super().__init__(examples)
        self.skipped: list[str] = skipped or []


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # what chat templates know


class _RowError(ValueError):
    """A row problem; the loader adds file and line."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (json keeps the last of a repeated key)."""
    row = dict(pairs)
    if len(row) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _RowError(f"key {twice!r:.40} appears twice in one object")
    return row


def _parse_messages(messages: list) -> list[dict[str, str]]:
    if not messages:
        raise _RowError("field 'prompt' is an empty message list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _RowError(f"message {index} is {type(message).__name__}, expected an object")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise _RowError(
                    f"message {index} needs a string {key!r}, got {message.get(key)!r:.60}"
                )
        if message["role"] not in CHAT_ROLES:
            raise _RowError(
                f"message {index} has role {message['role']!r:.40}; roles: {list(CHAT_ROLES)}"
            )
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        raise _RowError("field 'prompt' holds no user message with text: nothing to answer")
    if messages[-1]["role"] == "assistant":  # the policy would see the answer it is to give
        raise _RowError(
            "field 'prompt' ends with an assistant message: a prompt is what the model answers "
            "(put the reference in 'answer')"
        )
    return [dict(message) for message in messages]  # extra keys (name, tool_calls) are kept


def _parse_prompt(value: Any) -> str | list[dict[str, str]]:
    if isinstance(value, str):
        if not value.strip():
            raise _RowError("field 'prompt' is empty")
        return value
    if isinstance(value, list):
        return _parse_messages(value)
    if value is None:
        raise _RowError("field 'prompt' is null")
    kind = type(value).__name__
    raise _RowError(f"field 'prompt' is {kind}, expected a string or a list of chat messages")


def _parse_answer(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _RowError(f"field 'answer' is {type(value).__name__}, expected a string or number")
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN/Infinity (Python's)
        raise _RowError(f"field 'answer' is {value}, expected a string or finite number")
    return str(value)


def _parse_row(row: Any, source: str) -> PromptExample:
    """Validate one decoded row -> PromptExample; raises _RowError naming the problem."""
    if not isinstance(row, dict):
        raise _RowError(f"row is a JSON {type(row).__name__}, expected an object")
    prompt_key = "prompt" if "prompt" in row else "messages"
    if prompt_key not in row:
        raise _RowError(f"missing field 'prompt' (keys: {sorted(row)})")
    prompt = _parse_prompt(row[prompt_key])
    answer = _parse_answer(row.get("answer"))
    extra = {key: value for key, value in row.items() if key not in (prompt_key, "answer")}
    for key in _RESERVED_FIELDS:
        if key in extra:
            raise _RowError(
                f"field {key!r} is reserved (reward functions take the sampled {key} under that "
                "name); rename it"
            )
    return PromptExample(prompt=prompt, answer=answer, fields=extra, source=source)


def _jsonl_rows(path: Path) -> list[tuple[str, Any]]:
    """(location, decoded row or _RowError) for each non-blank line of a JSONL file."""
    rows: list[tuple[str, Any]] = []
    try:
        handle = path.open("rb")
    except OSError as exc:  # (no read permission ...)
        raise DataError(f"cannot read data file {str(path)!r}: {exc.strerror or exc}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # (a BOM first)
            except UnicodeDecodeError as exc:  # a whole-file problem (Latin-1, binary): no skipping
                raise DataError(
                    f"data file {str(path)!r}: not UTF-8 (byte 0x{raw[exc.start]:02x} at line "
                    f"{number})"
                ) from None
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{number}", json.loads(line, object_pairs_hook=_unique)))
            except _RowError as exc:
                rows.append((f"{path}:{number}", exc))
            except json.JSONDecodeError as exc:
                rows.append(
                    (f"{path}:{number}", _RowError(f"bad JSON ({exc.msg}, col {exc.colno})"))
                )
            except (ValueError, RecursionError) as exc:  # an int past 4300 digits, deep nesting
                detail = " ".join(str(exc).split()) or type(exc).__name__
                rows.append((f"{path}:{number}", _RowError(f"unreadable JSON ({detail})")))
    return rows


def _parquet_rows(path: Path) -> list[tuple[str, Any]]:
    import pyarrow.parquet as pq  # local: pyarrow is only needed for parquet files

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read parquet file {str(path)!r}: {exc}") from exc
    return [(f"{path} row {index}", row) for index, row in enumerate(table.to_pylist(), start=1)]


def load_prompts(path: str | Path, *, skip_bad_rows: bool = False) -> PromptDataset:
    """Load prompt rows from a .jsonl or .parquet file.

    Raises DataError (one line: file, line/row, problem) for a missing file, an unknown suffix,
    a malformed row (unless skip_bad_rows: then skipped, counted in `.skipped` and logged), or
    a file with no usable rows.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"data file {str(path)!r} is a folder, not a file")
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} does not exist")
    if path.suffix not in _SUFFIXES:
        raise DataError(f"data file {str(path)!r}: unknown suffix {path.suffix!r}; use {_SUFFIXES}")
    rows = _jsonl_rows(path) if path.suffix == ".jsonl" else _parquet_rows(path)
    examples, skipped = [], []
    for location, row in rows:
        try:
            if isinstance(row, _RowError):
                raise row
            examples.append(_parse_row(row, location))
        except _RowError as exc:
            if not skip_bad_rows:
                raise DataError(f"{location}: {exc}") from None
            skipped.append(f"{location}: {exc}")
    if skipped:
        logger.warning("skipped %d bad rows in %s; first: %s", len(skipped), path, skipped[0])
    if not examples:
        raise DataError(f"data file {str(path)!r} has no usable rows ({len(skipped)} bad)")
    return PromptDataset(examples, skipped)


def save_prompts(examples: list[PromptExample], path: str | Path) -> Path:
    """Write examples as .jsonl or .parquet (by suffix); `load_prompts` reads them back."""
    path = Path(path)
    if path.suffix not in _SUFFIXES:
        raise DataError(f"data file {str(path)!r}: unknown suffix {path.suffix!r}; use {_SUFFIXES}")
    rows = [example.to_row() for example in examples]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pq.write_table(pa.Table.from_pylist(rows), path)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(f"cannot write {str(path)!r} as parquet: {exc}") from exc
    return path


def _addition(n: int, seed: int) -> list[PromptExample]:
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        prompt = ADDITION_TEMPLATE.format(a=a, b=b)
        examples.append(PromptExample(prompt, str(a + b), {"task": "addition"}))
    return examples


def _reasoning_gym(task: str, n: int, seed: int, opts: dict[str, Any]) -> list[PromptExample]:
    import reasoning_gym  # local: takes ~1 s to import and only these tasks need it

    dataset_name = _RG_TASKS[task]
    try:
        dataset = reasoning_gym.create_dataset(dataset_name, size=n, seed=seed, **opts)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"bad options {opts} for task {task!r}: {exc}") from exc
    suffix = " Answer with just the number." if task == "arithmetic" else ""
    examples = []
    for entry in dataset:
        fields = {"task": task, "rg_dataset": dataset_name, "metadata": entry["metadata"]}
        examples.append(PromptExample(entry["question"] + suffix, str(entry["answer"]), fields))
    return examples


def generate_task(name: str, n: int, seed: int = 0, **opts: Any) -> list[PromptExample]:
    """n seeded examples of a built-in task (same seed -> same examples).

    addition: "What is a + b? Answer with just the number." with two-digit a, b (no options).
    arithmetic / countdown / gsm8k_style: reasoning_gym's basic_arithmetic / countdown /
    gsm_symbolic (offline), `opts` go to its dataset config; fields carry its metadata.
    Raises ConfigError for an unknown task, n < 1, or bad options.
    """
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; valid: {list(TASKS)}")
    if n < 1:
        raise ConfigError(f"task {name!r}: n must be >= 1, got {n}")
    if name == "addition":
        if opts:
            raise ConfigError(f"task 'addition' takes no options, got {sorted(opts)}")
        return _addition(n, seed)
    return _reasoning_gym(name, n, seed, opts)


def _prompt_key(example: PromptExample) -> str:
    """What the model is shown, as a key: a string prompt is the one user message it renders
    as (``render_prompt``), so it matches that message given as a list."""
    prompt = example.prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return json.dumps(messages, sort_keys=True)


def split_heldout(
    examples: list[PromptExample], n_heldout: int, seed: int = 0
) -> tuple[list[PromptExample], list[PromptExample]]:
    """Seeded split -> (train, heldout) with len(heldout) == n_heldout.

    Train rows whose prompt also appears in the held-out part are dropped (logged), so the
    held-out score measures unseen prompts. Raises ConfigError unless 0 < n_heldout < len, or
    if no train row is left.
    """
    if not 0 < n_heldout < len(examples):
        raise ConfigError(f"n_heldout must be in (0, {len(examples)}), got {n_heldout}")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    heldout = [examples[index] for index in order[:n_heldout]]
    heldout_prompts = {_prompt_key(example) for example in heldout}
    train = [
        examples[i] for i in order[n_heldout:] if _prompt_key(examples[i]) not in heldout_prompts
    ]
    if not train:
        distinct = len({_prompt_key(example) for example in examples})
        raise ConfigError(
            f"data.n_heldout={n_heldout}: no training prompts left after removing the held-out "
            f"ones and their duplicates ({len(examples)} rows, {distinct} distinct prompts)"
        )
    dropped = len(examples) - n_heldout - len(train)
    if dropped:
        logger.info("split_heldout: dropped %d train rows duplicating held-out prompts", dropped)
    return train, heldout


def _template_source(tokenizer: Any) -> str:
    """The tokenizer's chat template as messages name it: by the file of its model folder
    (chat_template.jinja, or tokenizer_config.json) that holds this very template, else by the
    tokenizer's name."""
    template = tokenizer.chat_template
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or "?"))
    jinja = folder / "chat_template.jinja"
    try:
        if jinja.is_file() and jinja.read_text(encoding="utf-8") == template:
            return f"chat template {jinja}"
        config = folder / "tokenizer_config.json"
        if config.is_file():
            saved = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            if saved == template:
                return f"chat template of {config}"
    except (OSError, ValueError, AttributeError):  # unreadable: the name below still says
        pass
    return f"the chat template of tokenizer {str(folder)!r}"


def _template_error(exc: Exception, tokenizer: Any, example: PromptExample) -> ModelError:
    """A one-line ModelError for a chat template that does not parse, or fails on a prompt."""
    import jinja2

    where = _template_source(tokenizer)
    detail = " ".join(str(getattr(exc, "message", None) or exc).split())
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return ModelError(
            f"{where}: syntax error at line {exc.lineno}: {detail}; fix it, or set "
            "data.use_chat_template=false"
        )
    prompt = f" on the prompt of {example.source}" if example.source else ""
    return ModelError(f"{where} failed{prompt}: {type(exc).__name__}: {detail}")


def render_prompt(example: PromptExample, tokenizer: Any, use_chat_template: bool = True) -> str:
    """Prompt text for the model: through the chat template (generation prompt appended), or
    raw (a message list is then joined by newlines). Raises ModelError (one line naming the
    template file) if there is no template, or it does not parse or fails on this prompt."""
    import jinja2

    messages = example.prompt
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not use_chat_template:
        return "\n".join(message["content"] for message in messages)
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "?")
        raise ModelError(f"tokenizer {name!r} has no chat template; set use_chat_template=False")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except jinja2.TemplateError as exc:
        raise _template_error(exc, tokenizer, example) from exc


def draw_order(config: Any, train_set: Sequence[PromptExample]) -> dict[str, Any]:
    """What the prompt order of a run depends on, as a checkpoint records it (a resume with
    another would sample other prompts): the draw size, the order's seed, and the training
    set (its size and a digest of its prompts and answers)."""
    digest = hashlib.sha256()
    for example in train_set:
        digest.update(repr((example.prompt, example.answer)).encode())
    return {"prompts_per_step": config.algo.prompts_per_step,
            "order_seed": config.data.seed + config.train.seed,
            "n_prompts": len(train_set), "prompts_sha256": digest.hexdigest()}  # fmt: skip


def check_draw_order(
    recorded: Mapping[str, Any],
    here: Mapping[str, Any],
    checkpoint: str,
    *,
    draw_size: bool = True,
) -> None:
    """Raise ConfigError (one line) unless a checkpoint's data position (`recorded`, with
    `draw_order`'s keys) fits this run's (`here`, its `draw_order`): the same prompt order and
    training set, and with `draw_size` the same prompts per step (the controllers' queues
    count whole draws)."""
    named = {"prompts_per_step": "algo.prompts_per_step=", "order_seed": "data.seed + train.seed=",
             "n_prompts": "a training set of ", "prompts_sha256": "training prompts "}  # fmt: skip
    if not draw_size:
        del named["prompts_per_step"]
    for key, what in named.items():
        if recorded.get(key) != here[key]:
            settings = "data.* and algo.prompts_per_step" if draw_size else "data.*"
            was, now = recorded.get(key), here[key]
            if key == "prompts_sha256":  # same count, other prompts: say so, not only hashes
                what, was, now = "training prompts of digest ", f"{was}"[:12], f"{now}"[:12]
                settings += " (the same data file, unchanged)"
            raise ConfigError(
                f"checkpoint.resume={checkpoint} was written with {what}{was}, this run has "
                f"{now}{' (the prompts or answers differ)' if key == 'prompts_sha256' else ''}: "
                f"its data position counts prompts drawn in that run's order; resume with the "
                f"{settings} of the run that wrote it"
            )


class PromptSampler:
    """Walks a seeded permutation of the training prompts, reshuffling each data epoch."""

    def __init__(self, n_prompts: int, seed: int) -> None:
        assert n_prompts > 0, "no training prompts"
        self.n_prompts = n_prompts
        self.seed = seed
        self.data_epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        import torch  # (this module loads without it)

        generator = torch.Generator().manual_seed(self.seed * 7919 + self.data_epoch)
        return torch.randperm(self.n_prompts, generator=generator).tolist()

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            if self.position == self.n_prompts:
                self.data_epoch, self.position = self.data_epoch + 1, 0
                self._order = self._permutation()
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"data_epoch": self.data_epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.data_epoch, self.position = state["data_epoch"], state["position"]
        self._order = self._permutation()
