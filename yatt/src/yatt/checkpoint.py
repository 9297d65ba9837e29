"""Training checkpoints: a safetensors model folder plus everything an exact resume needs.

Layout of `<run_dir>/checkpoints/step_<n>/`:
    policy/          model + tokenizer (safetensors; `from_pretrained` reads it)
    critic/          the critic's state (PPO only)
    trainer_state.pt optimizer, LR scheduler, RNG states, data position, step
    config.yaml      the resolved config of the run
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from yatt.config import Config, save_config
from yatt.errors import ConfigError

__all__ = [
    "RESUME_AUTO",
    "RESUME_LATEST",
    "checkpoint_run_dir",
    "checkpoint_step",
    "list_checkpoints",
    "load_trainer_state",
    "policy_folder",
    "resolve_resume",
    "save_training_checkpoint",
]

logger = logging.getLogger(__name__)
RESUME_LATEST, RESUME_AUTO = "latest", "auto"  # checkpoint.resume keywords
_STATE_FILE = "trainer_state.pt"
_STATE_KEYS = ("step", "policy", "sampler", "rng")  # what `Trainer._resume` reads


def policy_folder(checkpoint: Path) -> Path:
    """The model folder inside a checkpoint (or the folder itself if it is a plain model)."""
    checkpoint = Path(checkpoint)
    inner = checkpoint / "policy"
    return inner if inner.is_dir() else checkpoint


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step_*") if (p / _STATE_FILE).is_file()]
    return sorted((p for p in found if checkpoint_step(p) >= 0), key=checkpoint_step)


def resolve_resume(resume: str, run_dir: str | Path) -> str:
    """The checkpoint folder `checkpoint.resume` names: a folder as given; `latest`: the newest
    checkpoint of `run_dir` (ConfigError if it has none); `auto`: the newest if there is one,
    else "" (a fresh start, which a folder holding a run refuses): rerunning the same command
    continues a preempted job from its last checkpoint."""
    if resume not in (RESUME_LATEST, RESUME_AUTO):
        return resume
    found = list_checkpoints(Path(run_dir))
    if found:
        logger.info("checkpoint.resume=%s: %s", resume, found[-1])
        return str(found[-1])
    if resume == RESUME_AUTO:
        return ""
    raise ConfigError(
        f"checkpoint.resume=latest: {Path(run_dir) / 'checkpoints'} holds no checkpoint "
        "(use checkpoint.resume=auto to start afresh when there is none)"
    )


def checkpoint_step(checkpoint: Path) -> int:
    """The step in a checkpoint folder's name (`step_000050` -> 50); -1 for another name."""
    digits = Path(checkpoint).name.removeprefix("step_")
    return int(digits) if digits.isascii() and digits.isdigit() else -1


def checkpoint_run_dir(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint was saved in (`<run_dir>/checkpoints/step_N`), resolved;
    None for a folder laid out otherwise."""
    checkpoint = Path(checkpoint).resolve()
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def save_training_checkpoint(
    run_dir: Path,
    step: int,
    *,
    config: Config,
    policy: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    critic: Any | None = None,
    keep_last: int = 2,
) -> Path:
    """Write `<run_dir>/checkpoints/step_<step>` atomically (temp folder + rename)."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    staging = root / f".step_{step:06d}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    policy.save_pretrained(staging / "policy", tokenizer)
    if critic is not None:
        critic.save_pretrained(staging / "critic")
    state = {**trainer_state, "step": step, "policy": policy.state_dict()}
    if critic is not None:
        state["critic"] = critic.state_dict()
    torch.save(state, staging / _STATE_FILE)
    save_config(config, staging / "config.yaml")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", final)
    return final


def load_trainer_state(checkpoint: Path, *, needs_critic: bool = False) -> dict[str, Any]:
    """The trainer state saved in a checkpoint folder.

    Raises ConfigError (one line naming the folder) if there is no state file, or if it is
    unreadable (truncated, garbage, empty) or lacks the keys a resume needs.
    """
    path = Path(checkpoint) / _STATE_FILE
    if not path.is_file():
        raise ConfigError(
            f"checkpoint.resume={str(checkpoint)!r} is not a checkpoint folder (no {_STATE_FILE})"
        )
    try:
        # The file holds python RNG tuples and numpy states besides tensors; it is our own output.
        state = torch.load(path, weights_only=False)
    except Exception as exc:  # damage surfaces as RuntimeError, UnpicklingError, EOFError, ...
        raise ConfigError(_unreadable(checkpoint, f"{type(exc).__name__}: {exc}")) from exc
    if not isinstance(state, dict):
        raise ConfigError(_unreadable(checkpoint, f"holds a {type(state).__name__}, not a dict"))
    wanted = (*_STATE_KEYS, "critic") if needs_critic else _STATE_KEYS
    missing = [key for key in wanted if key not in state]
    if missing:
        raise ConfigError(_unreadable(checkpoint, f"missing keys {missing}"))
    return state


def _unreadable(checkpoint: Path, cause: str) -> str:
    # One line, first sentence: torch's zip errors run on for a paragraph of advice.
    cause = " ".join(cause.split()).split(". ")[0][:200]
    return (
        f"checkpoint.resume={checkpoint}: {_STATE_FILE} is unreadable "
        f"(truncated or not a yatt checkpoint): {cause}"
    )
