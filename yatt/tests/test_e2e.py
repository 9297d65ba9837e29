"""End to end on a tiny random-init model: every algorithm runs a few steps with all metrics
present and finite; checkpoint + resume continues exactly; DAPO dynamic sampling and KL-in-reward
run; and (slow) a toy reward rises under GRPO.

Method: real Trainer, real rollout engine, tiny Llama with the SmolLM2 tokenizer, and a fake reward
role whose score is linear in the final hidden state's direction, so a few steps can learn it.
"""

import json
import math

import pytest
import torch

from yatt.config import load_config
from yatt.errors import ConfigError
from yatt.models import tiny_model
from yatt.trainer import Trainer

COMMON_METRICS = {
    "critic/score/mean", "critic/score/max", "critic/rewards/mean", "response_length/mean",
    "actor/pg_loss", "actor/clipfrac", "actor/entropy", "actor/grad_norm", "actor/lr",
    "timing_s/gen", "timing_s/reward", "timing_s/old_logp", "timing_s/ref", "timing_s/adv",
    "timing_s/update_actor", "timing_s/update_weights", "timing_s/step", "perf/throughput",
    "perf/samples_per_s",
}  # fmt: skip


class DirectionReward:
    """Fake reward role: the fraction of response tokens whose initial embedding has a positive
    projection on a fixed random direction (about 0.5 at start; learnable by moving one
    direction of the final hidden state)."""

    def __init__(self, model: torch.nn.Module) -> None:
        embeddings = model.get_input_embeddings().weight.detach()
        direction = torch.randn(embeddings.shape[1], generator=torch.Generator().manual_seed(0))
        self.good = (embeddings @ direction) > 0  # (V,)

    def score(self, batch):
        good = self.good[batch.response_ids].float() * batch.response_mask
        return good.sum(1) / batch.response_mask.sum(1).clamp(min=1), {}


def _run(tmp_path, overrides: list[str], steps: int = 2, until_step: int | None = None):
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", [f"train.steps={steps}", "eval.n=4",
                                       f"logging.run_dir={tmp_path}", *overrides])  # fmt: skip
    trainer = Trainer(config, model=model, tokenizer=tokenizer, reward=DirectionReward(model))
    return trainer, trainer.fit(until_step=until_step)


@pytest.mark.parametrize("algo", ["grpo", "ppo", "rloo", "reinforce_pp"])
def test_each_algorithm_runs_with_finite_metrics(algo, tmp_path) -> None:
    extra = ["algo.kl_coef=0.05"] if algo in ("grpo", "ppo") else []
    trainer, result = _run(tmp_path, [f"algo.name={algo}", *extra])
    assert (trainer.reference is None) == (not extra)  # no KL: no reference model at all
    assert (trainer.critic is None) == (algo != "ppo")
    steps = [row for row in result.history if "timing_s/step" in row]
    assert len(steps) == 2
    expected = COMMON_METRICS | ({"actor/kl"} if extra else set())
    if algo == "ppo":
        expected |= {"critic/vf_loss", "critic/values/mean", "timing_s/values"}
    for row in steps:
        assert expected <= set(row), expected - set(row)
        bad = {k: v for k, v in row.items() if not math.isfinite(v)}
        assert not bad, bad
    assert [step for step, _ in result.evals] == [0, 2]
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [0, 1, 2]
    assert (tmp_path / "config.yaml").is_file()


def test_dynamic_sampling_and_kl_in_reward(tmp_path) -> None:
    _, result = _run(tmp_path, ["algo.name=reinforce_pp", "algo.dynamic_sampling=true",
                                "algo.kl_coef=0.1", "algo.kl_in_reward=true",
                                "algo.overlong_buffer=4"])  # fmt: skip
    row = result.history[-1]
    assert row["batch/kept_groups"] >= 1
    assert math.isfinite(row["actor/kl"])


