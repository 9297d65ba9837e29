"""LoRA adapters (`model.lora_rank`): the adapted model starts as the base, trains only its
adapters, samples with the merged weights, is its own KL reference with the adapters off, saves
a plain merged model plus its adapters, resumes exactly, and moves only the adapters between
workers."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from yatt.builders import adapt_model, build_model
from yatt.config import LORA_TARGETS, ModelConfig, load_config
from yatt.control import ControlConfig, make_controller
from yatt.control.workers import payload_nbytes
from yatt.errors import ConfigError, ModelError
from yatt.lora import (
    ADAPTER_FILE,
    ADAPTER_META,
    LoraLinear,
    adapters_off,
    apply_lora,
    load_trained_state,
    merged_state_dict,
    plain_copy,
    trained_state,
)
from yatt.models import save_checkpoint, tiny_model
from yatt.rollout import make_engine
from yatt.rollout.sampling import SamplingParams
from yatt.trainer import Trainer

IDS = torch.tensor([[1, 5, 9, 14, 2, 7]])


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def _adapted(rank=4, alpha=8.0, seed=0, targets=LORA_TARGETS):
    model, tokenizer = tiny_model(seed=seed)
    apply_lora(model, rank, alpha, targets)
    return model, tokenizer


def _perturb(model, seed=1):
    """Random B matrices, so the adapters change what the model computes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("lora_b"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


def test_an_adapted_model_starts_as_its_base_and_trains_only_its_adapters():
    base, _ = tiny_model(seed=0)
    model, _ = _adapted()
    assert torch.equal(_logits(base), _logits(model))  # B = 0
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    assert len(layers) == 7 * model.config.num_hidden_layers
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(name.endswith(("lora_a", "lora_b")) for name in trained)
    assert set(trained_state(model)) == trained
    only_attention, _ = _adapted(targets=("q_proj", "v_proj"))
    assert len(trained_state(only_attention)) == 2 * 2 * model.config.num_hidden_layers


def test_merged_weights_compute_what_the_adapters_do_and_off_is_the_base():
    base, _ = tiny_model(seed=0)
    model, _ = _adapted()
    _perturb(model)
    adapted = _logits(model)
    assert not torch.allclose(adapted, _logits(base))
    torch.testing.assert_close(_logits(plain_copy(model)), adapted, rtol=1e-4, atol=1e-4)
    with adapters_off(model):
        assert torch.equal(_logits(model), _logits(base))
        with adapters_off(model):  # nested: still off when the inner block ends
            pass
        assert torch.equal(_logits(model), _logits(base))
    assert torch.equal(_logits(model), adapted)  # back on after the block
    merged = tiny_model(seed=3)[0]  # other weights: all come from the state dict
    merged.load_state_dict(merged_state_dict(model))
    torch.testing.assert_close(_logits(merged), adapted, rtol=1e-4, atol=1e-4)


def test_the_fused_sampler_decodes_with_the_merged_weights_and_sees_adapter_updates():
    model, tokenizer = _adapted()
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    engine = make_engine("yatt", model, tokenizer)
    prompt = [[1, 5, 9, 14]]
    before = engine.generate(prompt, params, seeds=[0])[0].token_ids
    _perturb(model)  # an optimizer step changes the adapters in place
    after = engine.generate(prompt, params, seeds=[0])[0].token_ids
    plain = make_engine("yatt", plain_copy(model), tokenizer)
    assert after == plain.generate(prompt, params, seeds=[0])[0].token_ids
    hf = make_engine("hf", model, tokenizer)  # the HF forward through the adapter layers
    assert after == hf.generate(prompt, params, seeds=[0])[0].token_ids
    assert before != after
    # bf16 sampling casts the merged weights, as it casts a plain model's
    bf16 = make_engine("yatt", model, tokenizer, dtype=torch.bfloat16)
    plain_bf16 = make_engine("yatt", plain_copy(model), tokenizer, dtype=torch.bfloat16)
    assert (bf16.generate(prompt, params, seeds=[0])[0].token_ids
            == plain_bf16.generate(prompt, params, seeds=[0])[0].token_ids)  # fmt: skip


def test_trained_state_moves_the_adapters_alone():
    source, _ = _adapted()
    _perturb(source)
    target, _ = _adapted()
    state = trained_state(source)
    whole = sum(t.numel() for t in source.state_dict().values())
    assert sum(t.numel() for t in state.values()) < whole / 10
    load_trained_state(target, state)
    assert torch.equal(_logits(target), _logits(source))
    with pytest.raises(ModelError, match="do not fit this model: they lack 1 tensors"):
        load_trained_state(target, dict(list(state.items())[1:]))
    stray = state | {"model.layers.9.mlp.up_proj.lora_a": torch.zeros(1)}
    with pytest.raises(ModelError, match=r"they hold 1 unknown, e\.g\. 'model\.layers\.9"):
        load_trained_state(target, stray)


def test_a_saved_adapted_model_is_a_plain_model_plus_its_adapters(tmp_path):
    model, tokenizer = _adapted(rank=4, alpha=8.0)
    _perturb(model)
    folder = save_checkpoint(model, tokenizer, tmp_path / "saved")
    assert json.loads((folder / ADAPTER_META).read_text()) == {
        "rank": 4, "alpha": 8.0, "targets": sorted(LORA_TARGETS)}  # fmt: skip
    plain = AutoModelForCausalLM.from_pretrained(folder)  # no adapter layers, merged weights
    assert not any(isinstance(m, LoraLinear) for m in plain.modules())
    torch.testing.assert_close(_logits(plain), _logits(model), rtol=1e-4, atol=1e-4)
    # resuming: the base from model.path, the adapters from the checkpoint, bit for bit
    config = ModelConfig(path="tiny", lora_rank=4, lora_alpha=8.0)
    resumed, _ = build_model(config, resume_from=str(folder))
    assert all(torch.equal(v, trained_state(resumed)[k]) for k, v in trained_state(model).items())
    assert torch.equal(_logits(resumed), _logits(model))
    with pytest.raises(ConfigError, match="has adapters of rank 4, alpha 8; this run has"):
        build_model(ModelConfig(path="tiny", lora_rank=2, lora_alpha=8.0), str(folder))
    other_base = ModelConfig(path="tiny", tiny_seed=1, lora_rank=4, lora_alpha=8.0)
    with pytest.raises(ConfigError, match="were trained on another base model than"):
        build_model(other_base, resume_from=str(folder))
    with pytest.raises(ConfigError, match="the model given has adapters of rank 4, alpha 8"):
        adapt_model(model, ModelConfig(path="tiny", lora_rank=8))
    with pytest.raises(ConfigError, match="trained with LoRA adapters, and this run has"):
        build_model(ModelConfig(path="tiny"), resume_from=str(folder))
    # a plain model saved into the same folder leaves no stale adapters there
    save_checkpoint(tiny_model(seed=0)[0], tokenizer, folder)
    assert not (folder / ADAPTER_FILE).exists() and not (folder / ADAPTER_META).exists()
    with pytest.raises(ConfigError, match="trained without LoRA adapters"):
        build_model(config, resume_from=str(folder))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lora_rank=-1", "'model.lora_rank'; expected an int >= 0"),
        ("model.lora_alpha=0", "'model.lora_alpha'; expected a number > 0"),
        ("model.lora_targets=[q_proj,lm_head]", "'model.lora_targets'; expected distinct names"),
        ("model.lora_targets=[]", "'model.lora_targets'; expected distinct names"),
    ],
)
def test_bad_lora_settings_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny_test", [override])


