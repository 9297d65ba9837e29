"""The controllers on the in-process backend (one device, no Ray): both modes agree, the
distributed entry point writes its outputs, and bad splits are refused."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from yatt.config import load_config
from yatt.control import ControlConfig, fit_distributed, make_controller
from yatt.control.config import driver_scores
from yatt.control.run import recorded_config
from yatt.errors import ConfigError

OVERRIDES = ["train.steps=2", "algo.prompts_per_step=2", "rollout.n_samples=4", "optim.lr=1e-3",
             "rollout.max_new_tokens=6", "data.n_train=16", "data.n_heldout=0",
             "eval.n=0"]  # fmt: skip
REWARD = ("yatt.control.workload:char_mix_reward",)


def _control(**changes) -> ControlConfig:
    return ControlConfig(**{"backend": "inprocess", "n_devices": 1, "device_kind": "cpu",
                            "extra_rewards": REWARD, **changes})  # fmt: skip


def test_single_and_parallel_modes_agree_in_process():
    config = load_config("tiny_test", OVERRIDES)
    results = {}
    for mode in ("single", "parallel"):
        controller = make_controller(config, _control(mode=mode, payload_bytes=512))
        # a single controller scores on its driver: its workers build no reward role
        hosts_reward = [h.worker.reward is not None for h in controller.cluster.all_handles()]
        assert hosts_reward == [mode == "parallel"] * len(hosts_reward), mode
        run = controller.fit()
        results[mode] = (run, controller.weights())
        controller.close()
    (single, single_w), (parallel, parallel_w) = results["single"], results["parallel"]
    assert all(torch.equal(single_w[k], parallel_w[k]) for k in single_w)
    assert single.history[-1]["critic/score/mean"] == parallel.history[-1]["critic/score/mean"]
    assert single.history[0]["actor/grad_norm"] > 0
    assert single.history[0]["batch/feature_bytes"] == 8 * 512
    # the trainer's batch and rate metrics, the same whether one driver or each group sums them
    for key in ("critic/advantages/mean", "critic/advantages/abs_mean",
                "response_length/clip_ratio"):  # fmt: skip
        assert single.history[-1][key] == pytest.approx(parallel.history[-1][key]), key
    # each reward function's own mean, as the trainer logs it (it was missing here)
    rewards = sorted(key for key in parallel.history[-1] if key.startswith("reward/"))
    assert rewards == ["reward/char_mix_reward/mean", "reward/math_answer/mean",
                       "reward/total/mean"]  # fmt: skip
    for key in rewards:
        assert single.history[-1][key] == pytest.approx(parallel.history[-1][key]), key
    assert parallel.history[-1]["reward/total/mean"] == pytest.approx(
        parallel.history[-1]["critic/score/mean"]
    )  # (no dynamic sampling: the same rows)
    row = parallel.history[-1]
    assert row["critic/advantages/abs_mean"] > 0 and 0 <= row["response_length/clip_ratio"] <= 1
    assert row["perf/samples_per_s"] == pytest.approx(row["batch/rows"] / row["timing_s/step"])
    # generated tokens (every collected call's) per second the samplers spent generating them
    assert row["control/gen_tokens"] == row["response_length/mean"] * row["batch/rows"]
    assert 0 < row["control/sampler_gen_s"] <= row["timing_s/gen"]
    rate = row["control/gen_tokens"] / row["control/sampler_gen_s"]
    assert row["perf/gen_tokens_per_s"] == pytest.approx(rate)


@pytest.mark.parametrize("placement", ["colocate", "disaggregated"])
def test_a_reward_model_scores_on_the_workers_in_both_modes(tmp_path, placement):
    """A single controller scores rule rewards on its driver, but not a reward model: that runs
    where the placement puts the reward role (verl's reward-model worker group), not on the
    driver's CPU; both modes then score and train alike."""
    from yatt.heads import ScalarHeadModel
    from yatt.models import tiny_model

    backbone, tokenizer = tiny_model(seed=5)
    ScalarHeadModel.from_causal_lm(backbone).save(tmp_path / "rm", tokenizer)
    config = load_config("tiny_test", [*OVERRIDES, f"reward.model_path={tmp_path / 'rm'}"])
    split = {"n_devices": 2, "n_sampler": 1} if placement == "disaggregated" else {}
    results = {}
    for mode in ("single", "parallel"):
        controller = make_controller(config, _control(mode=mode, placement=placement, **split))
        assert controller.cluster.reward_for(0).worker.reward is not None, mode
        if mode == "single":
            assert controller.reward is None  # the driver loaded no reward model
        run = controller.fit()
        results[mode] = (run.history[-1], controller.weights())
        controller.close()
    (single, single_w), (parallel, parallel_w) = results["single"], results["parallel"]
    assert single["reward/reward_model/mean"] == parallel["reward/reward_model/mean"]
    assert single["critic/score/max"] > single["critic/score/min"]  # real, varying scores
    assert all(torch.equal(single_w[k], parallel_w[k]) for k in single_w)


def test_who_scores_in_each_mode(tmp_path, monkeypatch):
    """The driver scores only a single controller's rule rewards: a reward model, or a batch
    scorer such as an LLM judge (a model of its own) in reward.fns or control.extra_rewards,
    scores on the reward workers, where the placement puts the reward role (a judge once ran
    on the driver). Runtime re-placement runs parallel controllers whatever control.mode says,
    so its workers score (they once built no reward role under mode=single and the run failed
    at its first reward)."""
    (tmp_path / "counting_scorer.py").write_text(SCORER)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config("tiny_test", OVERRIDES)
    assert driver_scores(config, _control(mode="single"))
    assert not driver_scores(config, _control(mode="parallel"))
    model = dataclasses.replace(config, reward=dataclasses.replace(config.reward, model_path="rm"))
    assert not driver_scores(model, _control(mode="single"))
    scorer = "counting_scorer:row_counter"
    assert not driver_scores(config, _control(mode="single", extra_rewards=(*REWARD, scorer)))
    in_fns = load_config("tiny_test", [*OVERRIDES, f"reward.fns=[math_answer,{scorer}]"])
    assert not driver_scores(in_fns, _control(mode="single"))
    adaptive = make_controller(config, _control(mode="single", replace_every=1))
    try:
        assert adaptive.fit().history[-1]["critic/score/mean"] >= 0
    finally:
        adaptive.close()


def test_a_run_folder_records_the_ray_controller_that_ran():
    """fit_distributed's config.yaml names the Ray ControlConfig a Python caller passed, not
    the config's default; an in-process one is no loadable config (control.json names it)."""
    config = load_config("tiny_test", OVERRIDES)
    ray_control = ControlConfig(backend="ray", n_devices=2, device_kind="cpu",
                                placement="disaggregated", n_sampler=1)  # fmt: skip
    recorded = recorded_config(config, ray_control)
    assert recorded.control == ray_control and recorded.model == config.model
    assert recorded_config(config, _control()) is config


def test_the_overlong_penalty_shapes_rewards_alike_in_both_modes():
    """DAPO's soft overlong punishment: responses in the last `overlong_buffer` tokens of the
    budget lose up to `overlong_penalty`; the scores keep their meaning in the metrics."""
    runs = {}
    for mode in ("single", "parallel"):
        config = load_config("tiny_test", [*OVERRIDES, "algo.overlong_buffer=4",
                                           "algo.overlong_penalty=0.5"])  # fmt: skip
        controller = make_controller(config, _control(mode=mode))
        runs[mode] = (controller.fit().history, controller.weights())
        controller.close()
    (single, single_w), (parallel, parallel_w) = runs["single"], runs["parallel"]
    assert all(torch.equal(single_w[k], parallel_w[k]) for k in single_w)
    for row, other in zip(single, parallel, strict=True):
        for key in ("critic/score/mean", "critic/rewards/mean", "critic/score/max",
                    "critic/score/min"):  # fmt: skip
            assert row[key] == pytest.approx(other[key]), key
    row = single[0]
    assert row["critic/score/min"] <= row["critic/score/mean"] <= row["critic/score/max"]
    # 6-token budget, buffer 4: a response of n tokens loses 0.5 * max(n - 2, 0) / 4
    mean_length = row["response_length/mean"]
    assert mean_length > 2  # the tiny model's responses reach into the buffer
    assert row["critic/rewards/mean"] < row["critic/score/mean"]
    assert row["critic/score/mean"] - row["critic/rewards/mean"] <= 0.5 * (6 - 2) / 4 + 1e-9


def test_a_kl_term_trains_alike_in_both_modes_and_pulls_the_update():
    """Each policy rank keeps a frozen copy of the initial policy; its log-probs enter the
    update's KL loss term as in the single-process trainer."""
    runs = {}
    for mode, kl_coef in (("single", 0.5), ("parallel", 0.5), ("parallel", 0.0)):
        config = load_config("tiny_test", [*OVERRIDES, "train.steps=3", f"algo.kl_coef={kl_coef}"])
        controller = make_controller(config, _control(mode=mode))
        runs[mode, kl_coef] = (controller.fit().history, controller.weights())
        controller.close()
    (single, single_w), (parallel, parallel_w) = runs["single", 0.5], runs["parallel", 0.5]
    assert all(torch.equal(single_w[k], parallel_w[k]) for k in single_w)
    kls = [row["actor/kl"] for row in single]
    assert kls == [row["actor/kl"] for row in parallel]
    assert kls[0] == 0.0 < kls[2]  # step 1 samples with the reference's own weights
    _, free_w = runs["parallel", 0.0]
    assert "actor/kl" not in runs["parallel", 0.0][0][0]
    assert not all(torch.equal(free_w[k], parallel_w[k]) for k in free_w)  # the term pulls


def test_length_schedule_changes_the_response_budget():
    config = load_config("tiny_test", [*OVERRIDES, "train.steps=3"])
    # "3:5": from the step metrics.jsonl logs as 3, the third (the schedule counts as the log)
    controller = make_controller(config, _control(length_schedule=("0:2", "3:5")))
    run = controller.fit()
    controller.close()
    lengths = [h["response_length/mean"] for h in run.history]  # steps 1, 2, 3
    assert max(lengths[:2]) <= 2 < lengths[2] <= 5


def test_adaptive_controller_measures_its_decode_floor(monkeypatch, caplog):
    """`yatt train ... control.replace_every=K` gives no calibration: the re-placing controller
    times batch-1 decoding on its sampler (about one step per token, prefill included). The
    Amdahl fractions are data-parallel ranks' here, and also for in-process workers under
    cpu_mapping=threads: they are not pinned, so no thread scaling is measured."""
    import logging

    caplog.set_level(logging.INFO, logger="yatt.control.adaptive")
    config = load_config("tiny_test", OVERRIDES)
    threads = make_controller(config, _control(replace_every=1, n_devices=2,
                                               cpu_mapping="threads"))  # fmt: skip
    threads.close()
    assert threads.parallel == {"gen_parallel": 0.0, "train_parallel": 1.0}
    assert "no thread scaling measured (in-process workers are not pinned" in caplog.text
    controller = make_controller(config, _control(replace_every=1))
    try:
        assert 0 < controller.decode_step_s < 1.0
        assert controller.parallel == {"gen_parallel": 0.0, "train_parallel": 1.0}
        observed = []
        observe_step = controller.replanner.observe_step

        def spy(step, *rest):
            observed.append(step)
            observe_step(step, *rest)

        monkeypatch.setattr(controller.replanner, "observe_step", spy)
        run = controller.fit()
        # the planner's generation floor is that step time x the decode steps its gen calls
        # ran (the whole 6-token budget here)
        floor_s = controller.replanner.costs.gen_floor_s
        assert floor_s == pytest.approx(6 * controller.decode_step_s)
        # the sampler records each gen call's decode steps (the budget's 6 here) in its event
        gens = [event for event in run.events if event[2] == "gen"]
        assert gens and all(len(event) == 6 and event[5] == 6 for event in gens)
        # the first step (process warm-up) is not the planner's evidence; the later ones are
        assert observed == list(range(1, len(run.history))) and len(run.history) > 1
    finally:
        controller.close()


def test_fit_distributed_writes_metrics_timeline_and_summary(tmp_path):
    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={tmp_path}"])
    result = fit_distributed(config, _control())
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert 0.0 <= rows[-1]["perf/idle_frac"] <= 1.0 and "timing_s/update_weights" in rows[-1]
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    assert json.loads((tmp_path / "control.json").read_text())["driver_peak_rss_mb"] > 0
    assert len(result.history) == 2
    assert result.run_dir == tmp_path.resolve()  # (`yatt demo` prints it, as the trainer's)


def test_overwrite_keeps_the_previous_run_when_a_reward_fails(tmp_path, monkeypatch):
    # The distributed path deleted the previous run before any reward was called.
    from yatt.rewards import RewardError

    run_dir = tmp_path / "run"
    overrides = [*OVERRIDES, "train.steps=1", f"logging.run_dir={run_dir}"]
    fit_distributed(load_config("tiny_test", overrides), _control())
    before = sorted(p.name for p in run_dir.rglob("*"))
    (tmp_path / "broken_reward.py").write_text("def none(prompt, completion, **row):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    again = [*overrides, "logging.overwrite=true", "reward.fns=[broken_reward:none]"]
    with pytest.raises(RewardError, match="returned None"):
        fit_distributed(load_config("tiny_test", again), _control())
    assert sorted(p.name for p in run_dir.rglob("*")) == before


@pytest.mark.parametrize("replace_every", [0, 1])  # 1: the adaptive (re-placing) controller
def test_fit_distributed_streams_metrics_and_saves_the_trained_policy(tmp_path, monkeypatch,
                                                                      replace_every):  # fmt: skip
    from yatt.builders import build_model
    from yatt.control.controller import Controller
    from yatt.models import load_model

    final: dict = {}
    real_close = Controller.close

    def close(controller):  # the trained weights, as the workers hold them at the end
        final.update(controller.weights())
        real_close(controller)

    monkeypatch.setattr(Controller, "close", close)
    outputs = ["checkpoint.at_end=true", "logging.tensorboard=true"]
    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={tmp_path}", *outputs])
    seen: list[int] = []

    def progress(step, total, metrics):  # each row is on disk when its step is reported
        rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
        seen.append(json.loads(rows[-1])["step"])

    fit_distributed(config, _control(replace_every=replace_every), progress)
    assert seen == [1, 2]
    saved = load_model(tmp_path / "model").state_dict()
    assert final and all(torch.equal(saved[k], v) for k, v in final.items() if k in saved)
    initial = build_model(config.model)[0].state_dict()  # the seeded model every rank built
    assert any(not torch.equal(initial[k], saved[k]) for k in saved)  # and then trained
    assert (tmp_path / "model" / "config.yaml").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "tensorboard"))
    board.Reload()
    tags = board.Tags()["scalars"]
    assert "critic/score/mean" in tags and "perf/idle_frac" in tags  # idle: added at the end
    assert [event.step for event in board.Scalars("perf/idle_frac")] == [1, 2]