class _HalfFlatReward(DirectionReward):
    """The direction reward, but 0 for every row of even-numbered groups: those groups carry no
    signal and dynamic sampling drops them (refilling the step)."""

    def score(self, batch):
        scores, _ = super().score(batch)
        return scores * (batch.group_ids % 2 == 1), {"reward/direction/mean": float(scores.mean())}


def _dapo_trainer(tmp_path, reward: type, overrides: list[str]) -> tuple[Trainer, list]:
    """A DAPO trainer (dynamic sampling) and the list its policy's updates append batches to."""
    model, tokenizer = tiny_model(seed=0)
    config = load_config(
        "tiny_test",
        ["eval.n=0", "algo.dynamic_sampling=true", f"logging.run_dir={tmp_path}", *overrides],
    )
    trainer = Trainer(config, model=model, tokenizer=tokenizer, reward=reward(model))
    trained: list = []
    update = trainer.policy.update
    trainer.policy.update = lambda batch: trained.append(batch) or update(batch)
    return trainer, trained


def test_dynamic_sampling_metrics_describe_the_batch_trained_on(tmp_path) -> None:
    trainer, trained = _dapo_trainer(
        tmp_path, _HalfFlatReward, ["train.steps=3", "algo.max_refill_batches=3"]
    )
    history = trainer.fit().history
    assert any(row["batch/dropped_groups"] > 0 for row in history)
    for row, batch in zip(history, trained, strict=True):
        assert row["critic/score/mean"] == pytest.approx(float(batch.scores.mean()))
        assert row["critic/score/min"] == pytest.approx(float(batch.scores.min()))
        assert row["critic/rewards/mean"] == pytest.approx(float(batch.rewards.mean()))
        groups = len(set(batch.group_ids.tolist()))  # trained groups, as the controllers count
        assert row["batch/kept_groups"] == (groups if row["batch/kept_groups"] else 0)


def _comparable(history):
    skip = ("timing_s/", "perf/")
    return [{k: v for k, v in row.items() if not k.startswith(skip)} for row in history]