def test_vllm_sampling_refuses_adapters():
    with pytest.raises(ConfigError, match=r"model\.lora_rank=8 with rollout\.backend=vllm"):
        load_config("tiny_test", ["model.lora_rank=8", "rollout.backend=vllm"])


def test_no_adapter_fits_a_model_without_the_targeted_layers():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ConfigError, match=r"model.lora_targets=\['q_proj'\] matched no linear"):
        apply_lora(model, 2, 4.0, ("q_proj",))


TRAIN = ["train.steps=4", "eval.n=0", "algo.kl_coef=0.1", "optim.lr=1e-2", "train.seed=3",
         "reward.fns=[yatt.control.workload:char_mix_reward]",
         "model.lora_rank=4", "model.lora_alpha=8", "checkpoint.every=2",
         "eval.at_start=false", "eval.at_end=false"]  # fmt: skip


def test_grpo_with_adapters_keeps_the_base_and_resumes_exactly(tmp_path):
    """The base weights never change; the KL reference is the policy with its adapters off
    (no copy); a run resumed from its step-2 checkpoint ends as the uninterrupted one."""
    base, _ = tiny_model(seed=0)
    straight = Trainer(load_config("tiny_test", [*TRAIN, f"logging.run_dir={tmp_path / 'a'}"]))
    assert straight.reference.model is straight.policy.model
    straight_result = straight.fit()
    model = straight.policy.model
    for name, param in base.named_parameters():
        assert torch.equal(param, model.get_parameter(name)), name  # frozen
    assert any(v.abs().sum() > 0 for k, v in trained_state(model).items() if "lora_b" in k)
    assert all(row["actor/kl"] >= 0 for row in straight_result.history if "actor/kl" in row)
    assert max(row["actor/kl"] for row in straight_result.history if "actor/kl" in row) > 0
    # interrupted after step 2, then resumed from its checkpoint
    cut = tmp_path / "b"
    Trainer(load_config("tiny_test", [*TRAIN, f"logging.run_dir={cut}"])).fit(until_step=2)
    checkpoint = cut / "checkpoints" / "step_000002"
    assert (checkpoint / "policy" / ADAPTER_FILE).is_file()
    resumed = Trainer(load_config("tiny_test", [*TRAIN, f"logging.run_dir={cut}",
                                                f"checkpoint.resume={checkpoint}"]))  # fmt: skip
    resumed.fit()
    for key, value in trained_state(model).items():
        assert torch.equal(value, trained_state(resumed.policy.model)[key]), key


