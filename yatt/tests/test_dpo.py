"""`yatt dpo`: the policy trained on preference pairs against itself before training, the DPO
loss, the sequence log-probs it is made of, and the settings it refuses in one line."""

import json
import math

import pytest
import torch

from yatt.algos.losses import dpo_loss
from yatt.cli import main
from yatt.config import load_config
from yatt.dpo import run_dpo, sequence_logprobs
from yatt.errors import ConfigError
from yatt.models import load_model, tiny_model
from yatt.report import load_history, summary_table

FAST = ["train.steps=4", "data.n_train=24", "data.n_heldout=8", "eval.n=8",
        "algo.micro_batch_size=4"]  # fmt: skip


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "dpo_metrics.jsonl").read_text().splitlines()]


def test_the_dpo_loss_is_log_2_at_the_reference_and_pushes_chosen_up_and_rejected_down() -> None:
    chosen = torch.tensor([-3.0, -5.0], requires_grad=True)
    rejected = torch.tensor([-4.0, -2.0], requires_grad=True)
    loss, reward_chosen, reward_rejected = dpo_loss(
        chosen, rejected, chosen.detach(), rejected.detach(), beta=0.5
    )
    assert float(loss.detach()) == pytest.approx(math.log(2))
    assert reward_chosen.tolist() == [0.0, 0.0] and reward_rejected.tolist() == [0.0, 0.0]
    loss.backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()
    # away from the reference: -log sigmoid(beta * ((c - rc) - (r - rr)))
    logps = [torch.tensor([value]) for value in (-1.0, -6.0, -2.0, -4.0)]
    loss, reward_chosen, _ = dpo_loss(*logps, beta=0.5)
    assert float(loss) == pytest.approx(-math.log(1 / (1 + math.exp(-0.5 * 3.0))))
    assert reward_chosen.tolist() == [0.5]


def _logsigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


@pytest.mark.parametrize(
    ("kind", "smoothing", "expected"),
    [  # one pair: log-ratios chosen +2, rejected -1 (h = 3), 4 and 2 tokens, beta 0.5
        ("sigmoid", 0.0, -_logsigmoid(1.5)),
        ("sigmoid", 0.1, -0.9 * _logsigmoid(1.5) - 0.1 * _logsigmoid(-1.5)),
        ("robust", 0.1, (-0.9 * _logsigmoid(1.5) + 0.1 * _logsigmoid(-1.5)) / 0.8),
        ("hinge", 0.0, 0.0),  # 1 - 1.5 < 0
        ("ipo", 0.0, (2 / 4 - (-1) / 2 - 1 / (2 * 0.5)) ** 2),  # per-token ratios: 0.5 + 0.5
    ],
)  # fmt: skip
def test_each_dpo_loss_kind_is_its_function_of_the_log_ratios(kind, smoothing, expected) -> None:
    logps = [torch.tensor([value]) for value in (-1.0, -6.0, -3.0, -5.0)]  # c, r, ref c, ref r
    lengths = (torch.tensor([4]), torch.tensor([2]))
    loss, chosen, rejected = dpo_loss(*logps, 0.5, kind, smoothing, lengths)
    assert float(loss) == pytest.approx(expected)
    assert (chosen.tolist(), rejected.tolist()) == ([1.0], [-0.5])  # beta x the log-ratios


@pytest.mark.parametrize("kind", ["sigmoid", "robust", "hinge", "ipo"])
def test_every_dpo_loss_pushes_chosen_up_and_rejected_down_at_the_reference(kind) -> None:
    chosen = torch.tensor([-3.0, -5.0], requires_grad=True)
    rejected = torch.tensor([-4.0, -2.0], requires_grad=True)
    lengths = (torch.tensor([3, 5]), torch.tensor([2, 2]))
    smoothing = 0.2 if kind in ("sigmoid", "robust") else 0.0
    loss, _, _ = dpo_loss(chosen, rejected, chosen.detach(), rejected.detach(), 0.5, kind,
                          smoothing, lengths)  # fmt: skip
    loss.backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()


def test_the_dpo_loss_refuses_what_it_cannot_compute() -> None:
    logps = [torch.tensor([value]) for value in (-1.0, -6.0, -3.0, -5.0)]
    with pytest.raises(ConfigError, match="unknown DPO loss 'kto'"):
        dpo_loss(*logps, 0.5, "kto")
    with pytest.raises(ConfigError, match=r"label smoothing must be in \[0, 0.5\)"):
        dpo_loss(*logps, 0.5, "robust", 0.5)
    with pytest.raises(ValueError, match="token counts"):
        dpo_loss(*logps, 0.5, "ipo")