def test_time_limit_stops_the_run_after_the_step_that_reaches_it(tmp_path, caplog):
    overrides = [*OVERRIDES, "train.steps=3", f"logging.run_dir={tmp_path}"]
    config = load_config("tiny_test", [*overrides, "train.time_limit_s=1e-9"])
    result = fit_distributed(config, _control())
    assert len(result.history) == 1 and "train.time_limit_s=1e-09 reached" in caplog.text
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [1]
    assert not (tmp_path / "checkpoints").exists()  # none asked for
    again = [*overrides, "train.time_limit_s=1e-9", "checkpoint.every=2", "logging.overwrite=true"]
    resumable = load_config("tiny_test", again)
    fit_distributed(resumable, _control())  # stopped at step 1: checkpointed for a resume
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo.name=reinforce_pp"],
        ["algo.name=ppo", "algo.overlong_buffer=2", "checkpoint.every=2"],
    ],
)
def test_fit_distributed_refuses_trainer_only_settings(tmp_path, overrides, monkeypatch):
    """The in-process controllers take their own ControlConfig (Config.control stays the
    trainer's), so fit_distributed and build_cluster check the settings themselves."""
    config = load_config("tiny_test", [*OVERRIDES, f"logging.run_dir={tmp_path}", *overrides])
    with pytest.raises(ConfigError, match="single-process trainer") as info:
        fit_distributed(config, _control())
    for setting in overrides:  # each one named, with its value (the others are supported)
        key, value = setting.split("=")
        named = f"{key}=" in str(info.value) and value in str(info.value)
        assert named == (key == "algo.name"), setting
    assert not any(tmp_path.iterdir())  # refused before any work
    monkeypatch.setattr("yatt.control.cluster.make_backend", _no_workers)
    with pytest.raises(ConfigError, match="single-process trainer"):
        make_controller(config, _control())  # the Python API: refused before any worker


