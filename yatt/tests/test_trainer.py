"""Trainer pieces: the prompt sampler's order and resumable state, LR schedules, SFT lowering
its loss on a tiny model, and the run outputs (plots, summary table, TensorBoard)."""

import json

import pytest

from yatt.config import load_config
from yatt.data import PromptSampler
from yatt.models import tiny_model
from yatt.report import summary_table, write_plots
from yatt.roles.policy import lr_lambda
from yatt.sft import heldout_loss, run_sft
from yatt.trainer import Trainer


def test_prompt_sampler_covers_each_epoch_and_resumes() -> None:
    sampler = PromptSampler(5, seed=1)
    first_epoch = sampler.take(5)
    assert sorted(first_epoch) == list(range(5))
    sampler.take(2)
    state = sampler.state_dict()
    expected = sampler.take(6)
    resumed = PromptSampler(5, seed=1)
    resumed.load_state_dict(state)
    assert resumed.take(6) == expected


@pytest.mark.parametrize(("schedule", "values"), [
    ("linear", [1.0, 0.75, 0.5, 0.25, 0.0]),
    ("constant", [1.0] * 5),
    ("cosine", [1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0]),
])  # fmt: skip
def test_lr_schedules(schedule, values) -> None:
    factor = lr_lambda(schedule, warmup_steps=0, total_steps=4)
    assert [factor(step) for step in range(5)] == pytest.approx(values)
    assert lr_lambda("linear", 2, 4)(0) == pytest.approx(0.5)


def test_sft_runs_the_prompts_shared_start_once_with_the_same_loss_and_gradients(
    layer_passes,
) -> None:
    """A chat template's system turn begins every prompt: with `common_start` it goes through
    the model once for the batch, with the loss and gradients of the whole rows."""
    import torch

    from yatt.sft import _pair_loss

    model, _ = tiny_model(seed=0)
    model = model.to(torch.float64).eval()
    system = list(range(20, 32))  # 12 shared tokens
    prompts, answers = [[*system, 5, 6], [*system, 7], [*system, 8, 9, 10]], [[11], [12, 13], [14]]
    losses, grads = [], []
    for common_start in (False, True):
        model.zero_grad()
        with layer_passes(model) as widths:
            loss = _pair_loss(model, prompts, answers, common_start)
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append([param.grad.clone() for param in model.parameters()])
    assert widths == [(1, 12), (3, 3), (3, 1)]  # the start, each prompt's rest, the answers
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)
    for whole, shared in zip(*grads, strict=True):
        assert torch.allclose(shared, whole, atol=1e-5)


def test_sft_with_gradient_checkpointing_takes_the_same_steps(tmp_path) -> None:
    """train.gradient_checkpointing recomputes each layer in the backward pass (whole rows):
    a decoder layer runs twice a step (its forward, then again in the backward pass), and
    the losses of the run are those of the plain run."""
    runs, calls = [], []
    for checkpointing in ("false", "true"):
        run_dir = tmp_path / checkpointing
        config = load_config("tiny_test", ["train.steps=3", "data.n_train=8", "eval.n=0",
                                           "algo.micro_batch_size=4",
                                           f"train.gradient_checkpointing={checkpointing}",
                                           f"logging.run_dir={run_dir}"])  # fmt: skip
        model, tokenizer = tiny_model(seed=config.model.tiny_seed)
        ran = []
        # (a layer's own hooks stay outside its checkpoint; its MLP is entered in the replay)
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *_, ran=ran: ran.append(1))
        run_sft(config, model=model, tokenizer=tokenizer)
        calls.append(len(ran))
        lines = (run_dir / "sft_metrics.jsonl").read_text().splitlines()
        runs.append([json.loads(line)["sft/loss"] for line in lines])
    # plain: 3 passes a step (the prompts' shared start, their rests, the answers);
    # checkpointed: whole rows, then the layer again in the backward pass
    assert calls == [3 * 3, 3 * 2]
    assert runs[1] == pytest.approx(runs[0], rel=1e-4)


