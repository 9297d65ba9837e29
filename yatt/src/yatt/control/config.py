"""ControlConfig: how a run is distributed (controller mode, worker backend, placement)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from yatt.errors import ConfigError
from yatt.rewards import load_callable

__all__ = [
    "CPU_MAPPINGS",
    "MAX_STALENESS",
    "MODES",
    "ControlConfig",
    "ignored_settings",
    "make_reward_role",
    "max_new_tokens_at",
]

MODES = ("single", "parallel")
CPU_MAPPINGS = ("ranks", "threads")
# Bound on rollout/training staleness (every queue of in-flight batches is bounded by it).
MAX_STALENESS = 8
# The longest response budget a setting may ask for (rollout, eval, length_schedule): 128K
# tokens, past any shipped model's context; more is a slip that would allocate a cache for it.
RESPONSE_TOKENS_MAX = 131_072


def _require(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"invalid value {value!r} for '{key}'; expected {allowed}")


@dataclass(frozen=True)
class ControlConfig:
    """Distribution knobs; results do not depend on `mode` (tested) for a fixed placement.

    mode: "single" (one driver holds the whole batch, as verl) or "parallel" (one controller per
        data-parallel group of the policy, each with its own shard; only collectives are global).
    backend: "inprocess" or "ray". In a run's `Config.control` (the CLI), "inprocess" (the
        default) means no controllers: `yatt train` runs the single-process
        `yatt.trainer.Trainer` and every other control.* key must keep its default; "ray" runs
        the controllers with Ray actors in a placement group. A ControlConfig given to the
        controllers from the Python API with "inprocess" runs every worker as an object in the
        calling process (one policy rank, no collectives; for tests and small runs).
    placement: "colocate", "disaggregated" or "partial" (see placement.py).
    n_devices: devices to use (0 = all); device_kind: "auto", "cpu" or "cuda".
    n_sampler: sampler devices for disaggregated/partial (0 = half).
    async_staleness: k, the policy versions generation may lag behind training when the sampler
        has devices of its own (disaggregated): samplers generate the batches of steps
        t+1..t+k with weights at most k updates old while the trainers train on step t (0 =
        synchronous). Colocated and partially colocated samplers (their devices also train)
        always sample in sync.
    over_dispatch: r, dispatch ~(1 + r) x the groups a step needs, one group per sampler call;
        once enough groups are back (and valid, under algo.dynamic_sampling) the rest are
        aborted and their prompts go back to the front of the shard's queue (0 = off).
    payload_bytes: extra per-sample features (e.g. image embeddings) carried from sampler to
        trainer, to measure data movement; 0 = none.
    replace_every: runtime re-placement considers a new plan every K steps (0 = off).
    cpu_mapping: how a role spread over several CPU devices runs: "ranks" (one worker per core,
        data-parallel with a gloo all-reduce, as on GPUs) or "threads" (one worker owning those
        cores, torch intra-op threads: no all-reduce). GPUs always run one rank per device.
    oversubscribe: allow more CPU devices than cores (they share cores round-robin); for
        measuring control overheads with many data-parallel groups on a small machine.
    length_schedule: "step:tokens" pairs, the response budget from that step on, steps counted
        as metrics.jsonl counts them (the first trained step is 1; "0:..." sets the budget from
        the start), overriding rollout.max_new_tokens; emulates response lengths that grow
        during training. A step given twice is an error.
    extra_rewards: "package.module:function" reward functions (weight 1) every worker imports,
        added to `reward.fns` (a distributed run cannot ship closures to its workers). The driver
        imports each one when the config is built, so a bad path fails before any worker starts.
    """

    mode: str = "parallel"
    backend: str = "inprocess"
    placement: str = "colocate"
    n_devices: int = 0
    device_kind: str = "auto"
    n_sampler: int = 0
    async_staleness: int = 0
    over_dispatch: float = 0.0
    payload_bytes: int = 0
    replace_every: int = 0
    cpu_mapping: str = "ranks"
    oversubscribe: bool = False
    length_schedule: tuple[str, ...] = ()
    extra_rewards: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from yatt.config import check_section  # (yatt.config imports this module)
        from yatt.control.devices import DEVICE_KINDS
        from yatt.control.placement import PLACEMENTS
        from yatt.control.workers import BACKENDS

        check_section(self, "control")

        _require(self.mode in MODES, "control.mode", self.mode, f"one of {MODES}")
        _require(self.backend in BACKENDS, "control.backend", self.backend, f"one of {BACKENDS}")
        _require(
            self.placement in PLACEMENTS,
            "control.placement",
            self.placement,
            f"one of {PLACEMENTS}",
        )
        _require(
            self.device_kind in DEVICE_KINDS,
            "control.device_kind",
            self.device_kind,
            f"one of {DEVICE_KINDS}",
        )
        _require(
            self.cpu_mapping in CPU_MAPPINGS,
            "control.cpu_mapping",
            self.cpu_mapping,
            f"one of {CPU_MAPPINGS}",
        )
        _require(self.n_devices >= 0, "control.n_devices", self.n_devices, ">= 0 (0 = all)")
        _require(self.n_sampler >= 0, "control.n_sampler", self.n_sampler, ">= 0 (0 = half)")
        _require(
            0 <= self.async_staleness <= MAX_STALENESS,
            "control.async_staleness",
            self.async_staleness,
            f"0..{MAX_STALENESS}",
        )
        _require(
            0.0 <= self.over_dispatch <= 4.0, "control.over_dispatch", self.over_dispatch, "0..4"
        )
        _require(self.payload_bytes >= 0, "control.payload_bytes", self.payload_bytes, ">= 0")
        _require(self.replace_every >= 0, "control.replace_every", self.replace_every, ">= 0")
        for item in self.length_schedule:
            step, _, tokens = item.partition(":")
            decimal = step.isascii() and step.isdigit() and tokens.isascii() and tokens.isdigit()
            _require(
                decimal and 0 < int(tokens) <= RESPONSE_TOKENS_MAX,
                "control.length_schedule",
                item,
                f"'step:tokens' with tokens in 1..{RESPONSE_TOKENS_MAX}",
            )
        starts = [int(item.partition(":")[0]) for item in self.length_schedule]
        _require(
            len(set(starts)) == len(starts),
            "control.length_schedule",
            list(self.length_schedule),
            "one budget per step",
        )
        for path in self.extra_rewards:
            load_callable(path, "control.extra_rewards")


def ignored_settings(control: ControlConfig) -> list[str]:
    """What in `control` cannot take effect under its other settings (fit_distributed warns of
    each): a valid config, but likely not the run its author meant."""
    fixed = not control.replace_every  # (re-placement may move to a plan that uses them)
    notes = []
    if fixed and control.async_staleness and control.placement != "disaggregated":
        notes.append(
            f"control.async_staleness={control.async_staleness} has no effect: "
            f"control.placement={control.placement} samples in sync (only disaggregated "
            "overlaps sampling with training)"
        )
    if fixed and control.n_sampler and control.placement == "colocate":
        notes.append(
            f"control.n_sampler={control.n_sampler} has no effect: colocate runs every role on "
            "every device"
        )
    if control.replace_every and control.mode == "single":
        notes.append(
            f"control.mode=single has no effect: runtime re-placement (control.replace_every="
            f"{control.replace_every}) runs the parallel controllers"
        )
    if control.replace_every and control.n_devices == 1:
        notes.append(
            f"control.replace_every={control.replace_every} has no effect: one device leaves "
            "one plan to choose"
        )
    return notes


def max_new_tokens_at(control: ControlConfig, step: int, default: int) -> int:
    """The response budget of the step at 0-based index `step` (logged as step + 1, the count
    `control.length_schedule` uses), else `default`."""
    budget = default
    for item in sorted(control.length_schedule, key=lambda text: int(text.split(":")[0])):
        start, tokens = (int(part) for part in item.split(":"))
        if step + 1 >= start:
            budget = tokens
    return budget


def driver_scores(config, control: ControlConfig) -> bool:
    """Whether the driver scores the rollouts: a single controller does with rule rewards, as
    verl's reward manager does; a reward model, and a batch scorer in `reward.fns` or
    `control.extra_rewards` (a generative judge: a model of its own), run on the reward
    workers in every mode (on the devices the placement gives the reward role, as verl's
    reward-model worker group). Runtime re-placement runs parallel controllers whatever
    `control.mode` says."""
    from yatt.rewards import is_batch_scorer

    single = control.mode == "single" and not control.replace_every
    if not single or config.reward.model_path:
        return False
    return not any(map(is_batch_scorer, (*config.reward.fns, *control.extra_rewards)))


def make_reward_role(config, control: ControlConfig, device: Any = "cpu"):
    """The RewardRole of `config.reward` plus `control.extra_rewards` (a reward model on
    `device`: the reward role's own device)."""
    from yatt.roles.reward import RewardRole

    extra = [(load_callable(path, "control.extra_rewards"), 1.0) for path in control.extra_rewards]
    return RewardRole(config.reward, extra=extra, device=device)