def test_sequence_logprobs_sum_the_response_tokens_whatever_the_padding() -> None:
    model, _ = tiny_model(seed=0)
    model.eval()
    prompts, responses = [[5, 6, 7], [8], [9, 10]], [[11, 12], [13, 14, 15], [16]]
    with torch.no_grad():
        batched = sequence_logprobs(model, prompts, responses)
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            ids = torch.tensor([prompt + response])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            own = sum(float(logp[len(prompt) - 1 + k, token]) for k, token in enumerate(response))
            assert float(batched[row]) == pytest.approx(own, abs=1e-4)


def _shared_passes(layer_passes, prompts, responses, groups) -> list[tuple[int, int]]:
    """The (rows, columns) of each pass `sequence_logprobs` makes over `groups` on a float64
    tiny model (the orders of summing then agree), once its log-probs and every parameter's
    gradient were checked equal to the whole rows'."""
    model, _ = tiny_model(seed=0)
    model = model.to(torch.float64).eval()
    whole = sequence_logprobs(model, prompts, responses)
    whole.sum().backward()
    grads = [param.grad.clone() for param in model.parameters()]
    model.zero_grad()
    with layer_passes(model) as widths:
        shared = sequence_logprobs(model, prompts, responses, groups)
    shared.sum().backward()
    assert torch.allclose(shared, whole, atol=1e-5)
    for grad, param in zip(grads, model.parameters(), strict=True):
        assert torch.allclose(param.grad, grad, atol=1e-5)
    return widths


def test_a_pairs_shared_prompt_runs_once_with_the_same_logprobs_and_gradients(layer_passes):
    prompts, responses = [[5, 6, 7], [8], [5, 6, 7], [8]], [[11, 12], [13, 14, 15], [16], [17]]
    widths = _shared_passes(layer_passes, prompts, responses, torch.tensor([0, 1, 0, 1]))
    assert widths == [(2, 3), (4, 2)]  # the 2 prompts once, then the 4 responses on their caches


def test_a_batchs_common_prompt_start_runs_once_with_the_same_logprobs_and_gradients(
    layer_passes,
) -> None:
    """Prompts that begin alike (a chat template's system turn): that beginning goes through
    the model once, each pair's rest of its prompt once, then the responses."""
    system = list(range(20, 30))  # 10 shared tokens
    prompts = [[*system, 5, 6, 7], [*system, 8], [*system, 5, 6, 7], [*system, 8]]
    responses = [[11, 12], [13, 14, 15], [16], [17]]
    widths = _shared_passes(layer_passes, prompts, responses, torch.tensor([0, 1, 0, 1]))
    # the 10 shared tokens once, the 2 prompts' own 3 columns, the 4 responses' 2 columns
    assert widths == [(1, 10), (2, 3), (4, 2)]


def test_the_common_prompt_start_leaves_each_prompt_a_token_of_its_own() -> None:
    from yatt.algos.logprobs import common_prefix_length

    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2]]) == 1
    assert common_prefix_length([[1, 2, 3], [4, 2, 3]]) == 0
    assert common_prefix_length([[7]]) == 0


