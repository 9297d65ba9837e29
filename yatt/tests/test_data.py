"""Prompt data: loading JSONL/parquet, bad rows, generators, held-out split, chat rendering.

Method: small files written to tmp_path; every malformed-row case must produce a one-line
DataError naming the file and line; skip_bad_rows keeps the good rows and counts the bad ones.
"""

import json

import pytest

from yatt.data import (
    PromptExample,
    generate_task,
    load_prompts,
    render_prompt,
    save_prompts,
    split_heldout,
)
from yatt.errors import ConfigError, DataError

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def _write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_string_and_chat_prompts_keep_extra_fields(tmp_path):
    path = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            json.dumps({"prompt": "What is 1 + 2?", "answer": 3, "level": "easy"}),
            "",
            json.dumps({"messages": CHAT, "answer": "4", "source": {"id": 7}}),
            json.dumps({"prompt": "no answer here"}),
        ],
    )
    examples = load_prompts(path)
    assert [e.answer for e in examples] == ["3", "4", None]
    assert examples[0].fields == {"level": "easy"}
    assert examples[1].prompt == CHAT
    assert examples[1].reward_fields() == {"question": examples[1].question(),
                                           "source": {"id": 7}, "answer": "4"}  # fmt: skip
    assert examples.skipped == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"prompt": "ok", ', "bad JSON"),
        ('["a list"]', "row is a JSON list"),
        ('{"question": "where is the prompt"}', "missing field 'prompt'"),
        ('{"prompt": 12}', "'prompt' is int"),
        ('{"prompt": "   "}', "'prompt' is empty"),
        ('{"prompt": []}', "empty message list"),
        ('{"prompt": [{"role": "user"}]}', "message 0 needs a string 'content'"),
        ('{"prompt": [{"role": "wizard", "content": "hi"}]}', "message 0 has role 'wizard'"),
        ('{"prompt": [{"role": "system", "content": "be brief"}]}', "no user message with text"),
        ('{"prompt": [{"role": "user", "content": " "}]}', "no user message with text"),
        ('{"prompt": "x", "answer": [1]}', "'answer' is list"),
        ('{"prompt": "x", "completion": "zzz"}', "field 'completion' is reserved"),
        ('{"prompt": "x", "answer": NaN}', "field 'answer' is nan, expected a string or finite"),
        ('{"prompt": "x", "answer": -Infinity}', "field 'answer' is -inf, expected a string"),
        # json.loads raises ValueError and RecursionError too: they were tracebacks
        ('{"prompt": "x", "answer": ' + "9" * 5000 + "}", "unreadable JSON (Exceeds the limit"),
        ('{"prompt": "x", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}", "unreadable JSON"),
        # json keeps the last of a repeated key without a word
        ('{"prompt": "b", "prompt": "c"}', "key 'prompt' appears twice in one object"),
        # the policy would be shown the answer it is to give
        (
            '{"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "4"}]}',
            "ends with an assistant message",
        ),
        (
            '{"prompt": [{"role": "user", "content": "' + "x" * 5000 + '"}, {"role": "user", '
            '"content": [' + "1, " * 5000 + "1]}]}",
            "got [1, 1, 1",
        ),  # (cut short)
    ],
)
def test_bad_row_names_file_line_and_problem(tmp_path, line, problem):
    path = _write_jsonl(tmp_path / "bad.jsonl", ['{"prompt": "fine"}', line])
    with pytest.raises(DataError) as caught:
        load_prompts(path)
    message = str(caught.value)
    assert f"{path}:2: " in message
    assert problem in message
    assert "\n" not in message


def test_skip_bad_rows_reports_count(tmp_path, caplog):
    lines = ['{"prompt": "a"}', "{oops", '{"prompt": 5}', '{"prompt": "b", "answer": 1}']
    path = _write_jsonl(tmp_path / "mixed.jsonl", lines)
    examples = load_prompts(path, skip_bad_rows=True)
    assert [e.prompt for e in examples] == ["a", "b"]
    assert len(examples.skipped) == 2
    assert examples.skipped[0].startswith(f"{path}:2: bad JSON")
    assert "skipped 2 bad rows" in caplog.text


