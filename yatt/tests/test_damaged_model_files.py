"""Damaged model folders give one-line errors that name the file, and lose nothing.

Method: real 1-step checkpoints of the tiny model (GRPO and PPO, module fixtures) and a saved
scalar-head model, copied and damaged per test: a chat template that does not parse, a config.json
field of the wrong type, a truncated weights file, a weights file that lacks a tensor or holds one
too many (rewritten with the safetensors library). Each error must be a YattError whose message
is one line; `yatt eval` must exit 2 with that line and no traceback.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from yatt.checkpoint import policy_folder
from yatt.cli import main
from yatt.config import load_config
from yatt.data import PromptExample, render_prompt
from yatt.errors import ModelError, YattError
from yatt.heads import ScalarHeadModel
from yatt.models import load_model, load_tokenizer, save_checkpoint, tiny_model
from yatt.trainer import Trainer

TINY = ["train.steps=1", "eval.n=0", "rollout.n_samples=2", "algo.prompts_per_step=2"]
GARBLED = "{% if %}"
GATE = "model.layers.0.mlp.gate_proj.weight"


def _one_line(exc_info: pytest.ExceptionInfo) -> str:
    message = str(exc_info.value)
    assert isinstance(exc_info.value, YattError)
    assert "\n" not in message, message
    return message


def _run(tmp_path_factory, name, overrides):
    run_dir = tmp_path_factory.mktemp(name)
    model, tokenizer = tiny_model(seed=0)
    config = load_config(
        "tiny_test", [*TINY, *overrides, "checkpoint.at_end=true", f"logging.run_dir={run_dir}"]
    )
    Trainer(config, model=model, tokenizer=tokenizer).fit()
    return run_dir


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """A run folder holding checkpoints/step_000001 of a 1-step tiny GRPO run."""
    return _run(tmp_path_factory, "grpo", [])


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A run folder holding checkpoints/step_000001 (with critic/) of a 1-step tiny PPO run."""
    return _run(tmp_path_factory, "ppo", ["algo.name=ppo"])


@pytest.fixture
def checkpoint(grpo_run, tmp_path):
    """A private copy of the GRPO run's checkpoint, free to damage."""
    return shutil.copytree(grpo_run / "checkpoints" / "step_000001", tmp_path / "ck")


