"""Training checkpoints: a safetensors model folder plus everything an exact resume needs.

Layout of `<run_dir>/checkpoints/step_<n>/`:
    policy/            model + tokenizer (safetensors; `from_pretrained` reads it)
    critic/            the critic's state (PPO only)
    trainer_state.pt   optimizer, LR scheduler, step; the trainer's RNG states and data position
    control_state.json the distributed controllers' data position (their checkpoints only)
    sft_state.json     marks a checkpoint of SFT (`yatt sft`; its step)
    config.yaml        the resolved config of the run

The single-process trainer, the distributed controllers (yatt.control) and SFT (yatt.sft)
write the same layout; each resumes only its own checkpoints (their data positions and
optimizers differ), and says so.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from yatt.common import read_metrics
from yatt.config import Config, save_config
from yatt.errors import ConfigError, RunComplete

__all__ = [
    "CONTROLLERS",
    "DPO",
    "RESUME_AUTO",
    "RESUME_LATEST",
    "SFT",
    "TRAINER",
    "OptimizedModel",
    "check_resumed_by",
    "checkpoint_due",
    "checkpoint_run_dir",
    "checkpoint_step",
    "drop_later_checkpoints",
    "install_folder",
    "list_checkpoints",
    "load_control_state",
    "load_trainer_state",
    "policy_folder",
    "resolve_resume",
    "resume_target",
    "save_training_checkpoint",
    "truncate_metrics",
    "write_folder",
]

logger = logging.getLogger(__name__)
RESUME_LATEST, RESUME_AUTO = "latest", "auto"  # checkpoint.resume keywords
_STATE_FILE = "trainer_state.pt"
_CONTROL_FILE = "control_state.json"
_SFT_FILE = "sft_state.json"
_DPO_FILE = "dpo_state.json"
TRAINER, CONTROLLERS, SFT, DPO = "trainer", "controllers", "sft", "dpo"  # who wrote one
_MARKERS = {CONTROLLERS: _CONTROL_FILE, SFT: _SFT_FILE, DPO: _DPO_FILE}  # (not the trainer)
_RESUMED_BY = {  # who wrote a checkpoint, and how to resume it
    TRAINER: ("the single-process trainer", "with `yatt train` without control.backend=ray"),
    CONTROLLERS: ("the distributed controllers", "with `yatt train` and control.backend=ray"),
    SFT: ("SFT", "with `yatt sft` (or start RL from its model: model.path=<it>/policy)"),
    DPO: ("DPO", "with `yatt dpo` (or start from its model: model.path=<it>/policy)"),
}
_STATE_KEYS = ("step", "policy", "sampler", "rng")  # what `Trainer._resume` reads
_CONTROL_STATE_KEYS = ("step", "policy")  # what a policy rank reads (`RankWorker.restore`)


def policy_folder(checkpoint: Path) -> Path:
    """The model folder inside a checkpoint (or the folder itself if it is a plain model).

    Raises ConfigError for a checkpoint (it holds a trainer or controller state) that lacks
    its `policy/` folder: read as a plain model, it would be "a model folder without
    config.json".
    """
    checkpoint = Path(checkpoint)
    inner = checkpoint / "policy"
    if inner.is_dir():
        return inner
    if any((checkpoint / name).is_file() for name in (_STATE_FILE, _CONTROL_FILE)):
        raise ConfigError(
            f"checkpoint {checkpoint} has no policy/ folder (its weights): it was damaged or "
            "only partly copied"
        )
    return checkpoint


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step_*") if (p / _STATE_FILE).is_file()]
    return sorted((p for p in found if checkpoint_step(p) >= 0), key=checkpoint_step)


def resolve_resume(resume: str, run_dir: str | Path, steps: int) -> str:
    """The checkpoint folder `checkpoint.resume` names: a folder as given; `latest`: the newest
    checkpoint of `run_dir` (ConfigError if it has none); `auto`: the newest if there is one,
    else "" (a fresh start, which a folder holding a run refuses): rerunning the same command
    continues a preempted job from its last checkpoint.

    A checkpoint whose step is not below the run's `steps` (`train.steps`) is refused
    (ConfigError, before anything changes): the run would train nothing, yet a resume in place
    first cuts its later metrics and checkpoints back to that step. With `auto` and the newest
    checkpoint at `steps` the run is complete: RunComplete, which the CLI reports as done."""
    checkpoint = _named_checkpoint(resume, run_dir)
    if checkpoint and (step := checkpoint_step(Path(checkpoint))) >= steps:
        if resume == RESUME_AUTO and step == steps:  # the same command, rerun after it ended
            raise RunComplete(
                f"checkpoint.resume=auto: the run in {run_dir} is complete ({checkpoint} is "
                f"at its last step, train.steps={steps}): nothing to train",
                str(run_dir),
                checkpoint,
            )
        raise ConfigError(
            f"checkpoint.resume: {checkpoint} is at step {step}, and train.steps={steps} leaves "
            "nothing to train: raise train.steps to go on (nothing was changed)"
        )
    return checkpoint


def _named_checkpoint(resume: str, run_dir: str | Path) -> str:
    """`resolve_resume`'s folder, before its step is checked."""
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