def test_resume_continues_exactly(tmp_path) -> None:
    # with a KL term: the resumed run's reference is the initial model, not the checkpoint's
    overrides = ["checkpoint.every=2", "eval.at_start=false", "eval.at_end=false",
                 "algo.name=ppo", "algo.ppo_passes=2", "train.seed=3", "algo.kl_coef=0.1",
                 "optim.lr=1e-3"]  # fmt: skip
    straight, straight_result = _run(tmp_path / "straight", overrides, steps=4)
    _run(tmp_path / "split", overrides, steps=4, until_step=2)  # "interrupted" after step 2
    checkpoint = tmp_path / "split" / "checkpoints" / "step_000002"
    assert (checkpoint / "policy" / "model.safetensors").is_file()
    assert (checkpoint / "config.yaml").is_file()
    model, _ = tiny_model(seed=0)  # only the reward's direction table comes from here
    config = load_config("tiny_test", ["train.steps=4", f"logging.run_dir={tmp_path / 'split'}",
                                       f"checkpoint.resume={checkpoint}", *overrides])  # fmt: skip
    resumed = Trainer(config, reward=DirectionReward(model))
    assert resumed.step == 2
    resumed_result = resumed.fit()
    assert _comparable(resumed_result.history) == _comparable(straight_result.history[2:])
    for (name, left), right in zip(straight.policy.model.named_parameters(),
                                   resumed.policy.model.parameters()):  # fmt: skip
        assert torch.equal(left, right), name
    logged = [json.loads(line)["step"] for line in
              (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    assert logged == [1, 2, 3, 4]


def test_resuming_behind_later_checkpoints_is_refused_unless_overwrite(tmp_path) -> None:
    overrides = ["checkpoint.every=1", "checkpoint.keep_last=3", "eval.at_start=false",
                 "eval.at_end=false"]  # fmt: skip
    _run(tmp_path, overrides, steps=3)
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step_00000{s}" for s in (1, 2, 3)]
    metrics_before = (tmp_path / "metrics.jsonl").read_bytes()
    resume = [f"checkpoint.resume={checkpoints / 'step_000001'}", *overrides]
    with pytest.raises(ConfigError, match=r"step_000002, step_000003.*logging\.overwrite=true"):
        _run(tmp_path, resume, steps=3)
    assert len(list(checkpoints.iterdir())) == 3  # nothing touched
    assert (tmp_path / "metrics.jsonl").read_bytes() == metrics_before
    trainer, _ = _run(tmp_path, [*resume, "logging.overwrite=true"], steps=2)
    assert trainer.step == 2
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000001", "step_000002"]


def test_resume_latest_and_auto_pick_the_newest_checkpoint(tmp_path) -> None:
    overrides = ["checkpoint.every=1", "checkpoint.keep_last=3", "eval.at_start=false",
                 "eval.at_end=false"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"holds no checkpoint.*checkpoint\.resume=auto"):
        _run(tmp_path, [*overrides, "checkpoint.resume=latest"], steps=3)
    trainer, _ = _run(tmp_path, [*overrides, "checkpoint.resume=auto"], steps=3, until_step=2)
    assert trainer.step == 2  # auto with nothing to resume: a fresh run, interrupted at 2
    for keyword in ("latest", "auto"):
        model, _ = tiny_model(seed=0)
        config = load_config("tiny_test", ["train.steps=3", f"logging.run_dir={tmp_path}",
                                           f"checkpoint.resume={keyword}", *overrides])  # fmt: skip
        resumed = Trainer(config, reward=DirectionReward(model))
        assert resumed.step == 2, keyword
    # A resume whose train.steps is not past its checkpoint would train nothing (after cutting
    # the run's later records back to the checkpoint): refused, with nothing changed.
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    for steps in (1, 2):
        config = load_config("tiny_test", [f"train.steps={steps}", f"logging.run_dir={tmp_path}",
                                           "checkpoint.resume=latest", *overrides])  # fmt: skip
        with pytest.raises(ConfigError, match=r"is at step 2, and train\.steps=\d leaves nothing"):
            Trainer(config, reward=DirectionReward(tiny_model(seed=0)[0]))
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_auto_without_a_checkpoint_refuses_a_used_folder(tmp_path) -> None:
    overrides = ["eval.at_start=false", "eval.at_end=false"]
    _run(tmp_path, overrides, steps=3, until_step=1)  # stopped before any checkpoint
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError) as info:
        _run(tmp_path, [*overrides, "checkpoint.resume=auto"], steps=3)
    message = str(info.value)
    assert "checkpoint.resume=auto found no checkpoint" in message
    assert "logging.overwrite=true" in message and "pass checkpoint.resume" not in message
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # nothing touched
    # The same command again (a restart loop) after its own attempt stopped before any
    # checkpoint: it starts again rather than being refused for ever.
    again = tmp_path / "again"
    _run(again, [*overrides, "checkpoint.resume=auto"], steps=3, until_step=1)
    trainer, _ = _run(again, [*overrides, "checkpoint.resume=auto"], steps=3)
    logged = [json.loads(line) for line in (again / "metrics.jsonl").read_text().splitlines()]
    assert trainer.step == 3 and [row["step"] for row in logged] == [1, 2, 3]
    # That attempt finished (with no checkpoint to say so): its outputs are not replaced.
    finished = (again / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=r"checkpoint\.resume=auto found no checkpoint"):
        _run(again, [*overrides, "checkpoint.resume=auto"], steps=3)
    assert (again / "metrics.jsonl").read_bytes() == finished


def test_resuming_from_another_run_folder_claims_this_one_afresh(tmp_path) -> None:
    overrides = ["checkpoint.every=1", "checkpoint.keep_last=3", "eval.at_start=false",
                 "eval.at_end=false"]  # fmt: skip
    _run(tmp_path / "source", overrides, steps=2)
    _run(tmp_path / "other", overrides, steps=3)  # a different run, further along
    checkpoint = tmp_path / "source" / "checkpoints" / "step_000001"
    fork = [f"checkpoint.resume={checkpoint}", *overrides]
    with pytest.raises(ConfigError, match="already holds a run") as info:
        _run(tmp_path / "other", fork, steps=3)  # not "resume from other's step_3"
    assert "step_000003" not in str(info.value)
    assert len(list((tmp_path / "other" / "checkpoints").iterdir())) == 3
    trainer, _ = _run(tmp_path / "fresh", fork, steps=2)
    assert trainer.step == 2  # continued from the source's step 1 in a folder of its own
    names = sorted(p.name for p in (tmp_path / "fresh" / "checkpoints").iterdir())
    assert names == ["step_000002"]
    assert sorted(p.name for p in (tmp_path / "source" / "checkpoints").iterdir()) == [
        "step_000001",
        "step_000002",
    ]


@pytest.mark.slow
def test_toy_reward_rises(tmp_path) -> None:
    _, result = _run(tmp_path, ["optim.lr=1e-2", "optim.schedule=constant", "eval.n=0",
                                "algo.prompts_per_step=4", "train.seed=1"], steps=30)  # fmt: skip
    scores = [row["critic/score/mean"] for row in result.history if "critic/score/mean" in row]
    early, late = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert late > early + 0.1, scores


def test_bradley_terry_reward_model_as_reward(tmp_path) -> None:
    from yatt.heads import ScalarHeadModel

    backbone, tokenizer = tiny_model(seed=5)
    ScalarHeadModel.from_causal_lm(backbone).save(tmp_path / "rm", tokenizer)
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["train.steps=1", "eval.n=0", "reward.fns=[]",
                                       "reward.weights=[]", f"reward.model_path={tmp_path / 'rm'}",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    result = Trainer(config, model=model, tokenizer=tokenizer).fit()
    row = result.history[-1]
    assert "reward/reward_model/mean" in row
    assert row["critic/score/max"] > row["critic/score/min"]  # real, varying model scores


def test_time_limit_stops_early_and_still_evaluates(tmp_path) -> None:
    trainer, result = _run(tmp_path, ["train.time_limit_s=1e-6"], steps=5)
    assert trainer.step == 1
    assert [step for step, _ in result.evals] == [0, 1]
    assert result.checkpoint is None  # no checkpoint asked for


@pytest.mark.parametrize("asked", ["checkpoint.at_end=true", "checkpoint.every=3"])
def test_a_time_limit_stop_keeps_the_policy_and_a_resume_goes_on(tmp_path, asked) -> None:
    """Where the time limit stops the run, the final checkpoint is saved (`at_end`, or
    `every`, so that `checkpoint.resume=auto` continues the run from there)."""
    _, result = _run(tmp_path, ["train.time_limit_s=1e-6", asked], steps=5)
    assert result.checkpoint is not None and result.checkpoint.name == "step_000001"
    trainer, resumed = _run(tmp_path, ["checkpoint.resume=auto", asked], steps=2)
    assert trainer.step == 2 and len(resumed.history) == 1


def test_an_evaluation_that_fails_keeps_its_steps_row_and_checkpoint(tmp_path, monkeypatch) -> None:
    """The last step's evaluation raises (a reward's bug on one greedy completion): the step
    trained, so its metrics row and its at_end checkpoint are written before the error
    propagates. The checkpoint used to be skipped, losing the trained policy."""
    from yatt.rewards import RewardError

    def broken(self, *args, **kwargs):
        raise RewardError("eval reward 'math_answer' raised ValueError: bug on held-out 1")

    monkeypatch.setattr(Trainer, "_evaluate", broken)
    overrides = ["eval.at_start=false", "eval.at_end=true", "checkpoint.at_end=true"]
    with pytest.raises(RewardError, match="bug on held-out 1"):
        _run(tmp_path, overrides, steps=2)
    assert (tmp_path / "checkpoints" / "step_000002" / "policy" / "model.safetensors").is_file()
    logged = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert logged == [1, 2]


def test_a_model_passed_in_to_a_resumed_run_gets_the_checkpoints_weights(tmp_path) -> None:
    """The checkpoint's optimizer state, schedule and data position used to train the passed
    model's own weights, the checkpoint's dropped without a word."""
    first, _ = _run(tmp_path / "first", ["checkpoint.every=1", "eval.at_start=false",
                                         "eval.at_end=false"])  # fmt: skip
    checkpoint = tmp_path / "first" / "checkpoints" / "step_000002"
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["train.steps=3", f"logging.run_dir={tmp_path / 'next'}",
                                       f"checkpoint.resume={checkpoint}"])  # fmt: skip
    resumed = Trainer(config, model=model, tokenizer=tokenizer, reward=DirectionReward(model))
    assert resumed.step == 2 and resumed.policy.model is model
    for (name, trained), loaded in zip(first.policy.model.named_parameters(), model.parameters()):
        assert torch.equal(trained, loaded), name


def test_a_run_resumed_in_place_logs_each_step_once_to_tensorboard(tmp_path) -> None:
    """The metrics file was cut back to the resume step, but TensorBoard kept the first run's
    later events, so its curves showed two histories from step 3 on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = ["checkpoint.every=2", "eval.at_start=false", "eval.at_end=false",
                 "logging.tensorboard=true"]  # fmt: skip
    _run(tmp_path, overrides, steps=3)  # steps 1-3, a checkpoint at 2
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    model, _ = tiny_model(seed=0)
    config = load_config("tiny_test", ["train.steps=4", "eval.n=4", f"logging.run_dir={tmp_path}",
                                       f"checkpoint.resume={checkpoint}", *overrides])  # fmt: skip
    Trainer(config, reward=DirectionReward(model)).fit()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("timing_s/step")] == [1, 2, 3, 4]


def test_refill_rounds_of_more_than_4099_rows_draw_fresh_seeds(tmp_path, monkeypatch) -> None:
    """Round r + 1 started 4099 seeds after round r, so with more rows (DAPO's 512 prompts x
    16 samples) its rows reused round r's seeds: other prompts, the same random draws."""
    model, tokenizer = tiny_model(seed=0)
    config = load_config("tiny_test", ["algo.prompts_per_step=1050", "rollout.n_samples=4",
                                       "eval.n=0", f"logging.run_dir={tmp_path}"])  # fmt: skip
    trainer = Trainer(config, model=model, tokenizer=tokenizer, reward=DirectionReward(model))
    drawn: list[list[int]] = []
    monkeypatch.setattr(trainer.rollout, "generate", lambda *args: drawn.append(args[3]))
    trainer._sample(0)
    trainer._sample(1)
    assert len(drawn[0]) == 4200 and len(set(drawn[0]) | set(drawn[1])) == 8400


class _FlatReward(DirectionReward):
    """Every row scores the same: no group carries signal."""

    def score(self, batch):
        return torch.ones(batch.size), {}


def test_dynamic_sampling_with_no_group_kept_trains_on_scores_with_no_signal(tmp_path) -> None:
    """Every group dropped on every refill: the step trains the last batch with its rewards set
    to the scores (the overlong penalty would otherwise give rows advantages the filter saw
    none in), so no row moves the policy."""
    trainer, trained = _dapo_trainer(
        tmp_path,
        _FlatReward,
        ["train.steps=1", "algo.max_refill_batches=2", "algo.overlong_buffer=4"],
    )
    (row,) = [row for row in trainer.fit().history if "timing_s/step" in row]
    assert row["batch/kept_groups"] == 0
    assert row["batch/dropped_groups"] == 3 * trainer.config.algo.prompts_per_step  # 1 + 2 refills
    (batch,) = trained
    assert (batch.response_lengths > 4).any()  # some rows are in the penalty's buffer
    assert torch.equal(batch.rewards, batch.scores)  # not the length-penalised rewards
    assert torch.count_nonzero(batch.advantages) == 0
    assert row["actor/pg_loss"] == 0.0