@pytest.fixture
def reward_model(tmp_path):
    """A saved scalar-head (reward) model folder of the tiny model, free to damage."""
    model, tokenizer = tiny_model(seed=0)
    return ScalarHeadModel.from_causal_lm(model).save(tmp_path / "rm", tokenizer)


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _rewrite_weights(path, drop=(), add=None):
    """Rewrite a safetensors file without the `drop` tensors and with the `add` ones."""
    tensors = load_file(path)
    for key in drop:
        del tensors[key]
    tensors.update(add or {})
    save_file(tensors, path, metadata={"format": "pt"})


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _eval_fails_in_one_line(checkpoint, capsys) -> str:
    """`yatt eval CHECKPOINT` exits 2 with one error line and no traceback; returns it."""
    capsys.readouterr()
    assert main(["eval", str(checkpoint)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert not any("Traceback" in line for line in err), captured.err
    assert "LOAD REPORT" not in captured.err + captured.out  # (transformers' table of keys)
    assert err[-1].startswith("yatt: error: ")
    return err[-1]


# ---------------------------------------------------------------- 1. a garbled chat template


@pytest.mark.parametrize("kept_in", ["chat_template.jinja", "tokenizer_config.json"])
def test_a_garbled_chat_template_names_the_file(checkpoint, capsys, kept_in):
    policy = policy_folder(checkpoint)
    if kept_in == "chat_template.jinja":
        (policy / kept_in).write_text(GARBLED)
        where = f"chat template {policy / kept_in}"
    else:  # (an older folder keeps it in tokenizer_config.json)
        (policy / "chat_template.jinja").unlink()
        settings = json.loads((policy / kept_in).read_text())
        (policy / kept_in).write_text(json.dumps({**settings, "chat_template": GARBLED}))
        where = f"chat template of {policy / kept_in}"
    tokenizer = load_tokenizer(policy)
    with pytest.raises(ModelError) as exc_info:
        render_prompt(PromptExample("What is 1 + 1?"), tokenizer)
    assert _one_line(exc_info) == (
        f"{where}: syntax error at line 1: Expected an expression, got 'end of statement block'; "
        "fix it, or set data.use_chat_template=false"
    )
    assert render_prompt(PromptExample("1 + 1?"), tokenizer, use_chat_template=False) == "1 + 1?"
    line = _eval_fails_in_one_line(checkpoint, capsys)
    assert f"{where}: syntax error at line 1" in line


def test_resuming_a_checkpoint_with_a_garbled_chat_template_fails_and_loses_nothing(
    grpo_run, tmp_path
):
    run_dir = shutil.copytree(grpo_run, tmp_path / "run")
    checkpoint = run_dir / "checkpoints" / "step_000001"
    template = policy_folder(checkpoint) / "chat_template.jinja"
    template.write_text("line one\n{{ messages[0]['content'] }\n")
    before = _snapshot(run_dir)
    overrides = [*TINY, "train.steps=2", f"checkpoint.resume={checkpoint}",
                 f"logging.run_dir={run_dir}"]  # fmt: skip
    with pytest.raises(ModelError) as exc_info:
        Trainer(load_config("tiny_test", overrides))
    message = _one_line(exc_info)
    assert message.startswith(f"chat template {template}: syntax error at line 2: ")
    assert _snapshot(run_dir) == before


def test_a_chat_template_that_fails_on_a_prompt_names_the_row():
    _, tokenizer = tiny_model(seed=0)
    tokenizer.chat_template = "{{ raise_exception('System role not supported') }}"
    example = PromptExample("What is 1 + 1?", "2", source="rows.jsonl:3")
    with pytest.raises(ModelError) as exc_info:
        render_prompt(example, tokenizer)
    message = _one_line(exc_info)
    # (set in memory, not the one in the tokenizer's folder: the tokenizer is named instead)
    assert message.startswith("the chat template of tokenizer '")
    assert message.endswith(
        "failed on the prompt of rows.jsonl:3: TemplateError: System role not supported"
    )


# ---------------------------------------------------------------- 2. a config.json field


def test_a_config_json_field_of_the_wrong_type_names_file_and_field(checkpoint, capsys):
    config = policy_folder(checkpoint) / "config.json"
    config.write_text(
        config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": "two"')
    )
    assert '"two"' in config.read_text()
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelError) as exc_info:
            load(policy_folder(checkpoint))
        message = _one_line(exc_info)
        assert "config.json is invalid: Validation error for field 'num_hidden_layers'" in message
        assert "expected int, got str (value: 'two')" in message
        assert str(policy_folder(checkpoint)) in message
    line = _eval_fails_in_one_line(checkpoint, capsys)
    assert "config.json is invalid" in line and "'num_hidden_layers'" in line


def test_a_critic_config_json_field_of_the_wrong_type_is_one_line(ppo_run, tmp_path):
    critic = shutil.copytree(ppo_run / "checkpoints" / "step_000001" / "critic", tmp_path / "c")
    config = critic / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 64', '"hidden_size": "wide"'))
    with pytest.raises(ModelError) as exc_info:
        ScalarHeadModel.from_pretrained(critic)
    message = _one_line(exc_info)
    assert message.startswith(f"cannot load backbone from '{critic}': config.json is invalid")
    assert "'hidden_size'" in message


# ---------------------------------------------------------------- 3. truncated weights


def test_a_truncated_reward_model_names_the_file(reward_model, tmp_path, capsys):
    _truncate(reward_model / "model.safetensors")
    with pytest.raises(ModelError) as exc_info:
        ScalarHeadModel.from_pretrained(reward_model, trained_head="reward.model_path")
    assert _one_line(exc_info).startswith(
        f"cannot load backbone from '{reward_model}': model.safetensors is unreadable "
        "(truncated or not safetensors): "
    )
    args = ["train", "tiny_test", *TINY, f"reward.model_path={reward_model}",
            f"logging.run_dir={tmp_path / 'run'}"]  # fmt: skip
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err)
    assert err[-1].startswith(f"yatt: error: cannot load backbone from '{reward_model}'")
    assert "model.safetensors is unreadable" in err[-1]


