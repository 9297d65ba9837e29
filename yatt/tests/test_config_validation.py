"""Config-time validation: settings that used to fail late (after training, inside a Ray worker,
inside torch) or were silently ignored now raise a one-line ConfigError naming the key and value
when the config is loaded. Method: load_config / ControlConfig only; nothing is trained."""

import math
import sys

import pytest
import yaml

from yatt.cli import main
from yatt.config import load_config
from yatt.config.files import _StrictLoader
from yatt.control.config import ControlConfig
from yatt.errors import ConfigError
from yatt.rewards import get_reward_fn, load_callable
from yatt.run_checks import check_budgets_fit_model, check_eval_data, check_training_dtype


def _error(overrides: list[str], preset: str | None = "tiny_test") -> str:
    with pytest.raises(ConfigError) as info:
        load_config(preset, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("eval.reward_fn=bogus", ["eval.reward_fn='bogus'", "unknown reward", "math_answer"]),
        ("reward.fns=[bogus]", ["reward.fns='bogus'", "unknown reward", "math_answer"]),
        ("eval.reward_fn=no_such_pkg:fn", ["eval.reward_fn='no_such_pkg:fn'", "cannot import"]),
        ("reward.fns=[yatt.rewards:nope]", ["reward.fns='yatt.rewards:nope'", "has no 'nope'"]),
        ("reward.fns=[my/rew.py:f]", ["names a file", "e.g. 'my.rew:f'", "holding my on"]),
        ("eval.max_new_tokens=0", ["eval.max_new_tokens", "0"]),
        # sizes past any machine: they allocated gigabytes, hung or crashed torch
        ("rollout.max_new_tokens=100000000", ["'rollout.max_new_tokens'", "1..131072"]),
        ("eval.max_new_tokens=1000000000000", ["'eval.max_new_tokens'", "1..131072"]),
        ('control.length_schedule=["1:99999999999"]', ["'control.length_schedule'", "1..131072"]),
        ('control.length_schedule=["²:5"]', ["'²:5'", "'step:tokens'"]),  # isdigit, not int
        ("train.torch_threads=100000", ["'train.torch_threads'", "0..1024"]),
        ("model.tiny_seed=100000000000000000000000", ["'model.tiny_seed'", "0..4294967295"]),
        # YAML 1.1 integer forms that silently changed the value (010 was 8, 1:30 was 90)
        ("train.steps=010", ["'train.steps' expects an int, got '010'"]),
        ("train.steps=1:30", ["'train.steps' expects an int, got '1:30'"]),
        ("train.steps=0x10", ["'train.steps' expects an int, got '0x10'"]),
        ("optim.beta1=1.5", ["optim.beta1", "1.5", "[0, 1)"]),
        ("optim.beta2=1", ["optim.beta2", "1.0"]),
        ("optim.eps=-1", ["optim.eps", "-1.0"]),
        ("optim.eps=0", ["optim.eps", "0.0"]),
        ("optim.weight_decay=-1", ["optim.weight_decay", "-1.0"]),
        ("optim.lr=inf", ["optim.lr", "inf", "finite"]),
        ("optim.lr=nan", ["optim.lr", "nan"]),
        ("optim.critic_lr=0", ["optim.critic_lr"]),
        ("optim.grad_clip=inf", ["optim.grad_clip", "inf"]),
        # non-finite floats used to pass validation and crash mid-run
        ("reward.weights=[.nan]", ["'reward.weights'", "[nan]", "finite numbers"]),
        ("reward.weights=[1, .inf]", ["'reward.weights'", "[1.0, inf]"]),
        ("reward.model_weight=-inf", ["'reward.model_weight'", "-inf", "a finite number"]),
        ("algo.entropy_coef=nan", ["'algo.entropy_coef'", "nan", "a finite number"]),
        ("algo.kl_coef=inf", ["'algo.kl_coef'", "inf"]),
        ("algo.clip_high=inf", ["'algo.clip_high'", "inf"]),
        ("algo.tis_cap=inf", ["'algo.tis_cap'", "inf"]),
        ("rollout.temperature=inf", ["'rollout.temperature'", "inf", "a finite number"]),
        ("rollout.top_p=nan", ["'rollout.top_p'", "nan"]),
        ("train.time_limit_s=inf", ["'train.time_limit_s'", "inf"]),
        ("control.over_dispatch=nan", ["'control.over_dispatch'", "nan"]),
        # ranges the losses assume (refused only mid-run, or silently broken, before)
        ("algo.overlong_penalty=-1", ["'algo.overlong_penalty'", "-1.0", ">= 0"]),
        ("algo.entropy_coef=-0.01", ["'algo.entropy_coef'", "-0.01", ">= 0"]),
        ("algo.value_clip=0", ["'algo.value_clip'", "0.0", "> 0"]),
        ("algo.value_clip=-0.2", ["'algo.value_clip'", "-0.2"]),
        ("algo.clip_low=1.5", ["'algo.clip_low'", "1.5", "in [0, 1]"]),
        ("rollout.temperature=-1", ["'rollout.temperature'", "-1.0", ">= 0"]),
    ],
)
def test_bad_values_fail_at_load(override: str, fragments: list[str]) -> None:
    message = _error([override])
    for fragment in fragments:
        assert fragment in message