def checkpoint_due(config: Config, step: int, out_of_time: bool) -> bool:
    """Whether a checkpoint is due after `step`: every `checkpoint.every` steps; at the run's
    last step with `checkpoint.at_end`; and where `train.time_limit_s` stops the run early
    with either set (so the trained model is kept, and `checkpoint.resume=auto` goes on)."""
    cfg = config.checkpoint
    periodic = bool(cfg.every) and step % cfg.every == 0
    last = step == config.train.steps or out_of_time
    return periodic or (last and (cfg.at_end or (out_of_time and bool(cfg.every))))


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
    control_state: dict[str, Any] | None = None,
    writer: str = TRAINER,
) -> Path:
    """Write `<run_dir>/checkpoints/step_<step>` atomically and durably (a temp folder, synced
    to disk, then renamed: `install_folder`), and only then delete the checkpoints beyond
    `keep_last`; `control_state` (JSON) marks a checkpoint of the distributed controllers,
    `writer` one of SFT or DPO (`SFT`, `DPO`)."""
    root = Path(run_dir) / "checkpoints"
    for aside in root.glob(".step_*.old"):  # a save that crashed between its two renames
        _put_back(aside.with_name(aside.name[1 : -len(".old")]))
    for stale in [*root.glob(".step_*.tmp"), *root.glob(".step_*.del")]:  # a crashed save's
        shutil.rmtree(stale, ignore_errors=True)

    def write(staging: Path) -> None:
        policy.save_pretrained(staging / "policy", tokenizer)
        if critic is not None:
            critic.save_pretrained(staging / "critic")
        state = {**trainer_state, "step": step, "policy": policy.state_dict()}
        if critic is not None:
            state["critic"] = critic.state_dict()
        torch.save(state, staging / _STATE_FILE)
        if control_state is not None:
            (staging / _CONTROL_FILE).write_text(json.dumps({**control_state, "step": step}))
        if writer in (SFT, DPO):
            (staging / _MARKERS[writer]).write_text(json.dumps({"step": step}))
        save_config(config, staging / "config.yaml")

    final = write_folder(root / f"step_{step:06d}", write)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        remove_folder(old)
    logger.info("saved checkpoint %s", final)
    return final


def resume_target(config: Config, writer: str) -> tuple[str, bool]:
    """The checkpoint a `yatt sft` or `yatt dpo` run (`writer`: `SFT`, `DPO`) resumes from
    ("" for none), and whether it continues its own run folder in place: a checkpoint of
    another folder starts a new run there from its state (the folder is claimed as for a
    fresh run).

    Raises:
        ConfigError: `checkpoint.resume` names no checkpoint of `writer` (`check_resumed_by`).
    """
    resume = resolve_resume(config.checkpoint.resume, config.logging.run_dir, config.train.steps)
    if not resume:
        return "", False
    check_resumed_by(Path(resume), writer)
    in_place = checkpoint_run_dir(Path(resume)) == Path(config.logging.run_dir).resolve()
    return resume, in_place


