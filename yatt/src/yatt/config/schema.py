"""The run configuration's schema: one frozen dataclass per component, each checking its
values when built (`check_section` against the annotations, then its own ranges); `Config` holds
them all and refuses settings that conflict across sections. `yatt.config.files` reads and
writes them."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from yatt.algos.losses import AGG_MODES, DPO_LOSSES
from yatt.control.config import RESPONSE_TOKENS_MAX, ControlConfig
from yatt.data import TASKS
from yatt.errors import ConfigError
from yatt.rewards import REWARD_FNS, load_callable

__all__ = [
    "GROUP_ESTIMATORS",
    "LORA_TARGETS",
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainConfig",
    "changed_settings",
    "check_controller_settings",
    "check_section",
    "log_level",
]


# Each algorithm (algo.name) and its advantage estimator (yatt.algos.advantages), for the
# trainer and the distributed controllers alike (`AlgoConfig.estimator`).
ESTIMATORS = {"grpo": "grpo", "ppo": "gae", "rloo": "rloo", "reinforce_pp": "reinforce_pp"}
ALGOS = tuple(ESTIMATORS)
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")
ROLLOUT_DTYPES = ("float32", "bfloat16")
# The projections of a Llama-family decoder layer that LoRA adapters may sit on (model.lora_*).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SEED_MAX = 2**32 - 1
# What the rejected response of a pair `yatt rm` or `yatt dpo` makes from a task is
# (`data.rejected`).
REJECTED_KINDS = ("slips", "samples", "both")
THREADS_MAX = 1024  # more torch threads than any machine's cores (100000 crashes torch)
# Settings naming files or folders: a leading "~" is the home folder (a shell leaves the "~" of
# `logging.run_dir=~/runs` as it is).
PATH_KEYS = ("model.path", "data.path", "reward.model_path", "logging.run_dir", "checkpoint.resume")
# Those that only ever name files or folders (model.path may be a model's name, resume a
# keyword): made absolute, as relative to the working directory the config is loaded from (as
# a command line's paths are; not to the YAML file's own folder).
_FILE_KEYS = ("data.path", "reward.model_path")


def _require(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"invalid value {value!r} for '{key}'; expected {allowed}")


def check_section(section: object, prefix: str) -> None:
    """Check every field of a config section against its annotation, as `_coerce` checks a
    YAML file's or an override's value: a list (or one value) becomes a tuple, an int or a
    number's text a float where a float is due, a Path its string; any other mismatch is a
    one-line ConfigError (`TrainConfig(steps="10")`). Then a leading "~" of a path setting is
    the home folder and a file setting is made absolute (`PATH_KEYS`, `_FILE_KEYS`), and NaN
    and infinities are refused (`_require_finite`). Every section's `__post_init__` starts
    with it, so a config built in Python is held to what a loaded one is."""
    hints = _field_types(type(section))
    for item in dataclasses.fields(section):  # type: ignore[arg-type]
        key = f"{prefix}.{item.name}" if prefix else item.name
        value, annotation = getattr(section, item.name), hints[item.name]
        if dataclasses.is_dataclass(annotation):
            if not isinstance(value, annotation):
                raise ConfigError(f"'{key}' expects a {annotation.__name__}, got {value!r:.80}")
            continue
        checked = _coerce(key, value, annotation)
        if key in PATH_KEYS and checked.startswith("~"):  # no shell expands it there
            checked = os.path.expanduser(checked)
        if key in _FILE_KEYS and checked:  # recorded whole: a saved config (`yatt eval DIR`)
            checked = os.path.abspath(checked)  # reads it from anywhere
        if checked is not value:
            object.__setattr__(section, item.name, checked)
    _require_finite(section, prefix)


def _require_finite(section: object, prefix: str) -> None:
    """Refuse NaN and +-inf in every float field (and float list) of a config section.

    No float setting gives them a meaning (`0` is the "off" value where there is one), and they
    slip through range checks (NaN fails every comparison; inf passes `> 0`), then crash or
    poison the run mid-way.
    """
    for item in dataclasses.fields(section):  # type: ignore[arg-type]
        value = getattr(section, item.name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            many = isinstance(value, tuple)
            allowed = "finite numbers" if many else "a finite number"
            _require(False, f"{prefix}.{item.name}", list(values) if many else value, allowed)


# Advantages relative to the prompt's other samples: they depend only on the rows of one group,
# so the distributed controllers' shards (whole groups) compute them exactly.
GROUP_ESTIMATORS = ("grpo", "rloo")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(value: object, where: str) -> str:
    """A log level name (any case; WARN and FATAL as logging reads them) as logging spells it;
    ConfigError naming `where` if not."""
    level = value.upper() if isinstance(value, str) else value
    level = {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(level, level)  # type: ignore[arg-type]
    _require(level in LOG_LEVELS, where, value, f"one of {', '.join(LOG_LEVELS)}")
    return level  # type: ignore[return-value]


def _require_reward(key: str, name: str, *, scorers: bool = True) -> None:
    """Reward names resolve at load, not when scoring or evaluating starts (after training):
    a registered name, or a "package.module:function" path that imports (a batch scorer only
    where `scorers`: a setting scored through CombinedReward)."""
    if ":" in name:
        load_callable(name, key, scorers=scorers)
    elif name not in REWARD_FNS:
        raise ConfigError(
            f"{key}={name!r}: unknown reward; known: {sorted(REWARD_FNS)} "
            "or 'package.module:function'"
        )


@dataclass(frozen=True)
class ModelConfig:
    """The policy model: a local HF folder, a known name ('smollm2') or 'tiny' (random init).

    `dtype` is the dtype the weights are loaded in. "bfloat16" is for inference (`yatt eval`):
    training runs refuse it (`run_checks`), as bf16 weights lose most AdamW updates
    to rounding; they train fp32 weights, sampling in bf16 with `rollout.dtype=bfloat16`.

    `lora_rank` > 0 trains low-rank adapters (`yatt.lora`) on the `lora_targets` projections
    instead of the weights, which stay frozen; the update is `lora_alpha / lora_rank` times
    B @ A. The KL reference is then the policy with its adapters off (no second copy), weight
    sync moves the adapters alone, and a saved model folder holds the merged weights (a plain
    model) plus the adapters (`adapter.safetensors`, `adapter.json`).
    """

    path: str = "smollm2"
    dtype: str = "float32"
    tiny_seed: int = 0
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        check_section(self, "model")
        _require(bool(self.path), "model.path", self.path, "a model folder or name")
        dtypes = ("float32", "bfloat16")
        _require(self.dtype in dtypes, "model.dtype", self.dtype, f"one of {dtypes}")
        _require(self.lora_rank >= 0, "model.lora_rank", self.lora_rank, "an int >= 0 (0: off)")
        seeds = f"an int in 0..{SEED_MAX}"
        _require(0 <= self.tiny_seed <= SEED_MAX, "model.tiny_seed", self.tiny_seed, seeds)
        _require(self.lora_alpha > 0, "model.lora_alpha", self.lora_alpha, "a number > 0")
        targets = self.lora_targets
        known = bool(targets) and set(targets) <= set(LORA_TARGETS)
        _require(
            known and len(set(targets)) == len(targets),
            "model.lora_targets", list(targets), f"distinct names among {list(LORA_TARGETS)}",
        )  # fmt: skip


@dataclass(frozen=True)
class DataConfig:
    """Prompt source: a built-in task generator or a JSONL/parquet file (`path`).

    `rejected` is read by `yatt rm` and `yatt dpo` alone, for pairs made from `task`: what a
    pair's rejected response is. "slips": the reference answer off by a slip (whole-number
    answers); "samples": the model's own completion that `reward.fns` scores lowest
    (`rollout.*` sampling), under its best-scoring one or else the reference answer; "both": a
    pair of each kind per prompt.
    """

    task: str = "addition"
    path: str = ""
    n_train: int = 5000
    n_heldout: int = 200
    seed: int = 0
    use_chat_template: bool = True
    rejected: str = "slips"

    def __post_init__(self) -> None:
        check_section(self, "data")
        if not self.path:  # rows from a file make the task moot
            _require(self.task in TASKS, "data.task", self.task, f"one of {', '.join(TASKS)}")
        _require(self.n_train > 0, "data.n_train", self.n_train, "an int > 0")
        _require(self.n_heldout >= 0, "data.n_heldout", self.n_heldout, "an int >= 0")
        _require(0 <= self.seed <= SEED_MAX, "data.seed", self.seed, f"an int in 0..{SEED_MAX}")
        _require(
            self.rejected in REJECTED_KINDS, "data.rejected", self.rejected,
            f"one of {', '.join(REJECTED_KINDS)}",
        )  # fmt: skip


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling: `n_samples` completions per prompt (the group size).

    `dtype` is the sampler's compute dtype. "bfloat16" samples with bf16 copies of the fp32
    policy weights (refreshed after every update; yatt backend only) while training stays fp32;
    the sampler's log-probs then differ from the trainer's, so the batch carries them as
    behaviour log-probs and the policy loss applies a truncated importance-sampling weight
    min(p_train / p_sampler, algo.tis_cap) per token. `ignore_eos` samples past EOS (every
    completion runs to `max_new_tokens` or a stop string; yatt and vllm backends), for
    benchmarks that need fixed response lengths.
    """

    backend: str = "yatt"
    n_samples: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    dtype: str = "float32"
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        check_section(self, "rollout")
        _require(
            self.backend in ("yatt", "hf", "vllm"),
            "rollout.backend",
            self.backend,
            "'yatt', 'hf' or 'vllm'",
        )
        _require(self.n_samples >= 1, "rollout.n_samples", self.n_samples, "an int >= 1")
        _require(
            1 <= self.max_new_tokens <= RESPONSE_TOKENS_MAX,
            "rollout.max_new_tokens", self.max_new_tokens, f"an int in 1..{RESPONSE_TOKENS_MAX}",
        )  # fmt: skip
        _require(
            self.temperature >= 0, "rollout.temperature", self.temperature, ">= 0 (0 = greedy)"
        )
        _require(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "in (0, 1]")
        _require(self.top_k >= 0, "rollout.top_k", self.top_k, ">= 0")
        _require(
            self.dtype in ROLLOUT_DTYPES, "rollout.dtype", self.dtype, f"one of {ROLLOUT_DTYPES}"
        )
        _require(
            self.dtype == "float32" or self.backend == "yatt",
            "rollout.dtype",
            self.dtype,
            "'float32' unless rollout.backend is 'yatt'",
        )
        if self.dtype != "float32" and (self.top_p < 1.0 or self.top_k):
            # The importance weights divide by the sampler's log-probs, which are under the
            # top-p/top-k filtered distribution: they would correct for the filter as well as
            # for bf16, which fp32 rollouts do not (measured: tis_mean 0.70 at top_p=0.7).
            raise ConfigError(
                f"rollout.dtype={self.dtype} with rollout.top_p={self.top_p} "
                f"rollout.top_k={self.top_k}: bf16 rollouts correct the update for the "
                "sampler's distribution, which would then include the top-p/top-k filter; "
                "use top_p=1 and top_k=0 with bf16 rollouts (or rollout.dtype=float32)"
            )
        _require(isinstance(self.ignore_eos, bool), "rollout.ignore_eos", self.ignore_eos, "a bool")
        _require(  # (`rollout.stop=` with nothing after it gives one empty string)
            all(self.stop), "rollout.stop", list(self.stop), "non-empty stop strings"
        )
        _require(
            not self.ignore_eos or self.backend != "hf",
            "rollout.ignore_eos",
            self.ignore_eos,
            "false unless rollout.backend is 'yatt' or 'vllm'",
        )

    @property
    def samples_off_policy(self) -> bool:
        """True when the sampler's distribution differs from the trainer's (bf16 rollouts)."""
        return self.dtype != "float32"


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: advantage estimator, policy loss, KL, DAPO pieces."""

    name: str = "grpo"
    prompts_per_step: int = 2
    ppo_passes: int = 1
    micro_batch_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 0.0  # c > 1: negative-advantage losses capped at c * |A| (0 = off)
    loss_agg: str = "token_mean"
    kl_coef: float = 0.0
    kl_kind: str = "low_var_kl"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    gamma: float = 1.0
    lam: float = 1.0
    norm_std: bool = True
    value_clip: float = 0.2
    dynamic_sampling: bool = False
    max_refill_batches: int = 4
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    skip_zero_adv: bool = True
    tis_cap: float = 2.0  # truncated IS weight cap C (used when rollouts carry behaviour log-probs)
    dpo_beta: float = 0.1  # yatt dpo's beta: the KL weight of the objective DPO optimises
    # yatt dpo's loss over the pair's log-ratio h: sigmoid (DPO), robust, hinge (SLiC) or ipo;
    # label smoothing e (sigmoid: conservative DPO; robust: the label noise it corrects for)
    dpo_loss: str = "sigmoid"
    dpo_label_smoothing: float = 0.0
    # the chosen responses' NLL per token, this much of it added to yatt dpo's loss (RPO,
    # Pang et al. 2024: the chosen answer's likelihood kept up); 0 = off
    dpo_sft_weight: float = 0.0

    def __post_init__(self) -> None:
        check_section(self, "algo")
        _require(self.name in ALGOS, "algo.name", self.name, f"one of {ALGOS}")
        _require(self.loss_agg in AGG_MODES, "algo.loss_agg", self.loss_agg, f"one of {AGG_MODES}")
        _require(self.kl_kind in KL_KINDS, "algo.kl_kind", self.kl_kind, f"one of {KL_KINDS}")
        _require(self.prompts_per_step >= 1, "algo.prompts_per_step", self.prompts_per_step, ">= 1")
        _require(self.ppo_passes >= 1, "algo.ppo_passes", self.ppo_passes, ">= 1")
        _require(self.micro_batch_size >= 1, "algo.micro_batch_size", self.micro_batch_size, ">= 1")
        _require(0 <= self.clip_low <= 1, "algo.clip_low", self.clip_low, "in [0, 1]")
        _require(self.clip_high >= 0, "algo.clip_high", self.clip_high, ">= 0")
        _require(self.dual_clip == 0 or self.dual_clip > 1, "algo.dual_clip", self.dual_clip,
                 "0 (off) or > 1")  # fmt: skip
        _require(self.kl_coef >= 0, "algo.kl_coef", self.kl_coef, ">= 0")
        _require(self.entropy_coef >= 0, "algo.entropy_coef", self.entropy_coef, ">= 0 (0 = off)")
        _require(self.value_clip > 0, "algo.value_clip", self.value_clip, "> 0")
        _require(0 <= self.gamma <= 1, "algo.gamma", self.gamma, "in [0, 1]")
        _require(0 <= self.lam <= 1, "algo.lam", self.lam, "in [0, 1]")
        _require(
            self.max_refill_batches >= 0, "algo.max_refill_batches", self.max_refill_batches, ">= 0"
        )
        _require(self.overlong_buffer >= 0, "algo.overlong_buffer", self.overlong_buffer, ">= 0")
        _require(self.overlong_penalty >= 0, "algo.overlong_penalty", self.overlong_penalty, ">= 0")
        _require(self.tis_cap >= 1, "algo.tis_cap", self.tis_cap, ">= 1")
        _require(self.dpo_beta > 0, "algo.dpo_beta", self.dpo_beta, "> 0")
        _require(self.dpo_loss in DPO_LOSSES, "algo.dpo_loss", self.dpo_loss,
                 f"one of {DPO_LOSSES}")  # fmt: skip
        smoothing = self.dpo_label_smoothing
        _require(0 <= smoothing < 0.5, "algo.dpo_label_smoothing", smoothing, "in [0, 0.5)")
        _require(self.dpo_sft_weight >= 0, "algo.dpo_sft_weight", self.dpo_sft_weight,
                 ">= 0 (0 = off)")  # fmt: skip
        smoothed = f"0 with algo.dpo_loss={self.dpo_loss} (it smooths sigmoid and robust)"
        _require(smoothing == 0 or self.dpo_loss in ("sigmoid", "robust"),
                 "algo.dpo_label_smoothing", smoothing, smoothed)  # fmt: skip
        token_level = ("ppo", "reinforce_pp")
        _require(
            not self.kl_in_reward or self.name in token_level,
            "algo.kl_in_reward",
            self.kl_in_reward,
            f"false unless algo.name is one of {token_level}",
        )

    @property
    def estimator(self) -> str:
        """The advantage estimator `algos.advantages.compute_advantages` runs for `name`."""
        return ESTIMATORS[self.name]

    @property
    def uses_critic(self) -> bool:
        return self.name == "ppo"

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0


@dataclass(frozen=True)
class RewardConfig:
    """Reward = sum of weighted rule functions (names from yatt.rewards, or a user's own as
    "package.module:function") [+ a BT reward model]. `weights` has one weight per entry of
    `fns`; left empty, each function weighs 1.0 (filled in, so the saved config shows them)."""

    fns: tuple[str, ...] = ("math_answer",)
    weights: tuple[float, ...] = ()
    model_path: str = ""
    model_weight: float = 1.0

    def __post_init__(self) -> None:
        check_section(self, "reward")
        for name in self.fns:
            _require_reward("reward.fns", name)
        if not self.weights:
            object.__setattr__(self, "weights", (1.0,) * len(self.fns))
        _require(
            len(self.fns) == len(self.weights),
            "reward.weights",
            self.weights,
            f"{len(self.fns)} weights, one per entry of reward.fns (or none: 1.0 each)",
        )
        _require(
            bool(self.fns) or bool(self.model_path),
            "reward.fns",
            self.fns,
            "at least one reward function or reward.model_path",
        )
        _require(
            bool(self.model_path) or self.model_weight == 1.0,
            "reward.model_weight",
            self.model_weight,
            "no other weight than 1.0 without reward.model_path (it weighs the reward model)",
        )


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with a learning-rate schedule (linear decays to 0 at the last step)."""

    lr: float = 5e-6
    schedule: str = "linear"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    critic_lr: float = 1e-5

    def __post_init__(self) -> None:
        check_section(self, "optim")
        schedules = ("linear", "constant", "cosine")
        _require(self.schedule in schedules, "optim.schedule", self.schedule, f"one of {schedules}")
        # NaN fails every comparison; inf passes '> 0', so each bound also asks for a finite value
        _require(math.isfinite(self.lr) and self.lr > 0, "optim.lr", self.lr, "a finite float > 0")
        _require(
            math.isfinite(self.critic_lr) and self.critic_lr > 0,
            "optim.critic_lr",
            self.critic_lr,
            "a finite float > 0",
        )
        _require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, ">= 0")
        _require(
            math.isfinite(self.weight_decay) and self.weight_decay >= 0,
            "optim.weight_decay",
            self.weight_decay,
            "a finite float >= 0",
        )
        _require(0 <= self.beta1 < 1, "optim.beta1", self.beta1, "in [0, 1)")
        _require(0 <= self.beta2 < 1, "optim.beta2", self.beta2, "in [0, 1)")
        _require(
            math.isfinite(self.eps) and self.eps > 0, "optim.eps", self.eps, "a finite float > 0"
        )
        _require(
            math.isfinite(self.grad_clip) and self.grad_clip >= 0,
            "optim.grad_clip",
            self.grad_clip,
            "a finite float >= 0 (0 = off)",
        )