CONTROL = ["train.steps=2", "algo.prompts_per_step=2", "rollout.n_samples=4",
           "optim.lr=1e-2", "rollout.max_new_tokens=6", "data.n_train=16", "data.n_heldout=0",
           "eval.n=0"]  # fmt: skip


def test_the_controllers_resume_an_adapted_run_exactly(tmp_path, monkeypatch):
    """A distributed run's checkpoint holds the adapters; its resume loads them onto the base
    on every worker and ends as the uninterrupted run; a plain run may not resume it."""
    import shutil

    from yatt.control import fit_distributed
    from yatt.control.controller import Controller

    final: dict = {}
    close = Controller.close

    def keep_weights(controller):
        final.clear()
        final.update(controller.weights())
        close(controller)

    monkeypatch.setattr(Controller, "close", keep_weights)
    control = ControlConfig(backend="inprocess", n_devices=1, device_kind="cpu",
                            extra_rewards=("yatt.control.workload:char_mix_reward",))  # fmt: skip
    settings = [*CONTROL, "train.steps=4", "checkpoint.every=2", "model.lora_rank=4"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    fit_distributed(load_config("tiny_test", [*settings, f"logging.run_dir={whole}"]), control)
    uninterrupted = dict(final)
    shutil.copytree(whole, cut)  # as a crash in step 3 leaves it
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    lines = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut / "metrics.jsonl").write_text("".join(lines[:2]))
    resumed = [*settings, f"logging.run_dir={cut}", "checkpoint.resume=latest"]
    assert len(fit_distributed(load_config("tiny_test", resumed), control).history) == 2
    assert set(final) == set(uninterrupted) and any(k.endswith("lora_b") for k in final)
    assert all(torch.equal(final[k], uninterrupted[k]) for k in uninterrupted)
    checkpoint = cut / "checkpoints" / "step_000002"
    plain = [*CONTROL, "train.steps=4", f"logging.run_dir={tmp_path / 'plain'}",
             f"checkpoint.resume={checkpoint}"]  # fmt: skip
    with pytest.raises(ConfigError, match="was trained with LoRA adapters, and this run has"):
        fit_distributed(load_config("tiny_test", plain), control)


def _controllers(lora: bool, mode: str):
    config = load_config("tiny_test", CONTROL + (["model.lora_rank=4"] if lora else []))
    control = ControlConfig(backend="inprocess", n_devices=2, device_kind="cpu", mode=mode,
                            placement="disaggregated", n_sampler=1,
                            extra_rewards=("yatt.control.workload:char_mix_reward",))  # fmt: skip
    controller = make_controller(config, control)
    try:
        run = controller.fit()
        push = controller.cluster.ranks.handles[0].call("weights", True)  # what a sync sends
        return run, controller.weights(), payload_nbytes(push)
    finally:
        controller.close()


