"""Config: presets load, dotted overrides apply after the preset, bad keys/types/values raise
ConfigError naming the key, and the resolved config round-trips through YAML."""

import pytest
import yaml

from yatt.config import (
    Config,
    config_from_dict,
    load_config,
    preset_names,
    save_config,
    to_dict,
)
from yatt.errors import ConfigError


def test_every_preset_loads() -> None:
    names = preset_names()
    assert {"demo", "grpo_addition", "ppo_addition", "tiny_test"} <= set(names)
    for name in names:
        assert isinstance(load_config(name), Config)


def test_defaults_then_preset_then_overrides() -> None:
    config = load_config("tiny_test", ["rollout.n_samples=8", "optim.lr=1e-5"])
    assert config.model.path == "tiny"  # from the preset
    assert config.rollout.n_samples == 8  # override
    assert config.optim.lr == pytest.approx(1e-5)  # '1e-5' is a float, not YAML's string
    assert config.algo.name == "grpo"  # default
    assert load_config("tiny_test", ["model.path=other"]).model.path == "other"


def test_list_and_bool_overrides() -> None:
    config = load_config(None, ["reward.fns=[math_answer,format]", "reward.weights=[1,0.5]",
                                "logging.tensorboard=true"])  # fmt: skip
    assert config.reward.fns == ("math_answer", "format")
    assert config.reward.weights == (1.0, 0.5)
    assert config.logging.tensorboard is True


def test_reward_weights_left_out_weigh_each_function_one() -> None:
    config = load_config(None, ["reward.fns=[math_answer,format]"])
    assert config.reward.weights == (1.0, 1.0)  # filled in: the saved config shows them
    with pytest.raises(ConfigError, match=r"one per entry of reward\.fns"):
        load_config(None, ["reward.fns=[math_answer,format]", "reward.weights=[1]"])


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("rollout.nsamples=3", "rollout.nsamples"),
        ("nosection.key=1", "nosection"),
        ("rollout.n_samples=abc", "rollout.n_samples"),
        ("train.steps=1.5", "train.steps"),
        ("logging.tensorboard=3", "logging.tensorboard"),
        ("algo.name=sac", "'sac'"),
        ("rollout.n_samples=0", "rollout.n_samples"),
        ("rollout", "section.key=value"),
        ("rollout=3", "is a section"),
        ("algo.kl_in_reward=true", "algo.kl_in_reward"),
        ("reward.weights=[1,2]", "reward.weights"),
        ("rollout.ignore_eos=maybe", "rollout.ignore_eos"),
    ],
)
def test_bad_overrides_raise_config_error(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_config("tiny_test", [override])
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["rollout.nsamples=3"])
    assert "n_samples" in str(info.value)


def test_bad_preset_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="neither a YAML file nor a preset"):
        load_config("no_such_preset")
    plain = tmp_path / "my_config"  # a YAML file without a suffix is read as one
    plain.write_text("train:\n  steps: 7\n")
    assert load_config(str(plain)).train.steps == 7
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {steps: [1, 2}\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("train:\n  stepz: 3\n")
    with pytest.raises(ConfigError, match="stepz"):
        load_config(str(unknown))
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("train:\n  steps: 3  # r\u00e9glages\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml is not UTF-8 \(byte 0xe9 on line 2\)$"):
        load_config(str(latin1))


@pytest.mark.parametrize("key", ["train.seed", "data.seed"])
@pytest.mark.parametrize("value", ["-1", "4294967296", "10000000000"])
def test_seeds_out_of_range_are_refused_at_load(key, value) -> None:
    with pytest.raises(ConfigError, match=rf"for '{key}'; expected an int in 0..4294967295"):
        load_config("tiny_test", [f"{key}={value}"])


def test_resolved_config_round_trips(tmp_path) -> None:
    config = load_config("ppo_addition", ["rollout.stop=[END]"])
    path = save_config(config, tmp_path)
    assert path.name == "config.yaml"
    reloaded = config_from_dict(yaml.safe_load(path.read_text()))
    assert reloaded == config
    assert load_config(str(path)) == config
    assert to_dict(config)["rollout"]["stop"] == ["END"]


def test_configs_are_frozen() -> None:
    config = load_config(None)
    with pytest.raises(AttributeError):
        config.train.steps = 5  # type: ignore[misc]


def test_a_leading_tilde_in_path_settings_is_the_home_folder(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = load_config("tiny_test", ["logging.run_dir=~/runs/x", "data.path=~/rows.jsonl"])
    assert config.logging.run_dir == f"{tmp_path}/runs/x"
    assert config.data.path == f"{tmp_path}/rows.jsonl"
    assert load_config("tiny_test", ["model.path=tiny"]).model.path == "tiny"  # names stay


def test_a_relative_data_path_is_recorded_whole(monkeypatch, tmp_path) -> None:
    # A saved config's relative data.path was read from wherever `yatt eval DIR` ran: another
    # folder's file of that name was evaluated silently.
    monkeypatch.chdir(tmp_path)
    config = load_config("tiny_test", ["data.path=rows.jsonl", "reward.model_path=rm"])
    assert (config.data.path, config.reward.model_path) == (
        f"{tmp_path}/rows.jsonl",
        f"{tmp_path}/rm",
    )
    assert load_config("tiny_test").data.path == ""  # (none: a generated task)


def test_an_empty_stop_string_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"for 'rollout.stop'; expected non-empty stop strings"):
        load_config("tiny_test", ["rollout.stop="])


def test_a_resume_that_scores_otherwise_is_named(tmp_path, caplog) -> None:
    # A resume with another reward was accepted without a word, and its report set the first
    # rewards of one scale beside the last of another.
    from yatt.checkpoint import warn_changed_scoring

    save_config(load_config("tiny_test"), tmp_path)  # as a checkpoint folder holds it
    assert warn_changed_scoring(tmp_path, load_config("tiny_test", ["train.steps=99"])) == []
    changed = load_config("tiny_test", ["reward.fns=[math_answer,format]"])
    lines = warn_changed_scoring(tmp_path, changed)
    assert lines[0] == (
        f"resuming {tmp_path} with reward.fns=['math_answer', 'format']; the run that wrote it "
        "had ['math_answer']: its metrics will mix the two"
    )
    assert [line.split(" with ")[1].split("=")[0] for line in lines] == [
        "reward.fns",
        "reward.weights",
    ]
    assert lines[0] in caplog.text