def _no_workers(*args):
    raise AssertionError("a worker backend was made for a refused config")


def test_the_driver_imports_no_model_library():
    """A single controller's driver moves batches and scores rules; it loads no model, so
    importing the control layer must not pull in transformers (~110 MiB of the driver's peak
    memory in the controllers bench, where a controller imported an exception class from the
    rollout package)."""
    heavy = "{'transformers', 'accelerate'}"
    code = f"import sys, yatt.control.run; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_ray_backend_without_ray_is_one_line_before_the_run_folder(tmp_path, monkeypatch, capsys):
    from yatt.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is missing
    monkeypatch.delenv("YATT_LOG_LEVEL", raising=False)  # quiet: stderr holds only the error
    run_dir = tmp_path / "run"
    argv = ["train", "tiny_test", *OVERRIDES, "control.backend=ray", f"logging.run_dir={run_dir}",
            "logging.level=WARNING"]  # fmt: skip
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("yatt: error: control.backend=ray needs Ray"), error
    assert error.count("\n") == 1, error
    assert not run_dir.exists()  # refused before the run folder is claimed
    with pytest.raises(ConfigError, match="needs Ray"):  # the Python API, the same line
        make_controller(load_config("tiny_test", OVERRIDES), _control(backend="ray"))


def test_a_split_of_the_prompts_that_cannot_be_even_is_refused_before_ray_starts():
    pytest.importorskip("ray")
    import ray

    config = load_config("tiny_test", [*OVERRIDES, "algo.prompts_per_step=2"])
    control = _control(backend="ray", n_devices=3, oversubscribe=True)
    with pytest.raises(ConfigError) as info:
        make_controller(config, control)
    assert str(info.value).startswith(
        "algo.prompts_per_step=2 must be a multiple of the 3 data-parallel groups of colocate(3)"
    )
    assert not ray.is_initialized()  # (it once took every worker's start to find out)