@dataclass(frozen=True)
class TrainConfig:
    """Loop length, seed, device and execution knobs (results do not depend on the knobs
    beyond float rounding: `shared_prefix` runs each prompt once per group in the policy's
    log-probs and update and in PPO's critic, and in `yatt sft` the start all of a step's
    prompts share (a chat template's system turn) once;
    `gradient_checkpointing` keeps only each decoder layer's input through a training forward
    and recomputes the rest in the backward pass, trading one more forward per layer for
    about half the activation memory (measured: 1.16x the update time at 128 response tokens,
    no slower at 512; docs/benchmarks.md); its forward runs whole rows, so the policy's update
    then shares no prompt pass). `time_limit_s` > 0 ends training early (then evaluates) once
    the loop has run that long."""

    steps: int = 100
    seed: int = 0
    device: str = "cpu"
    torch_threads: int = 0
    bf16_autocast: bool = False
    shared_prefix: bool = True
    gradient_checkpointing: bool = False
    time_limit_s: float = 0.0

    def __post_init__(self) -> None:
        check_section(self, "train")
        _require(self.steps >= 1, "train.steps", self.steps, "an int >= 1")
        # Seeds derived from it (per step, row and rank) must stay within torch's 64 bits.
        _require(0 <= self.seed <= SEED_MAX, "train.seed", self.seed, f"an int in 0..{SEED_MAX}")
        # The single-process trainer runs on the CPU; GPUs belong to yatt.control, whose
        # device-aware workers place the roles and their batches.
        _require(self.device == "cpu", "train.device", self.device, "'cpu' in this trainer")
        _require(
            0 <= self.torch_threads <= THREADS_MAX,
            "train.torch_threads", self.torch_threads, f"an int in 0..{THREADS_MAX} (0=auto)",
        )  # fmt: skip
        _require(self.time_limit_s >= 0, "train.time_limit_s", self.time_limit_s, ">= 0 (0=off)")