def test_non_finite_values_in_a_config_file_are_refused(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("reward: {weights: [.nan]}\n")
    assert "'reward.weights'" in _error([], str(path))
    path.write_text("algo: {overlong_penalty: .inf}\n")
    assert "'algo.overlong_penalty'" in _error([], str(path))


def test_valid_float_edges_load() -> None:
    # (greedy sampling under a group estimator is refused: see the group estimators' test)
    overrides = ["rollout.temperature=0", "algo.clip_low=1", "algo.overlong_penalty=0",
                 "algo.entropy_coef=0", "reward.weights=[-0.5]",
                 "algo.name=reinforce_pp"]  # fmt: skip
    config = load_config("tiny_test", overrides)
    assert (config.rollout.temperature, config.reward.weights) == (0.0, (-0.5,))


def test_training_refuses_bf16_weights_which_eval_may_load(tmp_path, capsys) -> None:
    config = load_config("tiny_test", ["model.dtype=bfloat16"])  # fine for yatt eval
    with pytest.raises(ConfigError) as info:
        check_training_dtype(config)
    message = str(info.value)
    assert "\n" not in message and "model.dtype=bfloat16" in message
    assert "rollout.dtype=bfloat16" in message and "train.bf16_autocast=true" in message
    check_training_dtype(load_config("tiny_test", ["rollout.dtype=bfloat16"]))
    run_dir = tmp_path / "run"
    for command in ("train", "sft"):
        argv = [command, "tiny_test", "model.dtype=bfloat16", f"logging.run_dir={run_dir}"]
        assert main(argv) == 2
        assert "model.dtype=bfloat16 would train" in capsys.readouterr().err
        assert not run_dir.exists()  # refused before the run folder is claimed


def test_device_kind_cuda_without_a_gpu_says_so(monkeypatch) -> None:
    import torch

    from yatt.control.devices import discover_devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        discover_devices("cuda")
    message = str(info.value)
    assert "control.device_kind=cuda: no CUDA device found" in message
    assert "control.device_kind=cpu" in message
    assert discover_devices("auto")[0].kind == "cpu"


def test_valid_optim_and_reward_settings_load() -> None:
    overrides = ["optim.beta1=0", "optim.weight_decay=0.1", "eval.reward_fn=format",
                 "reward.fns=[math_boxed]"]  # fmt: skip
    config = load_config("tiny_test", overrides)
    assert config.optim.beta1 == 0.0
    assert config.eval.reward_fn == "format"
    judge = "yatt.control.workload:parity_reward"  # a user's function, by import path
    config = load_config("tiny_test", [f"eval.reward_fn={judge}", f"reward.fns=[{judge}]"])
    assert get_reward_fn(config.eval.reward_fn)("", "abc") == 1.0


@pytest.mark.parametrize(
    "override",
    [
        "control.n_devices=2",
        "control.placement=partial",
        "control.mode=single",
        "control.length_schedule=[0:4]",
        "control.extra_rewards=[yatt.control.workload:char_mix_reward]",
        "control.async_staleness=1",
        "control.oversubscribe=true",
    ],
)
def test_ray_only_control_keys_need_ray(override: str) -> None:
    key = override.split("=")[0]
    message = _error([override])
    assert f"{key}=" in message
    assert "needs control.backend=ray" in message
    load_config("tiny_test", [override, "control.backend=ray"])


@pytest.mark.parametrize(
    ("overrides", "named", "supported"),
    [
        (["algo.name=ppo"], ["algo.name='ppo'"], "algo.name in ['grpo', 'rloo']"),
        (["algo.name=reinforce_pp"], ["algo.name='reinforce_pp'"], "['grpo', 'rloo']"),
        (
            ["algo.kl_coef=0.05", "control.replace_every=2"],
            ["algo.kl_coef=0.05 with control.replace_every=2"],
            "algo.kl_coef=0 under runtime re-placement",
        ),
        (
            ["algo.name=ppo", "algo.kl_coef=0.1", "control.replace_every=1"],
            ["algo.name='ppo'", "algo.kl_coef=0.1 with control.replace_every=1"],
            "algo.kl_coef=0 under runtime re-placement",
        ),
    ],
)
def test_ray_controllers_refuse_what_only_the_trainer_supports(overrides, named, supported):
    message = _error(["control.backend=ray", *overrides])
    assert all(setting in message for setting in named), message
    assert supported in message and "single-process trainer" in message
    trainer_only = [o for o in overrides if not o.startswith("control.")]
    load_config("tiny_test", trainer_only)  # the single-process trainer takes each of them


def test_a_kl_term_under_runtime_replacement_needs_lora_adapters() -> None:
    overrides = ["control.backend=ray", "algo.kl_coef=0.05", "control.replace_every=2"]
    assert "or model.lora_rank > 0" in _error(overrides)
    load_config("tiny_test", [*overrides, "model.lora_rank=8"])  # the reference is the base


def test_bf16_rollouts_refuse_a_top_p_or_top_k_filter() -> None:
    message = _error(["rollout.dtype=bfloat16", "rollout.top_p=0.7"])
    assert "rollout.dtype=bfloat16 with rollout.top_p=0.7 rollout.top_k=0" in message
    assert "top_p=1 and top_k=0" in _error(["rollout.dtype=bfloat16", "rollout.top_k=50"])
    load_config("tiny_test", ["rollout.dtype=bfloat16"])  # no filter: fine


def test_an_overlong_buffer_must_fit_every_response_budget() -> None:
    message = _error(["algo.overlong_buffer=9", "rollout.max_new_tokens=8"])
    assert "algo.overlong_buffer=9 is longer than rollout.max_new_tokens=8" in message
    message = _error(["control.backend=ray", "algo.overlong_buffer=4", "rollout.max_new_tokens=8",
                      "control.length_schedule=['0:8','5:3']"])  # fmt: skip
    assert "response budget 3 of control.length_schedule=['0:8', '5:3']" in message
    unquoted = ["control.backend=ray", "control.length_schedule=[0:8,5:3]"]  # (not 8 and 303)
    assert load_config("tiny_test", unquoted).control.length_schedule == ("0:8", "5:3")
    message = _error(["control.backend=ray", "control.length_schedule=['0:4','0:8']"])
    assert "control.length_schedule" in message and "one budget per step" in message


def test_ray_controllers_take_the_group_estimators_and_dapo_settings() -> None:
    supported = ["algo.name=rloo", "algo.dynamic_sampling=true", "algo.entropy_coef=0.01",
                 "algo.overlong_buffer=4",
                 "algo.kl_coef=0.05", "checkpoint.at_end=true", "checkpoint.every=5",
                 "checkpoint.resume=auto", "control.backend=ray"]  # fmt: skip
    assert load_config("tiny_test", supported).algo.name == "rloo"


def test_control_keys_at_their_defaults_are_fine_in_process() -> None:
    defaults = ["control.mode=parallel", "control.n_devices=0", "control.over_dispatch=0",
                "control.length_schedule=[]"]  # fmt: skip
    config = load_config("tiny_test", defaults)
    assert config.control.backend == "inprocess"


def test_in_process_controllers_keep_their_own_control_config() -> None:
    control = ControlConfig(backend="inprocess", n_devices=1, device_kind="cpu",
                            extra_rewards=("yatt.control.workload:char_mix_reward",))  # fmt: skip
    assert control.n_devices == 1


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    (tmp_path / "boom_reward.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "unparsable_reward.py").write_text("def f(:\n")
    (tmp_path / "good_reward.py").write_text("def f(prompt, completion, **fields):\n    return 1\n"
                                             "NOT_A_FUNCTION = 3\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_such_module_xyz:fn", "ModuleNotFoundError"),
        ("boom_reward:f", "RuntimeError: boom"),
        ("unparsable_reward:f", "SyntaxError"),
        ("good_reward:missing", "has no 'missing'"),
        ("good_reward:NOT_A_FUNCTION", "not callable"),
        (":f", "'package.module:function'"),
        ("good_reward:", "'package.module:function'"),
        ("good_reward", "'package.module:function'"),
    ],
)
def test_extra_rewards_resolve_in_the_driver(user_modules, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("tiny_test", ["control.backend=ray", f"control.extra_rewards=[{path!r}]"])
    message = str(info.value)
    assert "\n" not in message
    assert f"control.extra_rewards={path!r}" in message
    assert fragment in message


def test_load_callable_returns_the_function(user_modules) -> None:
    assert load_callable("good_reward:f")("", "") == 1
    ray = ["control.backend=ray", "control.extra_rewards=good_reward:f"]
    config = load_config("tiny_test", ray)
    assert config.control.extra_rewards == ("good_reward:f",)


def test_no_heldout_with_eval_on_is_refused_for_the_trainer() -> None:
    with pytest.raises(ConfigError, match=r"data\.n_heldout=0 leaves nothing to evaluate"):
        check_eval_data(load_config("tiny_test", ["data.n_heldout=0"]))
    for off in (["eval.n=0"], ["eval.at_start=false", "eval.at_end=false"]):
        check_eval_data(load_config("tiny_test", ["data.n_heldout=0", *off]))
    periodic = ["data.n_heldout=0", "eval.at_start=false", "eval.at_end=false", "eval.every=2"]
    with pytest.raises(ConfigError, match=r"eval\.n=0"):
        check_eval_data(load_config("tiny_test", periodic))


def test_yaml_numeric_strings_and_empty_sections(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("optim: {lr: 1e-5, eps: 1E-6}\nreward: {weights: [5e-1]}\ntrain:\neval:\n")
    config = load_config(str(path))
    assert math.isclose(config.optim.lr, 1e-5)
    assert math.isclose(config.optim.eps, 1e-6)
    assert config.reward.weights == (0.5,)
    assert config.train.steps == load_config(None).train.steps
    path.write_text("optim: {lr: fast}\n")
    assert "'optim.lr' expects float" in _error([], str(path))
    path.write_text("train: 3\n")
    assert "'train' expects a mapping" in _error([], str(path))


@pytest.mark.parametrize("text", ["", "# only a comment\n", "model:\ntrain:\n", "train: {}\n"])
def test_a_config_file_that_sets_nothing_is_refused(tmp_path, text) -> None:
    """An empty file (or one of comments or empty sections) would run every default: 100
    steps into runs/default. It is refused, naming the presets to start from."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    error = _error([], str(path))
    assert f"config file {path} sets nothing" in error and "tiny_test" in error, error
    # with overrides it is a base of defaults, as a preset is
    assert load_config(str(path), ["train.steps=5"]).train.steps == 5


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "tiny_test", "--bogus"], "yatt: error: unrecognized arguments: --bogus"),
        (["train"], "yatt: error: train: the following arguments are required: config"),
    ],
)
def test_usage_errors_name_the_program_once(argv, expected, capsys) -> None:
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(expected)
    assert "yatt: error: yatt" not in error


def test_a_key_given_twice_in_a_config_file_is_refused_with_its_line(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  steps: 3\n  seed: 1\n  steps: 5\n")
    message = _error([], str(path))
    assert "'steps' appears twice" in message and "line 4" in message
    path.write_text("train:\n  steps: 3\neval:\n  n: 4\ntrain:\n  seed: 2\n")
    assert "'train' appears twice" in _error([], str(path))
    path.write_text("train: {steps: 3}\neval: {n: 4}\n")  # the same name in two sections is fine
    assert load_config(str(path)).train.steps == 3
    path.write_text("rollout: &r {max_new_tokens: 8}\neval: {<<: *r, n: 4}\n")  # a YAML merge
    assert load_config(str(path)).eval.max_new_tokens == 8
    path.write_text("rollout: &r {max_new_tokens: 8}\neval: {<<: *r, max_new_tokens: 6}\n")
    assert load_config(str(path)).eval.max_new_tokens == 6  # overriding a merged key is fine
    # an anchored mapping that overrides a merged key, merged again before it is built itself
    nested = "base: &B {a: 1}\nx: {inner: &X {<<: *B, a: 2}}\ny: {<<: *X}\n"
    assert yaml.load(nested, Loader=_StrictLoader) == yaml.safe_load(nested)


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_group_estimators_need_two_samples_per_prompt(algo: str) -> None:
    message = _error([f"algo.name={algo}", "rollout.n_samples=1"])
    assert f"algo.name={algo}" in message and "rollout.n_samples=1" in message
    config = load_config("tiny_test", ["algo.name=reinforce_pp", "rollout.n_samples=1"])
    assert config.rollout.n_samples == 1
    # greedy sampling makes a group's completions one completion: no signal either
    message = _error([f"algo.name={algo}", "rollout.temperature=0"])
    assert "rollout.temperature=0 (greedy)" in message and "every advantage would be 0" in message


def test_log_level_is_checked_and_applied(monkeypatch) -> None:
    import logging

    from yatt.cli import _configured

    assert load_config("tiny_test", ["logging.level=warning"]).logging.level == "WARNING"
    assert load_config("tiny_test", ["logging.level=warn"]).logging.level == "WARNING"
    assert load_config("tiny_test", ["logging.level=fatal"]).logging.level == "CRITICAL"
    assert "'logging.level'" in _error(["logging.level=loud"])
    monkeypatch.setenv("YATT_LOG_LEVEL", "chatty")
    assert main(["train", "tiny_test"]) == 2  # refused before any work
    root, before = logging.getLogger(), logging.getLogger().level
    try:
        monkeypatch.setenv("YATT_LOG_LEVEL", "INFO")  # the environment wins over the config
        _configured(load_config("tiny_test", ["logging.level=ERROR"]))
        assert root.level == before
        monkeypatch.delenv("YATT_LOG_LEVEL")
        _configured(load_config("tiny_test", ["logging.level=ERROR"]))
        assert root.level == logging.ERROR
    finally:
        root.setLevel(before)


def test_a_reward_module_in_the_current_folder_gets_a_hint(tmp_path, monkeypatch):
    # The `yatt` command's import path starts at its own folder, not the current one (where
    # `python -m yatt` would find the module): the error says so.
    (tmp_path / "myreward_hint.py").write_text("def score(**kw):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    with pytest.raises(ConfigError, match=r"myreward_hint is in the current folder, which is not"):
        load_callable("myreward_hint:score", "reward.fns")


def test_configs_built_in_python_are_checked_as_loaded_ones():
    """A section built directly is held to the file's rules: lists become tuples and ints
    floats, paths strings; anything else of the wrong type is a one-line ConfigError."""
    from pathlib import Path

    import numpy as np

    from yatt.config import Config, DataConfig, LoggingConfig, RewardConfig, TrainConfig

    reward = RewardConfig(fns="math_answer")  # one name, not five letters
    assert reward.fns == ("math_answer",) and reward.weights == (1.0,)
    assert RewardConfig(fns=["math_answer"], weights=[2]).weights == (2.0,)
    assert LoggingConfig(run_dir=Path("runs/x")).run_dir == "runs/x"
    assert DataConfig(path=Path("rows.jsonl")).path == str(Path("rows.jsonl").resolve())
    assert (
        TrainConfig(steps=np.int64(3)).steps == 3
        and type(TrainConfig(steps=np.int64(3)).steps) is int
    )
    cases = [
        (lambda: TrainConfig(steps="10"), "'train.steps' expects an int, got '10'"),
        (lambda: ControlConfig(n_devices=2.0), "'control.n_devices' expects an int"),
        (lambda: ControlConfig(oversubscribe=1), "'control.oversubscribe' expects true/false"),
        (lambda: Config(train={"steps": 3}), "'train' expects a TrainConfig, got {'steps': 3}"),
        (lambda: RewardConfig(fns=("math_answer", 3)), r"'reward.fns\[1\]' expects str"),
    ]
    for make, message in cases:
        with pytest.raises(ConfigError, match=message):
            make()


def test_a_batch_scorer_cannot_be_the_eval_reward(tmp_path, monkeypatch):
    """eval.reward_fn is called row by row: a scorer object there is refused at load, where
    reward.fns takes it."""
    (tmp_path / "scorer_mod.py").write_text(
        "class S:\n    def score_batch(self, p, c, r):\n        return [0.0] * len(p)\n"
        "scorer = S()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_config("tiny_test", ["reward.fns=[scorer_mod:scorer]"]).reward.fns
    message = r"'scorer' is not callable \(it is a S\); this setting calls its reward as fn"
    with pytest.raises(ConfigError, match=r"eval.reward_fn='scorer_mod:scorer': " + message):
        load_config("tiny_test", ["eval.reward_fn=scorer_mod:scorer"])


def test_a_config_file_reads_decimal_numbers_only(tmp_path):
    """The same YAML 1.1 forms in a file are refused by name too; decimal ints (with _), floats
    with an exponent and the presets still read as before."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 010\n")
    assert "'train.steps' expects an int, got '010'" in _error([], str(path))
    path.write_text("train:\n  steps: 1_000\noptim:\n  lr: 1.5e-5\n")
    config = load_config(str(path))
    assert (config.train.steps, config.optim.lr) == (1000, 1.5e-5)


def test_a_response_budget_must_leave_room_in_the_models_positions(tmp_path) -> None:
    """Checked once the model is loaded (a config does not know its model's positions): the
    tiny model has 1024, so a 1024-token budget is refused before any step."""
    from types import SimpleNamespace

    from yatt.trainer import Trainer

    config = load_config("tiny_test", ["rollout.max_new_tokens=1024", "eval.n=0",
                                       f"logging.run_dir={tmp_path / 'run'}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"rollout\.max_new_tokens asks for 1024 new tokens, "):
        Trainer(config)
    assert not (tmp_path / "run").exists()  # a refused fresh run leaves no folder
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    config = load_config("tiny_test", ["eval.max_new_tokens=64", "eval.n=0"])
    check_budgets_fit_model(config, model)  # training that does not evaluate: rollout's only
    with pytest.raises(ConfigError, match=r"eval\.max_new_tokens asks for 64 new tokens, .* 64 "):
        check_budgets_fit_model(config, model, train=False)  # yatt eval
    check_budgets_fit_model(config, SimpleNamespace(config=SimpleNamespace()))  # no stated limit
    # a controller checks the schedule of the ControlConfig it runs, not config.control's
    with pytest.raises(ConfigError, match=r"control\.length_schedule asks for 80 new tokens"):
        check_budgets_fit_model(config, model, length_schedule=("0:4", "3:80"))


def test_a_repeated_key_in_an_override_value_and_mixed_key_types_are_one_line_errors(tmp_path):
    from yatt.config import load_config
    from yatt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"value '\{a: 1, a: 2\}' for 'train.steps'"):
        load_config("tiny_test", ["train.steps={a: 1, a: 2}"])
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("train:\n  1: 2\n  x: 3\n")
    with pytest.raises(ConfigError, match="unknown config key '1' in 'train'"):
        load_config(str(mixed))


def test_a_gpu_is_named_by_its_ordinal_in_the_process(monkeypatch) -> None:
    """A Ray actor sees only the GPU Ray reserved for it (CUDA_VISIBLE_DEVICES): the run's
    GPU 3 is then the actor's cuda:0; a process that sees every GPU keeps the index, and one
    that sees several but not this one is refused with the visible list."""
    import torch

    from yatt.control.devices import Device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert Device("cuda", 3).torch_device() == torch.device("cuda", 0)
    assert Device("cuda", 0).torch_device() == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert Device("cuda", 3).torch_device() == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(ConfigError, match=r"GPU 3 is not among the 2 .*=4,5\)"):
        Device("cuda", 3).torch_device()
    assert Device("cpu", 1).torch_device() == torch.device("cpu")


def test_rng_state_leaves_cuda_alone_in_a_process_that_never_used_it(monkeypatch) -> None:
    """A CPU-only trainer on a GPU host: asking for every GPU's RNG state would start CUDA on
    all of them (and fail on busy ones); only a process that used CUDA saves its state."""
    import torch

    from yatt.common.seeding import rng_state

    def refuse() -> None:
        raise AssertionError("CUDA was started")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", refuse)
    assert "cuda" not in rng_state()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["state"])
    assert rng_state()["cuda"] == ["state"]