def test_controllers_train_adapters_alike_in_both_modes_and_push_only_them():
    single, parallel = (_controllers(True, mode) for mode in ("single", "parallel"))
    (single_run, single_w, lora_push), (parallel_run, parallel_w, _) = single, parallel
    assert set(single_w) == {k for k in single_w if k.endswith(("lora_a", "lora_b"))}
    assert all(torch.equal(single_w[k], parallel_w[k]) for k in single_w)
    assert any(v.abs().sum() > 0 for k, v in single_w.items() if k.endswith("lora_b"))
    for key in ("critic/score/mean", "actor/grad_norm"):
        assert single_run.history[-1][key] == parallel_run.history[-1][key], key
    _, full_w, full_push = _controllers(False, "parallel")
    adapter_bytes = sum(v.numel() * 4 for v in single_w.values())
    assert adapter_bytes <= lora_push < 1.1 * adapter_bytes  # (plus the tensors' names)
    # (the tiny model ties its LM head to the embedding: one tensor, pushed once)
    pushed = sum(v.numel() * 4 for k, v in full_w.items() if k != "lm_head.weight")
    assert full_push >= pushed > 100 * lora_push


def test_sft_with_adapters_lowers_the_loss_and_saves_them_merged(tmp_path):
    from yatt.sft import run_sft

    base, _ = tiny_model(seed=0)
    config = load_config("tiny_test", ["train.steps=12", "optim.lr=1e-2", "model.lora_rank=8",
                                       "algo.micro_batch_size=4", "data.n_train=8",
                                       "data.n_heldout=0", "eval.n=0",
                                       f"logging.run_dir={tmp_path}"])  # fmt: skip
    folder = run_sft(config)
    rows = [json.loads(line) for line in (tmp_path / "sft_metrics.jsonl").read_text().splitlines()]
    losses = [row["sft/loss"] for row in rows]
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    assert (folder / ADAPTER_FILE).is_file()
    merged = AutoModelForCausalLM.from_pretrained(folder)
    moved = [name for name, param in base.named_parameters()
             if not torch.equal(param, merged.get_parameter(name))]  # fmt: skip
    assert moved and all(name.endswith(tuple(f"{t}.weight" for t in LORA_TARGETS))
                         for name in moved)  # fmt: skip


def test_ppo_with_adapters_trains_a_whole_critic_beside_them(tmp_path):
    reward = "reward.fns=[yatt.control.workload:char_mix_reward]"
    overrides = ["train.steps=2", "eval.n=0", "algo.name=ppo", reward, "model.lora_rank=4"]
    config = load_config("tiny_test", [*overrides, f"logging.run_dir={tmp_path}"])
    trainer = Trainer(config)
    result = trainer.fit()
    critic = trainer.critic.model
    assert not any(isinstance(m, LoraLinear) for m in critic.modules())
    assert all(p.requires_grad for p in critic.parameters())
    rows = [row for row in result.history if "critic/vf_loss" in row]
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["critic/vf_loss"])) for r in rows)


def test_the_lora_bench_measures_both_variants_side_by_side(bench_script, tmp_path):
    bench = bench_script("lora")
    argv = ["--variants", "full,lora_r8", "--steps", "1", "--warmup", "0", "--threads", "1",
            "--preset", "tiny_test", "--out-dir", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    full, lora = json.loads((tmp_path / "yatt_lora.json").read_text())["results"]
    assert full["reference_copy"] and not lora["reference_copy"]
    assert lora["trained_params"] < 0.01 * full["trained_params"] == 0.01 * full["all_params"]
    assert lora["sync_bytes"] * 100 < full["sync_bytes"]
    assert lora["optimizer_state_bytes"] * 100 < full["optimizer_state_bytes"]
    assert "| lora_r8 |" in (tmp_path / "yatt_lora.md").read_text()
    assert (tmp_path / "yatt_lora.png").stat().st_size > 0


def test_a_damaged_weights_file_in_the_adapter_check_is_one_line(tmp_path):
    from yatt.lora import check_same_base

    model, _ = tiny_model(seed=0)
    apply_lora(model, 4, 8.0, ("q_proj",))
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{trunc")
    with pytest.raises(
        ConfigError, match=r"cannot read .*model\.safetensors to check the adapters"
    ):
        check_same_base(model, tmp_path, "base")