@dataclass(frozen=True)
class EvalConfig:
    """Greedy held-out accuracy on `n` problems before training and at the end, and every `every`
    steps (0 = off) on the first `n_periodic` of them (0 = all `n`: cheaper curves mid-run)."""

    every: int = 0
    n: int = 200
    n_periodic: int = 0
    batch_size: int = 64
    max_new_tokens: int = 16
    at_start: bool = True
    at_end: bool = True
    reward_fn: str = "math_answer"

    def __post_init__(self) -> None:
        check_section(self, "eval")
        _require(self.every >= 0, "eval.every", self.every, ">= 0")
        _require(self.n >= 0, "eval.n", self.n, ">= 0")
        _require(self.n_periodic >= 0, "eval.n_periodic", self.n_periodic, ">= 0 (0 = eval.n)")
        _require(self.batch_size >= 1, "eval.batch_size", self.batch_size, ">= 1")
        _require(
            1 <= self.max_new_tokens <= RESPONSE_TOKENS_MAX,
            "eval.max_new_tokens", self.max_new_tokens, f"an int in 1..{RESPONSE_TOKENS_MAX}",
        )  # fmt: skip
        _require_reward("eval.reward_fn", self.reward_fn, scorers=False)

    @property
    def enabled(self) -> bool:
        """True when a training run evaluates at all (at start, end or periodically)."""
        return self.n > 0 and (self.at_start or self.at_end or self.every > 0)