def test_resuming_a_ppo_checkpoint_with_truncated_critic_weights_fails_and_loses_nothing(
    ppo_run, tmp_path
):
    run_dir = shutil.copytree(ppo_run, tmp_path / "run")
    checkpoint = run_dir / "checkpoints" / "step_000001"
    _truncate(checkpoint / "critic" / "model.safetensors")
    before = _snapshot(run_dir)
    overrides = [*TINY, "algo.name=ppo", "train.steps=2", f"checkpoint.resume={checkpoint}",
                 f"logging.run_dir={run_dir}"]  # fmt: skip
    with pytest.raises(ModelError) as exc_info:
        Trainer(load_config("tiny_test", overrides))
    assert _one_line(exc_info).startswith(
        f"cannot load backbone from '{checkpoint / 'critic'}': model.safetensors is unreadable"
    )
    assert _snapshot(run_dir) == before


# ---------------------------------------------------------------- 4. missing or extra weights


def test_a_policy_that_lacks_a_weight_is_refused(checkpoint, capsys):
    policy = policy_folder(checkpoint)
    _rewrite_weights(policy / "model.safetensors", drop=[GATE])
    with pytest.raises(ModelError) as exc_info:
        load_model(policy)
    assert _one_line(exc_info) == (
        f"cannot load model from '{policy}': model.safetensors lacks 1 weight the model needs: "
        f"'{GATE}'"
    )
    line = _eval_fails_in_one_line(checkpoint, capsys)
    assert line.endswith(f"model.safetensors lacks 1 weight the model needs: '{GATE}'")


def test_the_count_of_missing_and_unexpected_weights_is_given(checkpoint):
    policy = policy_folder(checkpoint)
    weights = policy / "model.safetensors"
    original = weights.read_bytes()
    dropped = [GATE, "model.norm.weight", "model.layers.1.self_attn.q_proj.weight",
               "model.layers.1.self_attn.k_proj.weight"]  # fmt: skip
    _rewrite_weights(weights, drop=dropped)
    with pytest.raises(ModelError) as exc_info:
        load_model(policy)
    assert _one_line(exc_info).endswith(
        "model.safetensors lacks 4 weights the model needs: 'model.layers.0.mlp.gate_proj.weight'"
        ", 'model.layers.1.self_attn.k_proj.weight', 'model.layers.1.self_attn.q_proj.weight'"
        ", ..."
    )
    weights.write_bytes(original)
    _rewrite_weights(weights, add={"model.layers.7.extra.weight": torch.zeros(2)})
    with pytest.raises(ModelError) as exc_info:
        load_model(policy)
    assert _one_line(exc_info).endswith(
        "model.safetensors holds 1 weight the model has no place for: 'model.layers.7.extra.weight'"
    )
    weights.write_bytes(original)
    assert isinstance(load_model(policy), torch.nn.Module)


def test_a_critic_that_lacks_a_weight_is_refused(ppo_run, tmp_path):
    critic = shutil.copytree(ppo_run / "checkpoints" / "step_000001" / "critic", tmp_path / "c")
    _rewrite_weights(critic / "model.safetensors", drop=["layers.0.mlp.gate_proj.weight"])
    with pytest.raises(ModelError) as exc_info:
        ScalarHeadModel.from_pretrained(critic)
    assert _one_line(exc_info) == (
        f"cannot load backbone from '{critic}': model.safetensors lacks 1 weight the model "
        "needs: 'layers.0.mlp.gate_proj.weight'"
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fresh_models_with_tied_embeddings_still_load(arch, tmp_path):
    model, tokenizer = tiny_model(arch, seed=3)
    folder = save_checkpoint(model, tokenizer, tmp_path / "m")
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")  # tied: not saved
    loaded = load_model(folder)
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    backbone = ScalarHeadModel.from_pretrained(folder).backbone  # a critic from a causal LM
    assert torch.equal(backbone.embed_tokens.weight, model.model.embed_tokens.weight)


def test_an_untied_causal_lm_loads_as_a_backbone(tmp_path):
    # Its lm_head.weight is a weight a backbone has no place for: dropped by design.
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1)
    heads = dict(num_attention_heads=2, num_key_value_heads=1)
    config = LlamaConfig(**sizes, **heads, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    assert "lm_head.weight" in load_file(tmp_path / "m" / "model.safetensors")
    assert load_model(tmp_path / "m").lm_head.weight is not None
    assert ScalarHeadModel.from_pretrained(tmp_path / "m").backbone.config.hidden_size == 16


@pytest.mark.slow
def test_the_shipped_smollm2_still_loads():
    from yatt.models import prepare_model

    folder = prepare_model("smollm2")
    model = load_model("smollm2")
    assert model.lm_head.weight is model.get_input_embeddings().weight
    ScalarHeadModel.from_pretrained(folder)