def test_sft_lowers_loss_and_saves_a_model(tmp_path) -> None:
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["train.steps=12", "optim.lr=3e-3", "algo.micro_batch_size=4",
                                       "data.n_train=8", "data.n_heldout=3", "eval.n=3",
                                       "eval.every=6", f"logging.run_dir={tmp_path}"])  # fmt: skip
    heldout = _heldout_pairs(config, tokenizer)
    before = heldout_loss(model, *heldout, 2)
    seen = []
    folder = run_sft(config, model=model, tokenizer=tokenizer,
                     progress=lambda step, total, metrics: seen.append((step, total)))  # fmt: skip
    assert (folder / "model.safetensors").is_file()
    assert seen == [(step, 12) for step in range(1, 13)]
    rows = [json.loads(line) for line in (tmp_path / "sft_metrics.jsonl").read_text().splitlines()]
    losses = [row["sft/loss"] for row in rows]
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
    assert [row["step"] for row in rows if "sft/heldout_loss" in row] == [6, 12]
    assert rows[-1]["sft/heldout_loss"] == pytest.approx(heldout_loss(model, *heldout, 3))
    assert rows[-1]["sft/heldout_loss"] < before  # the answers' format carries over
    assert [row["sft/epoch"] for row in rows][:4] == [0.5, 1.0, 1.5, 2.0]  # 4 of 8 a step