def test_a_dpo_run_writes_its_curve_its_evaluations_and_a_model_yatt_eval_reads(tmp_path) -> None:
    config = load_config("tiny_test", [*FAST, f"logging.run_dir={tmp_path / 'run'}"])
    folder = run_dpo(config)
    rows = _rows(tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["dpo/pairs"] == 24 and rows[0]["eval/problems"] == 8
    # the first step's policy is the reference: every implicit reward is 0
    assert rows[1]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert rows[1]["dpo/margin"] == pytest.approx(0.0, abs=1e-4)
    assert {"dpo/heldout_accuracy", "eval/accuracy"} <= rows[-1].keys()
    trained, (initial, _) = load_model(folder), tiny_model(seed=config.model.tiny_seed)
    assert any(not torch.equal(param, initial.state_dict()[name])
               for name, param in trained.state_dict().items())  # fmt: skip
    assert (folder / "config.yaml").is_file()
    assert summary_table(load_history(tmp_path / "run"), []).title == "yatt dpo summary"
    with pytest.raises(ConfigError, match="already holds a run"):
        run_dpo(config)


def test_dpo_moves_the_policy_towards_the_chosen_responses(tmp_path) -> None:
    """A tiny model on 8 slip pairs at a high rate: the loss falls well below log 2 and the
    training pairs end ranked right, chosen rewards up and rejected ones down."""
    config = load_config("tiny_test", [
        "train.steps=30", "data.n_train=8", "data.n_heldout=8", "eval.n=8",
        "algo.micro_batch_size=8", "algo.dpo_beta=0.5", "optim.lr=1e-3",
        f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    run_dpo(config)
    rows = _rows(tmp_path / "run")
    last = rows[-1]
    assert last["dpo/loss"] < 0.2 and last["dpo/accuracy"] == 1.0
    assert last["dpo/reward_chosen"] > 0 > last["dpo/reward_rejected"]


@pytest.mark.parametrize("kind", ["robust", "hinge", "ipo"])
def test_the_other_dpo_losses_learn_the_pairs_too(tmp_path, kind) -> None:
    """The run above with each other loss: the training pairs end ranked right."""
    smoothing = "0.1" if kind == "robust" else "0"
    config = load_config("tiny_test", [
        "train.steps=30", "data.n_train=8", "data.n_heldout=8", "eval.n=8",
        "algo.micro_batch_size=8", "algo.dpo_beta=0.5", "optim.lr=1e-3",
        f"algo.dpo_loss={kind}", f"algo.dpo_label_smoothing={smoothing}",
        f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    folder = run_dpo(config)
    rows = _rows(tmp_path / "run")
    assert rows[-1]["dpo/accuracy"] == 1.0 and rows[-1]["dpo/loss"] < rows[1]["dpo/loss"]
    assert rows[-1]["dpo/reward_chosen"] > 0 > rows[-1]["dpo/reward_rejected"]
    if kind == "robust":  # yatt eval leaves the run's DPO settings behind
        assert main(["eval", str(folder), "eval.n=4"]) == 0


def test_the_sft_weight_adds_the_chosen_responses_nll_to_the_loss(tmp_path) -> None:
    """RPO: at step 1 (the policy is the reference) the loss is log 2 plus the weight times
    the chosen responses' NLL per token, which training then lowers."""
    config = load_config("tiny_test", [
        "train.steps=20", "data.n_train=8", "data.n_heldout=8", "eval.n=0",
        "algo.micro_batch_size=8", "algo.dpo_beta=0.5", "optim.lr=1e-3",
        "algo.dpo_sft_weight=0.5", f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    run_dpo(config)
    rows = _rows(tmp_path / "run")
    first, last = rows[1], rows[-1]
    assert first["dpo/loss"] == pytest.approx(math.log(2) + 0.5 * first["dpo/chosen_nll"])
    assert first["dpo/chosen_nll"] > 1.0 and last["dpo/chosen_nll"] < first["dpo/chosen_nll"] / 2


def test_dpo_with_lora_trains_the_adapters_alone(tmp_path) -> None:
    from yatt.lora import has_lora

    config = load_config("tiny_test", [*FAST, "model.lora_rank=4", "optim.lr=1e-3",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    folder = run_dpo(config)
    assert (folder / "adapter.safetensors").is_file()
    base, _ = tiny_model(seed=config.model.tiny_seed)
    trained = load_model(folder)
    assert not has_lora(trained)  # saved merged
    changed = [name for name, param in trained.state_dict().items()
               if not torch.equal(param, base.state_dict()[name])]  # fmt: skip
    assert changed and all("proj" in name for name in changed)  # the adapted layers only


def test_dpo_from_sampled_pairs_logs_what_the_samples_gave(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["dpo", "tiny_test", *FAST, "data.rejected=both", "logging.plots=true",
                 f"logging.run_dir={run_dir}"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "yatt dpo summary" in err and "pairs from samples" in err
    first = _rows(run_dir)[0]
    assert first["dpo/sample_pairs"] > 0 and 0 <= first["dpo/samples_best"] <= 1
    assert first["dpo/pairs"] > 24  # the slips and the sampled pairs
    assert (run_dir / "dpo.png").stat().st_size > 0
    # yatt eval reads the run's config, leaving its pair settings (training's) behind
    assert main(["eval", str(run_dir / "model"), "eval.n=8"]) == 0
    assert "accuracy" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("override", "problem"),
    [("control.backend=ray", "yatt dpo runs in one process"),
     ("train.gradient_checkpointing=true", "does not act on train.gradient_checkpointing"),
     ("eval.every=2", "does not act on eval.every"),
     ("train.shared_prefix=false", "does not act on train.shared_prefix"),
     ("rollout.backend=vllm", "rollout.backend=yatt or hf"),
     ("algo.dpo_beta=0", "'algo.dpo_beta'"),
     ("algo.dpo_loss=kto", "'algo.dpo_loss'; expected one of"),
     ("algo.dpo_sft_weight=-1", "'algo.dpo_sft_weight'; expected >= 0"),
     ("algo.dpo_loss=ipo algo.dpo_label_smoothing=0.1", "0 with algo.dpo_loss=ipo"),
     ("eval.reward_fn=reasoning_gym", "cannot grade data.task='addition'"),
     ("data.rejected=samples reward.fns=[]", "for 'reward.fns'; expected at least one"),
     ("data.rejected=both data.path=/x.jsonl", "a data.path file gives its own chosen")],
)  # fmt: skip
def test_yatt_dpo_refuses_what_it_cannot_do_in_one_line(tmp_path, capsys, override, problem):
    run_dir = tmp_path / "run"
    argv = ["dpo", "tiny_test", *FAST, *override.split(), f"logging.run_dir={run_dir}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("yatt: error: ") and problem in err[-1], err
    assert not run_dir.exists()  # no empty run folder left behind


@pytest.mark.parametrize("command", ["train", "sft", "rm"])
def test_other_jobs_refuse_dpo_settings(tmp_path, capsys, command) -> None:
    argv = [command, "tiny_test", "algo.dpo_beta=0.3", f"logging.run_dir={tmp_path / 'run'}"]
    assert main(argv) == 2
    assert "reads no algo.dpo_* setting (yatt dpo's): drop algo.dpo_beta=0.3" in (
        capsys.readouterr().err
    )
    argv[2:3] = ["algo.dpo_loss=robust", "algo.dpo_label_smoothing=0.1"]
    assert main(argv) == 2
    assert "drop algo.dpo_loss=robust algo.dpo_label_smoothing=0.1" in capsys.readouterr().err


def test_a_run_that_scores_nothing_held_out_trains_and_saves(tmp_path) -> None:
    config = load_config("tiny_test", [*FAST, "eval.n=0", f"logging.run_dir={tmp_path / 'run'}"])
    assert run_dpo(config).is_dir()
    rows = _rows(tmp_path / "run")
    assert rows[0]["dpo/heldout_pairs"] == 0 and len(rows) == 5
    assert not any("eval/accuracy" in row or "dpo/heldout_accuracy" in row for row in rows)


def _pair_file(path, answers: bool) -> None:
    rows = [{"prompt": f"What is {k} + 1?", "chosen": str(k + 1), "rejected": f"{k + 3} or so",
             **({"answer": str(k + 1)} if answers else {})} for k in range(30)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize("answers", [True, False])
def test_a_pair_file_trains_and_ranks_its_held_out_pairs(tmp_path, caplog, answers) -> None:
    """A plain prompt/chosen/rejected file has no answers to grade: its held-out pairs are
    ranked and no accuracy is claimed (a warning says so); with answers, both."""
    path = tmp_path / "pairs.jsonl"
    _pair_file(path, answers)
    config = load_config("tiny_test", [*FAST, f"data.path={path}",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    run_dpo(config)
    last = _rows(tmp_path / "run")[-1]
    assert "dpo/heldout_accuracy" in last and ("eval/accuracy" in last) is answers
    assert ("measures no held-out accuracy" in caplog.text) is not answers


def test_a_pair_file_with_some_answers_missing_is_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "pairs.jsonl"
    _pair_file(path, answers=True)
    lines = path.read_text().splitlines()
    lines = [json.dumps({k: v for k, v in json.loads(line).items() if k != "answer"})
             if index % 2 else line for index, line in enumerate(lines)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    argv = ["dpo", "tiny_test", *FAST, f"data.path={path}", f"logging.run_dir={tmp_path / 'r'}"]
    assert main(argv) == 2
    assert "answer" in capsys.readouterr().err and not (tmp_path / "r").exists()