@dataclass(frozen=True)
class LoggingConfig:
    """Where outputs go and which sinks are on (JSONL is always on). A fresh run into a
    `run_dir` that holds a previous run's outputs is refused unless `overwrite` (then they are
    deleted, once the new run's data and model loaded); `checkpoint.resume` continues a run in
    place."""

    run_dir: str = "runs/default"
    overwrite: bool = False
    tensorboard: bool = False
    progress: bool = True
    plots: bool = True
    level: str = "INFO"  # the log level; the YATT_LOG_LEVEL environment variable overrides it

    def __post_init__(self) -> None:
        check_section(self, "logging")
        object.__setattr__(self, "level", log_level(self.level, "logging.level"))


@dataclass(frozen=True)
class CheckpointConfig:
    """Save every `every` steps (0 = only at the end if `at_end`); `resume` = a checkpoint
    folder, `latest` (the newest in logging.run_dir) or `auto` (that, or a fresh start)."""

    every: int = 0
    at_end: bool = False
    resume: str = ""
    keep_last: int = 2

    def __post_init__(self) -> None:
        check_section(self, "checkpoint")
        _require(self.every >= 0, "checkpoint.every", self.every, ">= 0")
        _require(self.keep_last >= 1, "checkpoint.keep_last", self.keep_last, ">= 1")