def test_missing_empty_and_unknown_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(DataError, match=r"folder\.jsonl' is a folder, not a file"):
        load_prompts(tmp_path / "folder.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no usable rows"):
        load_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "d.csv").write_text("prompt\n")
    with pytest.raises(DataError, match=r"unknown suffix '\.csv'"):
        load_prompts(tmp_path / "d.csv")


def test_parquet_round_trip_and_bad_parquet_row(tmp_path):
    examples = [
        PromptExample(CHAT, "4", {"level": 1}),
        PromptExample([{"role": "user", "content": "3+3?"}], None, {"level": 2}),
    ]
    path = save_prompts(examples, tmp_path / "d.parquet")
    assert load_prompts(path) == examples
    jsonl = save_prompts(generate_task("addition", 5, seed=1), tmp_path / "a.jsonl")
    assert load_prompts(jsonl) == generate_task("addition", 5, seed=1)
    broken = save_prompts([PromptExample("ok"), PromptExample("   ")], tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b\.parquet row 2: field 'prompt' is empty"):
        load_prompts(broken)


def test_addition_generator_is_exact_and_seeded():
    examples = generate_task("addition", 50, seed=3)
    assert examples == generate_task("addition", 50, seed=3)
    assert examples != generate_task("addition", 50, seed=4)
    for example in examples:
        words = example.prompt.split()
        a, b = int(words[2]), int(words[4].rstrip("?"))
        assert example.prompt == f"What is {a} + {b}? Answer with just the number."
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert example.answer == str(a + b)


@pytest.mark.parametrize("task", ["arithmetic", "countdown", "gsm8k_style"])
def test_reasoning_gym_tasks_are_seeded_and_offline(task):
    first = generate_task(task, 3, seed=5)
    assert first == generate_task(task, 3, seed=5)
    assert all(e.prompt and e.answer for e in first)
    assert first[0].fields["task"] == task


def test_generator_errors():
    with pytest.raises(ConfigError, match=r"'multiplication'.*addition"):
        generate_task("multiplication", 3)
    with pytest.raises(ConfigError, match="takes no options"):
        generate_task("addition", 3, digits=3)
    with pytest.raises(ConfigError, match="bad options"):
        generate_task("arithmetic", 3, bogus=1)


def test_split_heldout_is_disjoint_and_seeded():
    examples = generate_task("addition", 300, seed=0)
    train, heldout = split_heldout(examples, 100, seed=1)
    assert len(heldout) == 100
    assert (train, heldout) == split_heldout(examples, 100, seed=1)
    assert not {e.prompt for e in train} & {e.prompt for e in heldout}
    assert len(train) + len(heldout) <= 300
    with pytest.raises(ConfigError, match="n_heldout"):
        split_heldout(examples, 300)


def test_render_prompt_uses_chat_template():
    from yatt.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    text = render_prompt(PromptExample("What is 1 + 2?"), tokenizer)
    assert "What is 1 + 2?" in text
    assert text.endswith("<|im_start|>assistant\n")
    chat = render_prompt(PromptExample(CHAT), tokenizer)
    assert "Be brief." in chat
    assert (
        render_prompt(PromptExample(CHAT), tokenizer, use_chat_template=False) == "Be brief.\n2+2?"
    )


def test_a_string_prompt_and_the_same_one_message_chat_prompt_are_one_prompt():
    """Both render as the same model input: the held-out split kept one in training (a
    held-out score on a prompt the policy trained on)."""
    chat = [{"role": "user", "content": "What is 2+2?"}]
    examples = [PromptExample(prompt="What is 2+2?", answer="4"),
                PromptExample(prompt=chat, answer="4"),
                PromptExample(prompt="What is 3+3?", answer="6")]  # fmt: skip
    splits = [split_heldout(examples, 1, seed=seed) for seed in range(6)]
    fours = [train for train, heldout in splits if heldout[0].answer == "4"]
    assert fours and all([e.answer for e in train] == ["6"] for train in fours)