def test_in_process_backend_refuses_several_policy_ranks():
    config = load_config("tiny_test", OVERRIDES)
    with pytest.raises(ConfigError, match="needs 2"):
        make_controller(config, _control(n_devices=2, oversubscribe=True))
    with pytest.raises(ConfigError, match="multiple of the 3"):
        from yatt.control.async_rollout import ShardQueue

        ShardQueue(16, 0, prompts_per_step=2, world=3, rank=0)


EVAL = ["data.n_heldout=6", "eval.n=6", "eval.every=1", "eval.n_periodic=3",
        "eval.at_start=true", "eval.at_end=true",
        "eval.reward_fn=yatt.control.workload:parity_reward"]  # fmt: skip


def _reference_accuracy(config, state: dict | None, n_examples: int) -> float:
    """The single-process trainer's evaluation of the model with weights `state`."""
    from yatt.builders import build_data, build_model
    from yatt.evaluate import evaluate_engine
    from yatt.rollout import make_engine

    model, tokenizer = build_model(config.model)
    if state is not None:
        model.load_state_dict(state)
    _, heldout = build_data(config.data)
    cfg = config.eval
    accuracy, _ = evaluate_engine(
        make_engine(config.rollout.backend, model.eval(), tokenizer), tokenizer,
        heldout[:n_examples], batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens,
        reward_fn=cfg.reward_fn, use_chat_template=config.data.use_chat_template,
    )  # fmt: skip
    return accuracy