@dataclass(frozen=True)
class Config:
    """The whole run; each section goes to its own component."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    control: ControlConfig = field(default_factory=ControlConfig)

    def __post_init__(self) -> None:
        check_section(self, "")
        _require_ray_for_control(self.control)
        if self.control.backend == "ray":
            check_controller_settings(self, self.control)
        if self.model.lora_rank and self.rollout.backend == "vllm":
            raise ConfigError(
                f"model.lora_rank={self.model.lora_rank} with rollout.backend=vllm: weight sync "
                "moves the adapters alone, which vLLM's copy of the model cannot take; use "
                "rollout.backend=yatt or hf, or model.lora_rank=0"
            )
        if self.algo.overlong_buffer > self.rollout.max_new_tokens:
            raise ConfigError(
                f"algo.overlong_buffer={self.algo.overlong_buffer} is longer than "
                f"rollout.max_new_tokens={self.rollout.max_new_tokens}: the penalty zone (the "
                "last overlong_buffer tokens of the budget) must fit in it"
            )
        if self.algo.estimator in GROUP_ESTIMATORS and self.rollout.n_samples < 2:
            raise ConfigError(
                f"algo.name={self.algo.name} scores each completion against the others of its "
                f"prompt's group, so rollout.n_samples={self.rollout.n_samples} would make every "
                "advantage 0; set rollout.n_samples >= 2 (or use reinforce_pp or ppo)"
            )
        if self.algo.estimator in GROUP_ESTIMATORS and self.rollout.temperature == 0:
            raise ConfigError(
                f"algo.name={self.algo.name} scores each completion against the others of its "
                "prompt's group, and rollout.temperature=0 (greedy) makes them all the same "
                "completion, so every advantage would be 0; set rollout.temperature > 0"
            )


def changed_settings(section: object) -> list[str]:
    """The names of the fields of config section `section` that differ from their defaults."""
    return [
        item.name
        for item in dataclasses.fields(section)  # type: ignore[arg-type]
        if getattr(section, item.name) != item.default
    ]


def _require_ray_for_control(control: ControlConfig) -> None:
    """Refuse control.* settings that only the Ray controllers read.

    `yatt train` runs the single-process Trainer unless control.backend is "ray", and the Trainer
    reads no control.* key. Controllers built from the Python API with an in-process backend take
    their own ControlConfig, not `Config.control`, so they are not affected.
    """
    if control.backend == "ray":
        return
    for name in changed_settings(control):
        value = getattr(control, name)
        if name != "backend":
            shown = list(value) if isinstance(value, tuple) else value
            raise ConfigError(
                f"control.{name}={shown!r} needs control.backend=ray "
                f"(with control.backend={control.backend!r} the single-process trainer ignores it)"
            )


def check_controller_settings(config: Config, control: ControlConfig) -> None:
    """Raise ConfigError for settings the distributed controllers (yatt.control) would fail on
    mid-run or silently ignore: estimators other than GROUP_ESTIMATORS (no critic, no
    token-level returns) and a KL term under runtime re-placement without LoRA adapters (each
    policy rank keeps a frozen reference copy, which a move does not hand over; with adapters
    the reference is the base weights, which every rank builds); and an overlong penalty buffer
    longer than a response budget of `control.length_schedule`. (`train.torch_threads` is a
    speed knob, not refused: a Ray worker runs one thread per core of its device, and
    fit_distributed logs that.)

    Config validation calls it for control.backend=ray; build_cluster and fit_distributed
    call it for controllers built from the Python API (any backend), before any worker starts.
    """
    algo = config.algo
    group_local = [name for name, estimator in ESTIMATORS.items() if estimator in GROUP_ESTIMATORS]
    supported = f"algo.name in {group_local}"
    refused = [  # (unsupported, the setting as given, what the controllers support)
        (algo.estimator not in GROUP_ESTIMATORS, f"algo.name={algo.name!r}", supported),
        (algo.kl_coef > 0 and control.replace_every > 0 and not config.model.lora_rank,
         f"algo.kl_coef={algo.kl_coef} with control.replace_every={control.replace_every}",
         "algo.kl_coef=0 under runtime re-placement (moves hand over no reference model), "
         "or model.lora_rank > 0 (the reference is then the base model every rank holds)"),
    ]  # fmt: skip
    given = [(setting, allowed) for bad, setting, allowed in refused if bad]
    if given:
        raise ConfigError(
            f"{', '.join(setting for setting, _ in given)}: not supported by the distributed "
            f"controllers, which need {'; '.join(allowed for _, allowed in given)}; use the "
            "single-process trainer (yatt train without control.backend=ray)"
        )
    budgets = [int(item.split(":")[1]) for item in control.length_schedule]
    if algo.overlong_buffer and budgets and algo.overlong_buffer > min(budgets):
        raise ConfigError(
            f"algo.overlong_buffer={algo.overlong_buffer} is longer than the response budget "
            f"{min(budgets)} of control.length_schedule={list(control.length_schedule)}: the "
            "penalty zone must fit in every budget"
        )


# ---------------------------------------------------------------- typed conversion


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check `value` against a field annotation; widen int->float and list->tuple only."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(annotation)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"'{key}' expects a list, got {value!r}")
        return tuple(_coerce(f"{key}[{i}]", v, item_type) for i, v in enumerate(value))
    if origin in (types.UnionType, typing.Union):
        raise AssertionError(f"union annotations are not supported in configs: {key}")
    if annotation is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)  # an int, or a numpy number from Python
    if annotation is float and isinstance(value, str):
        try:  # YAML 1.1 reads '1e-5' (no dot) as a string; overrides already accept it
            return float(value)
        except ValueError:
            pass
    if annotation is str and isinstance(value, os.PathLike):  # a Path, from Python
        return os.fspath(value)
    if annotation is bool and not isinstance(value, bool):
        raise ConfigError(f"'{key}' expects true/false, got {value!r}")
    if annotation is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ConfigError(f"'{key}' expects an int, got {value!r}")
    if annotation is int and type(value) is not int:  # a numpy integer, from Python
        return int(value)
    if annotation is str and isinstance(value, int | float) and not isinstance(value, bool):
        raise ConfigError(  # e.g. model.path=123 or 1.5
            f"'{key}' expects str, got the number {value!r}: quote it"
        )
    if not isinstance(value, annotation):
        raise ConfigError(f"'{key}' expects {annotation.__name__}, got {value!r}")
    return value