def test_sft_stops_at_its_time_limit_and_saves_its_model(tmp_path) -> None:
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["train.steps=5", "train.time_limit_s=1e-9", "data.n_train=4",
                                       "data.n_heldout=2", "eval.n=2", "eval.at_end=true",
                                       f"logging.run_dir={tmp_path}"])  # fmt: skip
    folder = run_sft(config, model=model, tokenizer=tokenizer)
    assert (folder / "model.safetensors").is_file()
    rows = [json.loads(line) for line in (tmp_path / "sft_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]  # the limit was used up by the first step
    assert "sft/heldout_loss" in rows[0]  # the final evaluation still ran


def _heldout_pairs(config, tokenizer):
    from yatt.builders import build_data
    from yatt.sft import _encode_pairs

    _, heldout_set = build_data(config.data)
    return _encode_pairs(heldout_set, tokenizer, config.data.use_chat_template)


def test_sft_refuses_rows_without_answers_before_any_work(tmp_path, monkeypatch) -> None:
    from yatt.data import PromptExample
    from yatt.errors import DataError

    rows = [PromptExample("1 + 1 =", answer="2"), PromptExample("3 + 4 =", source="rows:2")]
    monkeypatch.setattr("yatt.builders.build_data", lambda cfg: (rows, []))
    config = load_config("tiny_test", ["eval.n=0", f"logging.run_dir={tmp_path}"])
    with pytest.raises(DataError, match="SFT needs an answer on every row; rows:2 has none"):
        run_sft(config, model=object(), tokenizer=object())
    monkeypatch.setattr("yatt.builders.build_data", lambda cfg: ([], []))
    with pytest.raises(DataError, match="SFT needs training rows"):
        run_sft(config, model=object(), tokenizer=object())
    assert not any(tmp_path.iterdir())


def test_sft_refuses_a_heldout_loss_without_heldout_rows(tmp_path) -> None:
    from yatt.errors import DataError

    config = load_config("tiny_test", ["data.n_heldout=0", f"logging.run_dir={tmp_path}"])
    with pytest.raises(DataError, match=r"held-out loss \(eval.n=8\) needs held-out rows"):
        run_sft(config, model=object(), tokenizer=object())
    assert not any(tmp_path.iterdir())  # refused before the run folder was claimed


def test_plots_and_summary_table(tmp_path) -> None:
    history = [{"step": 0.0, "eval/accuracy": 0.1}]
    for step in range(1, 6):
        history.append({"step": float(step), "critic/score/mean": step / 10, "timing_s/gen": 0.5,
                        "timing_s/update_actor": 0.3, "timing_s/step": 0.9,
                        "perf/throughput": 100.0})  # fmt: skip
    history.append({"step": 5.0, "eval/accuracy": 0.4})
    paths = write_plots(history, tmp_path)
    assert all(path.stat().st_size > 1000 for path in paths)
    table = summary_table(history, [(0, 0.1), (5, 0.4)])
    assert table.row_count >= 6


def test_the_summary_throughput_is_the_whole_runs_tokens_over_its_time() -> None:
    # It averaged the per-step rates, so a short step counted as much as a long one: 1 s at
    # 300 tokens/s and 9 s at 100 tokens/s showed 200 tokens/s; the run made 1200 in 10 s.
    import io

    from rich.console import Console

    history = [
        {"step": 1.0, "critic/score/mean": 0.5, "timing_s/step": 1.0, "perf/throughput": 300.0},
        {"step": 2.0, "critic/score/mean": 0.5, "timing_s/step": 9.0, "perf/throughput": 100.0},
    ]
    console = Console(file=io.StringIO(), width=120)
    console.print(summary_table(history, []))
    line = next(x for x in console.file.getvalue().splitlines() if "perf/throughput" in x)
    assert "whole run" in line and line.rstrip(" │").endswith("120"), line


def test_progress_is_logged_as_lines_where_no_bar_can_draw(caplog, monkeypatch) -> None:
    # With stderr in a file (a batch job) the bar drew nothing until the end.
    import logging

    from yatt.report import console, progress_bar

    assert not console.is_terminal  # as under pytest, or with stderr redirected
    with caplog.at_level(logging.INFO, logger="yatt.report"), progress_bar(4) as progress:
        progress(1, 4, {"critic/score/mean": 0.2, "timing_s/step": 2.0})
        progress(2, 4, {"critic/score/mean": 0.4, "timing_s/step": 4.0, "eval/accuracy": 0.5})
        progress(3, 4, {"critic/score/mean": 0.6, "timing_s/step": 6.0})
        progress(4, 4, {"critic/score/mean": 0.8, "timing_s/step": 8.0})
    lines = [r.getMessage() for r in caplog.records if r.name == "yatt.report"]
    assert len(lines) == 2, lines  # the first step, then not again within 30 s but the last
    assert lines[0].startswith("step 1/4: reward 0.200, 2.00 s/step (last 1 steps), elapsed ")
    assert lines[1].startswith("step 4/4: reward 0.500, 5.00 s/step (last 4 steps), acc 50.0%")
    assert "eta 0:00:00" in lines[1]
    caplog.clear()  # a run resumed at step 900 of 1000: its earlier steps ran elsewhere
    monkeypatch.setattr("yatt.report.PLAIN_PROGRESS_EVERY_S", 0.0)  # a line every step
    with caplog.at_level(logging.INFO, logger="yatt.report"), progress_bar(1000) as progress:
        progress(900, 1000, {"eval/accuracy": 0.5})  # the resume's row: no step time
        progress(901, 1000, {"critic/score/mean": 0.2, "timing_s/step": 10.0})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "yatt.report"][1:]
    assert line.startswith("step 901/1000: reward 0.200, 10.00 s/step (last 1 steps), acc 50.0%")
    assert line.endswith("eta 0:16:30"), line


def test_the_summary_says_how_many_problems_each_evaluation_scored(tmp_path) -> None:
    # eval.n_periodic scores fewer problems mid-run than eval.n at the end; the summary showed
    # both accuracies alike.
    import io

    from rich.console import Console

    from yatt.report import evals_of, load_history

    config = load_config("tiny_test", ["train.steps=4", "eval.every=2", "eval.n_periodic=4",
                                       "eval.n=8", "data.n_heldout=8", "eval.at_start=true",
                                       f"logging.run_dir={tmp_path}"])  # fmt: skip
    Trainer(config).fit()
    history = load_history(tmp_path)
    assert [(r["step"], r["eval/problems"]) for r in history if "eval/problems" in r] == [
        (0, 8), (2, 4), (4, 8)]  # fmt: skip
    console = Console(file=io.StringIO(), width=120)
    console.print(summary_table(history, evals_of(history)))
    shown = console.file.getvalue()
    assert "held-out accuracy (first)" in shown and "@ step 0 on 8" in shown
    assert "@ step 2 on 4" in shown and "held-out accuracy (last)" in shown, shown