def test_controllers_evaluate_at_start_periodically_and_at_the_end():
    """The eval judge is a user function by import path: parity of the completion's length,
    which a random tiny model scores a mix of 0 and 1 on (math answers: all 0)."""
    base = [o for o in OVERRIDES if not o.startswith(("data.n_heldout", "eval."))]
    config = load_config("tiny_test", [*base, *EVAL])
    controller = make_controller(config, _control())
    try:
        run = controller.fit()
        final = controller.weights()
        policy = controller.cluster.ranks.handles[0].worker
        policy.rank, policy.world = 1, 2  # the second of two ranks scores every other problem
        odd = policy.evaluate(6)
        policy.rank = 0
        even = policy.evaluate(6)
    finally:
        controller.close()
    assert [step for step, _ in run.evals] == [0, 1, 2]
    assert [row.get("eval/accuracy") for row in run.history] == [a for _, a in run.evals[1:]]
    assert run.evals[0][1] == _reference_accuracy(config, None, 6)  # the initial policy's
    assert run.evals[-1][1] == _reference_accuracy(config, final, 6)  # all 6 at the end
    assert odd[1] == even[1] == 3 and (odd[0] + even[0]) / 6 == run.evals[-1][1]
    assert 0 < run.evals[-1][1] < 1  # parity of greedy completions: a mix, not all 0 or 1