class OptimizedModel:
    """One model with its optimizer and schedule (a `yatt sft` or `yatt dpo` run): what a
    checkpoint of such a run saves (`save`; `save_pretrained` and `state_dict` as
    `save_training_checkpoint` takes a policy) and restores (`restore`), and its final model
    folder (`save_model`)."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, writer: str) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.writer = writer  # SFT or DPO: the checkpoint's marker

    def restore(self, state: dict[str, Any], sampler: Any, config: Config, checkpoint: Path) -> int:
        """Load a checkpoint's optimizer, schedule, data position (`sampler`) and RNG states
        (its model came from its folder); returns its step. ConfigError (one line) for a
        state that does not fit this run."""
        from yatt.common.seeding import set_rng_state
        from yatt.roles.policy import load_optimizer_state

        who = _RESUMED_BY[self.writer][0]
        optim = config.optim
        try:
            load_optimizer_state(
                self.optimizer, self.scheduler, state["policy"], lr=optim.lr,
                betas=(optim.beta1, optim.beta2), eps=optim.eps,
                weight_decay=optim.weight_decay, role=who,
            )  # fmt: skip
            sampler.load_state_dict(state["sampler"])
            set_rng_state(state["rng"])
            return int(state["step"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise ConfigError(
                f"checkpoint.resume={checkpoint}: its {who} state does not fit this run: {detail}"
            ) from exc

    def save_model(self, folder: Path, tokenizer: Any, config: Config) -> Path:
        """The trained model, its tokenizer and the run's config (`yatt eval` evaluates on its
        data), written whole or not at all."""

        def write(staging: Path) -> None:
            self.save_pretrained(staging, tokenizer)
            save_config(config, staging / "config.yaml")

        with torch.no_grad():
            return write_folder(folder, write)

    def save(
        self, run_dir: Path, step: int, config: Config, tokenizer: Any, state: dict[str, Any]
    ) -> None:
        """A training checkpoint at `step` (`state`: the data position, RNG states and what
        else the run needs to go on)."""
        training = self.model.training
        self.model.eval()  # (as saved; training mode is not part of the weights)
        try:
            save_training_checkpoint(
                run_dir, step, config=config, policy=self, tokenizer=tokenizer,
                keep_last=config.checkpoint.keep_last, writer=self.writer, trainer_state=state,
            )  # fmt: skip
        finally:
            self.model.train(training)

    def save_pretrained(self, folder: Path, tokenizer: Any) -> Path:
        from yatt.models import save_checkpoint

        return save_checkpoint(self.model, tokenizer, folder)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}


def remove_folder(folder: Path) -> None:
    """Delete a checkpoint (or model) folder so that no crash leaves it looking whole: it is
    renamed aside (``.<name>.del``, which nothing lists) and the parent synced first; the
    next save clears what a crash left there."""
    doomed = folder.with_name(f".{folder.name}.del")
    if doomed.exists():  # (a crash's leftover)
        shutil.rmtree(doomed, ignore_errors=True)
    folder.rename(doomed)
    _fsync(folder.parent, os.O_RDONLY | os.O_DIRECTORY)
    shutil.rmtree(doomed, ignore_errors=True)


def _put_back(final: Path) -> None:
    """A ``final`` that an install set aside (``.<name>.old``) and a crash kept from coming
    back or being replaced: renamed back (it is whole: it was installed)."""
    aside = final.with_name(f".{final.name}.old")
    if aside.is_dir() and not final.exists():
        aside.rename(final)
        _fsync(final.parent, os.O_RDONLY | os.O_DIRECTORY)
        logger.warning("%s: put back (a save crashed while replacing it)", final)


def write_folder(final: Path, write: Any) -> Path:
    """``write(folder)`` into a staging copy beside ``final``, then ``install_folder`` it
    (a crash mid-write leaves no ``final`` that looks whole); returns ``final``."""
    staging = final.with_name(f".{final.name}.tmp")
    _put_back(final)  # (then the new one replaces it whole, as install_folder does)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write(staging)
    install_folder(staging, final)
    return final


def install_folder(staging: Path, final: Path) -> None:
    """Put the written folder ``staging`` in place as ``final``, durably: every file and
    folder in it synced to disk, then renamed, then the parent synced. A rename alone is
    atomic against a crash of the process but not of the machine: after a power loss the
    folder could stand with empty files while the older checkpoints were already deleted. A
    ``final`` already there is set aside first and deleted last."""
    for folder, _, files in os.walk(staging):
        for name in files:
            _fsync(Path(folder) / name, os.O_RDONLY)
        _fsync(Path(folder), os.O_RDONLY | os.O_DIRECTORY)
    aside = final.with_name(f".{final.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    if final.exists():
        final.rename(aside)
    staging.rename(final)
    _fsync(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    shutil.rmtree(aside, ignore_errors=True)


def _fsync(path: Path, flags: int) -> None:
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def checkpoint_writer(checkpoint: Path) -> str:
    """Who wrote a checkpoint folder: `TRAINER`, `CONTROLLERS`, `SFT` or `DPO` (by its marker
    file)."""
    for writer, marker in _MARKERS.items():
        if (Path(checkpoint) / marker).is_file():
            return writer
    return TRAINER


def check_resumed_by(checkpoint: Path, writer: str) -> None:
    """Raise ConfigError (one line) unless `checkpoint` is a checkpoint folder written by the
    kind of run resuming it (`writer`: `TRAINER`, `CONTROLLERS`, `SFT` or `DPO`)."""
    checkpoint = Path(checkpoint)
    if not (checkpoint / _STATE_FILE).is_file():
        raise ConfigError(
            f"checkpoint.resume={str(checkpoint)!r} is not a checkpoint folder (no {_STATE_FILE})"
        )
    wrote = checkpoint_writer(checkpoint)
    if wrote != writer:
        who, how = _RESUMED_BY[wrote]
        raise ConfigError(
            f"checkpoint.resume={checkpoint} was written by {who}, whose data position and "
            f"optimizer state are kept apart: resume it {how}"
        )


def warn_changed_scoring(checkpoint: Path, config: Config) -> list[str]:
    """Warn (and return the lines) when a resume scores otherwise than the run that wrote
    `checkpoint` (its saved config.yaml): `reward.*` or `eval.reward_fn` changed. Allowed,
    but the run's metrics then mix two scales (its report's first and last rewards)."""
    import os

    from yatt.config import read_saved_config, to_dict

    before = read_saved_config(Path(checkpoint) / "config.yaml")
    if before is None:  # none, or unreadable: nothing to compare
        return []
    now = to_dict(config)
    keys = [("reward", key) for key in now["reward"]] + [("eval", "reward_fn")]

    def normal(key: str, value: Any) -> Any:
        if key == "model_path" and value:  # (recorded relative by older runs)
            return os.path.abspath(value)
        return value

    lines = []
    for section, key in keys:
        written = before.get(section)
        if not isinstance(written, dict) or key not in written:  # (an older layout: no word)
            continue
        was, is_now = normal(key, written[key]), normal(key, now[section][key])
        if was != is_now:
            lines.append(
                f"resuming {checkpoint} with {section}.{key}={is_now!r}; the run that wrote it "
                f"had {was!r}: its metrics will mix the two"
            )
    for line in lines:
        logger.warning("%s", line)
    return lines


def load_trainer_state(
    checkpoint: Path, *, needs_critic: bool = False, writer: str = TRAINER
) -> dict[str, Any]:
    """The trainer state saved in a checkpoint folder (by `writer`: a policy rank reads the
    distributed controllers', SFT and DPO their own).

    Raises ConfigError (one line naming the folder) if there is no state file, if another kind
    of run wrote it (`check_resumed_by`), or if it is unreadable (truncated, garbage, empty) or
    lacks the keys a resume needs.
    """
    check_resumed_by(checkpoint, writer)
    path = Path(checkpoint) / _STATE_FILE
    try:
        # The file holds python RNG tuples and numpy states besides tensors; it is our own output.
        state = torch.load(path, weights_only=False, map_location="cpu")  # GPU runs' too
    except Exception as exc:  # damage surfaces as RuntimeError, UnpicklingError, EOFError, ...
        raise ConfigError(_unreadable(checkpoint, f"{type(exc).__name__}: {exc}")) from exc
    if not isinstance(state, dict):
        raise ConfigError(_unreadable(checkpoint, f"holds a {type(state).__name__}, not a dict"))
    keys = _CONTROL_STATE_KEYS if writer == CONTROLLERS else _STATE_KEYS
    missing = [key for key in keys if key not in state]
    if missing:
        raise ConfigError(_unreadable(checkpoint, f"missing keys {missing}"))
    if needs_critic and "critic" not in state:  # a whole state, of another algorithm's run
        raise ConfigError(
            f"checkpoint.resume={checkpoint} was written by a run without a critic (not "
            "algo.name=ppo): this run's algorithm needs one; resume with the algo.name that "
            "wrote it, or start a new run"
        )
    if not needs_critic and "critic" in state:
        logger.warning(
            "resuming %s, written by a run with a critic (algo.name=ppo): this run's "
            "algorithm has none, so the critic is not carried on",
            checkpoint,
        )
    return state


def _unreadable(checkpoint: Path, cause: str, file: str = _STATE_FILE) -> str:
    # One line, first sentence: torch's zip errors run on for a paragraph of advice.
    cause = " ".join(cause.split()).split(". ")[0][:200]
    return (
        f"checkpoint.resume={checkpoint}: {file} is unreadable "
        f"(truncated or not a yatt checkpoint): {cause}"
    )


def load_control_state(checkpoint: Path) -> dict[str, Any]:
    """The distributed controllers' data position saved in a checkpoint folder: `step` (steps
    done), `queues` (one `[draws, pending prompts]` pair per data-parallel group of the run
    that wrote it; see `yatt.control.async_rollout.QueueState`), and what its prompt order
    depends on (`yatt.data.draw_order`).

    Raises ConfigError (one line naming the folder) for a folder the controllers did not write
    and for a state file that is unreadable or not of that shape.
    """
    check_resumed_by(checkpoint, CONTROLLERS)
    path = Path(checkpoint) / _CONTROL_FILE
    try:
        state = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:  # ValueError: JSON and UTF-8 decoding
        raise ConfigError(_unreadable(checkpoint, str(exc), _CONTROL_FILE)) from exc

    def is_count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    queues = state.get("queues") if isinstance(state, dict) else None
    shaped = (
        isinstance(state, dict)
        and all(is_count(state.get(key)) for key in ("step", "prompts_per_step", "n_prompts"))
        and isinstance(state.get("order_seed"), int)
        and isinstance(state.get("prompts_sha256"), str)
        and isinstance(queues, list)
        and len(queues) > 0
        and all(
            isinstance(q, list)
            and len(q) == 2
            and is_count(q[0])
            and isinstance(q[1], list)
            and all(is_count(p) for p in q[1])
            for q in queues
        )
    )
    if not shaped:
        shape = "not {step, prompts_per_step, n_prompts, queues: [[draws, [prompt, ...]], ...]}"
        raise ConfigError(_unreadable(checkpoint, shape, _CONTROL_FILE))
    beyond = [p for _, pending in queues for p in pending if p >= state["n_prompts"]]
    if beyond:
        why = f"pending prompt {beyond[0]} is past the {state['n_prompts']} prompts it records"
        raise ConfigError(_unreadable(checkpoint, why, _CONTROL_FILE))
    return state


def drop_later_checkpoints(run_dir: Path, checkpoint: Path, step: int, overwrite: bool) -> None:
    """A run resumed in place at `step` from `checkpoint` abandons the timeline of the run
    folder's later checkpoints: refused (ConfigError, nothing touched) unless `overwrite`
    (`logging.overwrite`), then deleted."""
    later = [p for p in list_checkpoints(run_dir) if checkpoint_step(p) > step]
    if not later:
        return
    names = ", ".join(p.name for p in later)
    if not overwrite:
        raise ConfigError(
            f"checkpoint.resume={checkpoint} is at step {step} but "
            f"{Path(run_dir) / 'checkpoints'} holds later ones ({names}); resume from "
            f"{later[-1]}, or set logging.overwrite=true to discard the later checkpoints"
        )
    logger.warning("resuming at step %d: deleting the later checkpoints %s", step, names)
    for path in reversed(later):  # newest first: a crash leaves the older ones, never a gap
        remove_folder(path)


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop the rows of a run's metrics JSONL logged after `last_step` (a run resumed there
    rewrites them) and a torn last line (a crash mid-write; logged). Raises ConfigError for a
    damaged line before the last; a missing file is left missing."""
    path = Path(path)
    if not path.is_file():
        return
    try:
        rows, torn = read_metrics(path)
    except ValueError as exc:
        raise ConfigError(f"{exc}; repair or remove it to resume") from None
    if torn:
        logger.warning("%s: dropped a torn last line (the run stopped mid-write)", path)
    kept = [line + b"\n" for line, row in rows if row["step"] <= last_step]
    staging = path.with_name(path.name + ".tmp")  # rewrite atomically: never half a file
    staging.write_bytes(b"".join(kept))
    _fsync(staging, os.O_RDONLY)  # (durably: a power loss must not leave an empty file)
    staging.replace(path)
    _fsync(path.parent, os.O_RDONLY | os.O_DIRECTORY)
