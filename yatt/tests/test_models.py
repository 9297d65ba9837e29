"""Model loading and checkpoints: the bundled SmolLM2, tiny test models, error messages.

Method: round-trip tiny random-init models through `save_checkpoint` + `load_model` and compare
logits; check that bad names and folders raise ModelError naming them. The slow tests prepare the
real SmolLM2 once (cached in ~/.cache/yatt/models) and check it answers a simple sum.
"""

from pathlib import Path

import pytest
import torch

from yatt.errors import ConfigError, ModelError
from yatt.models import load_model, load_tokenizer, prepare_model, save_checkpoint, tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_checkpoint_round_trip_keeps_logits_and_chat_template(arch, tmp_path):
    torch.set_num_threads(1)
    model, tokenizer = tiny_model(arch, seed=7)
    folder = save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    assert (folder / "model.safetensors").is_file()
    loaded, loaded_tokenizer = load_model(folder), load_tokenizer(folder)
    ids = torch.tensor([[1, 50, 900, 3000]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.config.model_type == arch
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    rendered = loaded_tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == tokenizer.apply_chat_template(messages, tokenize=False)
    assert "What is 2 + 3?" in rendered


def test_saved_model_files_follow_the_umask(tmp_path):
    # safetensors 0.8 writes owner-only files whatever the umask (a shared run folder's group
    # could not read the weights)
    import os

    model, tokenizer = tiny_model("llama", seed=7)
    previous = os.umask(0o027)
    try:
        folder = save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == 0o640 and set(modes.values()) == {0o640}, modes


def test_tiny_models_differ_by_seed_and_use_the_real_tokenizer():
    first, tokenizer = tiny_model("llama", seed=0)
    second, _ = tiny_model("llama", seed=1)
    assert not torch.equal(first.lm_head.weight, second.lm_head.weight)
    assert torch.equal(first.lm_head.weight, tiny_model("llama", seed=0)[0].lm_head.weight)
    assert len(tokenizer) == 49152
    assert tokenizer.pad_token_id is not None
    assert tokenizer.chat_template
    assert not first.training


def test_bad_names_and_folders_raise_model_error(tmp_path):
    with pytest.raises(ModelError, match=r"'gpt-17'.*smollm2"):
        prepare_model("gpt-17")
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"config\.json"):
        load_model(tmp_path / "empty")
    with pytest.raises(ModelError, match=r"tokenizer_config\.json"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(ConfigError, match="'gpt2'"):
        tiny_model("gpt2")


def test_a_prepared_folder_replaces_an_incomplete_one_and_yields_to_a_complete_one(tmp_path):
    from yatt.models import _install

    def folder(name: str, files: tuple[str, ...]) -> Path:
        (tmp_path / name).mkdir()
        for file in files:
            (tmp_path / name / file).write_text(name)
        return tmp_path / name

    complete = ("config.json", "model.safetensors")
    target = folder("smollm2", ("config.json",))  # its weights were deleted by hand
    _install(folder(".staging1", complete), target)
    assert (target / "model.safetensors").read_text() == ".staging1"
    _install(folder(".staging2", complete), target)  # another process finished first
    assert (target / "model.safetensors").read_text() == ".staging1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".staging2", "smollm2"]  # (removed
    # by prepare_model's cleanup, as every staging folder is)


@pytest.mark.slow
def test_prepared_smollm2_is_cached_and_answers_a_sum():
    folder = prepare_model("smollm2")
    weights_mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert prepare_model("smollm2") == folder  # second call reuses the folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights_mtime
    model, tokenizer = load_model("smollm2"), load_tokenizer("smollm2")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    messages = [{"role": "user", "content": "What is 2 + 3? Answer with just the number."}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in answer, answer