def test_fit_distributed_logs_the_evaluations(tmp_path):
    base = [o for o in OVERRIDES if not o.startswith(("data.n_heldout", "eval."))]
    config = load_config("tiny_test", [*base, *EVAL, "eval.every=0", f"logging.run_dir={tmp_path}"])
    seen: list[int] = []
    result = fit_distributed(config, _control(), lambda step, total, metrics: seen.append(step))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2] and seen == [1, 2]  # step 0: no bar
    assert [row["step"] for row in rows if "eval/accuracy" in row] == [0, 2]
    assert [accuracy for _, accuracy in result.evals] == [rows[0]["eval/accuracy"],
                                                          rows[2]["eval/accuracy"]]  # fmt: skip
    assert rows[0]["timing_s/eval"] > 0 and "timing_s/eval" not in rows[2]  # as the trainer's
    assert rows[0]["eval/problems"] == rows[2]["eval/problems"] == config.eval.n
    assert "perf/idle_frac" in rows[2]


def test_fit_distributed_refuses_to_evaluate_without_held_out_problems(tmp_path):
    base = [o for o in OVERRIDES if not o.startswith("eval.")]
    config = load_config("tiny_test", [*base, "eval.n=4", f"logging.run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^data.n_heldout=0 leaves nothing to evaluate"):
        fit_distributed(config, _control())
    assert not any(tmp_path.iterdir())  # refused before any work


@pytest.mark.parametrize(
    ("settings", "due", "at_limit"),
    [
        # (every, n_periodic, at_end): problems evaluated after steps 1..5 of 5, and after
        # step 3 when it reached the time limit
        ((2, 3, True), [0, 3, 0, 3, 10], 10),
        ((2, 0, False), [0, 10, 0, 10, 0], 0),
        ((0, 3, True), [0, 0, 0, 0, 10], 10),
        ((5, 3, False), [0, 0, 0, 0, 10], 0),  # periodic on the last step: all of them
        ((3, 2, False), [0, 0, 2, 0, 0], 10),  # periodic at the limit: the final size
        ((2, 30, True), [0, 10, 0, 10, 10], 10),  # n_periodic past n: n (it scored 30)
    ],
)
def test_evaluations_are_due_as_the_eval_settings_say(settings, due, at_limit):
    from yatt.config import EvalConfig
    from yatt.evaluate import examples_due

    every, n_periodic, at_end = settings
    cfg = EvalConfig(every=every, n=10, n_periodic=n_periodic, at_end=at_end)
    assert [examples_due(cfg, step, 5) for step in range(1, 6)] == due
    assert examples_due(cfg, 3, 5, out_of_time=True) == at_limit
    assert examples_due(EvalConfig(n=0, every=1), 5, 5) == 0


SCORER = '''
class RowCounter:
    """A batch scorer that counts what it scored (a declared metric) and reports an
    undeclared one the distributed controllers leave out."""

    name = "row_counter"
    metric_names = ("row_counter/rows",)

    def score_batch(self, prompts, completions, rows):
        self.last_metrics = {"row_counter/rows": float(len(prompts)), "row_counter/other": 1.0}
        return [0.5] * len(prompts)


row_counter = RowCounter()
'''


def test_a_batch_scorers_declared_counts_add_up_over_every_scoring_call(tmp_path, monkeypatch):
    (tmp_path / "counting_scorer.py").write_text(SCORER)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config("tiny_test", OVERRIDES)
    for mode in ("single", "parallel"):
        extra = (*REWARD, "counting_scorer:row_counter")
        controller = make_controller(config, _control(mode=mode, extra_rewards=extra))
        try:
            history = controller.fit().history
            if mode == "single":  # the scorer ran on the reward workers, not on the driver
                assert controller.reward is None
        finally:
            controller.close()
        for row in history:
            # every row scored in the step, over every group's calls (as the trainer's one call)
            assert row["row_counter/rows"] == row["control/scored_rows"] > 0, mode
            assert row["reward/row_counter/mean"] == pytest.approx(0.5)
            assert "row_counter/other" not in row  # undeclared: ranks could disagree on it


@pytest.mark.parametrize(
    ("overrides", "fresh_policy_reuses"),
    [([], True), (["model.lora_rank=4", "algo.kl_coef=0.1"], True), (["algo.kl_coef=0.1"], False)],
    ids=["full", "lora-kl", "full-kl"],
)
def test_new_roles_keep_the_processs_module_unless_a_reference_is_copied_from_it(
    overrides, fresh_policy_reuses
):
    """A process that takes on other roles in a move keeps its module (the move's hand-over
    sets its weights; no load from disk), freed of a former policy's gradients; it loads the
    model afresh under another config, or for a new policy rank whose KL reference must be a
    copy of the initial weights (without LoRA; with LoRA the reference is the base with the
    adapters off). A reward-only worker holds no module."""
    from yatt.control.devices import Device
    from yatt.control.rank import RankWorker

    config = load_config("tiny_test", ["rollout.n_samples=2", *overrides])
    control = ControlConfig(n_devices=1, device_kind="cpu")
    worker = RankWorker(config, control, Device("cpu", 0), ("policy", "sampler", "reward"), "c")
    module = worker.model
    for param in module.parameters():
        param.grad = torch.ones_like(param) if param.requires_grad else None
    worker.reset(config, control, ("sampler", "reward"), "sampler0")
    assert worker.model is module and worker.policy is None and worker.rollout is not None
    assert all(param.grad is None for param in worker.model.parameters())
    worker.reset(config, control, ("policy",), "rank1")  # a new policy rank
    assert (worker.model is module) == fresh_policy_reuses and worker.rollout is None
    other = load_config("tiny_test", ["rollout.n_samples=2", "data.seed=1", *overrides])
    worker.reset(other, control, ("policy",), "rank1")
    assert worker.model is not module
    worker.reset(other, control, ("reward",), "reward0")
    assert worker.model is None


def test_a_reward_only_worker_loads_no_policy_weights_until_a_move_gives_it_a_sampler(
    monkeypatch,
):
    """A reward service alone (partial placement's reward processes, which share devices with
    policy ranks) neither loads the policy model nor holds it, and still scores; a move that
    makes it a sampler loads the model then."""
    import yatt.builders
    from yatt.control.devices import Device
    from yatt.control.rank import RankWorker
    from yatt.control.shards import ShardRequest

    config = load_config("tiny_test", ["rollout.n_samples=2"])
    control = ControlConfig(n_devices=1, device_kind="cpu")
    sampler = RankWorker(config, control, Device("cpu", 0), ("sampler",), "sampler0")
    shard = sampler.generate(ShardRequest(0, 0, (0,), (0,), (0, 1), 4), sampler.weights_version)
    loads = []
    build_model = yatt.builders.build_model
    monkeypatch.setattr(yatt.builders, "build_model", lambda *a: loads.append(a) or build_model(*a))
    worker = RankWorker(config, control, Device("cpu", 0), ("reward",), "reward0")
    assert loads == [] and worker.model is None and worker.rollout is None
    rewards, _ = worker.score(shard)
    assert rewards.shape == (2,)
    worker.reset(config, control, ("sampler", "reward"), "sampler1")
    assert len(loads) == 1 and worker.model is not None and worker.rollout is not None
    request = ShardRequest(0, 1, (1,), (1,), (2, 3), 4)  # tokenizer and prompts loaded too
    assert worker.score(worker.generate(request, worker.weights_version))[0].shape == (2,)


def test_an_evaluation_that_fails_keeps_the_steps_row_and_checkpoint(tmp_path, monkeypatch):
    """As in the single-process trainer: the last step trained before its held-out evaluation
    raised, so the step's row reaches `progress` and its at_end checkpoint is written before
    the error propagates."""
    import yatt.control.controller as controller_module
    from yatt.rewards import RewardError

    def broken(*args, **kwargs):
        raise RewardError("eval reward 'math_answer' raised ValueError: bug on held-out 1")

    monkeypatch.setattr(controller_module, "evaluate_ranks", broken)
    overrides = [*OVERRIDES, "eval.n=2", "data.n_heldout=2", "eval.at_start=false",
                 "eval.at_end=true", "checkpoint.at_end=true"]  # fmt: skip
    controller = make_controller(load_config("tiny_test", overrides), _control())
    controller.checkpoint_dir = tmp_path
    rows = []
    try:
        with pytest.raises(RewardError, match="bug on held-out 1"):
            controller.fit(progress=lambda step, total, metrics: rows.append(step))
    finally:
        controller.close()
    assert rows == [1, 2]
    assert (tmp_path / "checkpoints" / "step_000002").is_dir()


@pytest.mark.parametrize("mode", ["single", "parallel"])
def test_a_controller_that_fails_to_set_up_shuts_its_workers_down(monkeypatch, mode):
    """Nobody holds a controller whose constructor raised: it shuts down the workers it
    started itself (on Ray they would hold their devices, and a second run's placement group
    would wait for them)."""
    from yatt.control import cluster as cluster_module
    from yatt.control import parallel, single

    shut = []
    monkeypatch.setattr(cluster_module.Cluster, "shutdown", lambda self: shut.append(self))

    def broken(*args, **kwargs):
        raise ConfigError("control.extra_rewards: no module 'missing'")

    if mode == "single":
        monkeypatch.setattr(single, "make_reward_role", broken)
        monkeypatch.setattr(single, "driver_scores", lambda config, control: True)
    else:
        monkeypatch.setattr(parallel.ParallelController, "_connect", broken)
    with pytest.raises(ConfigError, match="no module 'missing'"):
        make_controller(load_config("tiny_test", OVERRIDES), _control(mode=mode))
    assert len(shut) == 1
