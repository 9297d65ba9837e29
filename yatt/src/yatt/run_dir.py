"""The run folder (`logging.run_dir`): claimed once per job, so a fresh run never mixes its
outputs with a previous run's, and a resumed one finds them. With `logging.overwrite` a job
checks the folder first (`check_run_dir`) and deletes the previous run only once its own
inputs loaded (`RunDirClaim.clear`): a mistyped data or model path loses nothing."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yatt.checkpoint import RESUME_AUTO
from yatt.config import SAVED_CONFIG_HEADER
from yatt.errors import ConfigError

__all__ = ["RUN_OUTPUTS", "RunDirClaim", "check_run_dir", "claim_run_dir"]

logger = logging.getLogger(__name__)
_CHECKPOINTS = "checkpoints"  # the folder of a run's checkpoints (yatt.checkpoint's layout)
# What any yatt job (the trainer, SFT, a reward model, the distributed controllers) writes in
# its run folder:
# a fresh job into a folder holding one of them is refused, and `logging.overwrite` deletes
# them all, so one run's leftovers (a distributed run's control.json, an SFT run's model/)
# never pass for the next one's. The output holding the job's own `model.path` is kept.
RUN_OUTPUTS = (
    "metrics.jsonl", "sft_metrics.jsonl", "rm_metrics.jsonl", "dpo_metrics.jsonl", _CHECKPOINTS,
    "tensorboard", "model", "reward_model", "control.json", "control_segments.json",
    "control_segments.json.bad", "timeline.png", "rewards.png", "timing.png", "loss.png",
    "rm.png", "dpo.png",
)  # fmt: skip
_SAVED_CONFIG = "config.yaml"  # the run's resolved config (`save_config` writes it)
_LOCK_FILE = ".yatt.lock"  # locked while a job uses the folder; holds the job's pid


class _FolderLock:
    """An exclusive lock on a run folder (an `flock` of its lock file), held while this object
    lives; the system drops it when the process ends, however it ends."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.close = weakref.finalize(self, os.close, fd)


# The run folders this process holds, each lock shared by the claims on it (a resumed Trainer
# in the process that ran the first part); released when the last of them goes.
_LOCKS: weakref.WeakValueDictionary[Path, _FolderLock] = weakref.WeakValueDictionary()
# Filesystems without flock (some NFS and Lustre mounts): the job runs unlocked, with a warning.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _drop_inherited_locks() -> None:
    """In a forked child: close its copies of the lock files, so that a child outliving its
    parent (a loader or engine process) does not keep the parent's folders locked."""
    for lock in list(_LOCKS.values()):
        lock.close.detach()
        with contextlib.suppress(OSError):
            os.close(lock.fd)
    _LOCKS.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


def _lock(folder: Path, run_dir: str) -> _FolderLock | None:
    """Lock `folder` for this process (None where its filesystem has no flock). Raises
    ConfigError when another process's job holds it: two jobs writing one folder would mix
    their metrics and checkpoints (each deleting what the other wrote)."""
    key = folder.resolve()
    held = _LOCKS.get(key)
    if held is not None:
        return held
    try:
        fd = os.open(folder / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"logging.run_dir={run_dir}: cannot open its lock file {_LOCK_FILE} ({exc.strerror})"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"logging.run_dir={run_dir} is in use by another yatt job (pid {holder}): wait for "
            "it to end, or choose another folder"
        ) from None
    except OSError as exc:
        os.close(fd)
        if exc.errno not in _NO_FLOCK:
            raise ConfigError(
                f"logging.run_dir={run_dir}: cannot lock {_LOCK_FILE} ({exc.strerror})"
            ) from None
        logger.warning("logging.run_dir=%s: its filesystem cannot lock files (%s): nothing "
                       "keeps a second job out of it", run_dir, exc.strerror)  # fmt: skip
        return None
    lock = _FolderLock(fd)  # (closed with it, whatever happens next)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError as exc:  # a full disk, a quota
        raise ConfigError(
            f"logging.run_dir={run_dir}: cannot write its lock file {_LOCK_FILE} ({exc.strerror})"
        ) from None
    _LOCKS[key] = lock
    return lock


def check_run_dir(
    run_dir: str,
    outputs: tuple[str, ...],
    *,
    resuming: bool = False,
    overwrite: bool = False,
    resumable: bool = True,
    model_path: str | tuple[str, ...] = "",
) -> RunDirClaim:
    """Create the run folder `logging.run_dir` and check it for this job; deletes nothing.

    outputs: names inside the folder that a run writes. A fresh run (not `resuming`) into a
    folder holding any of them is refused, unless `overwrite`: then the claim's `clear()`
    deletes them.
    resumable: the refusal suggests `checkpoint.resume=` when the folder holds a checkpoint
    (a non-empty `checkpoints/`), else says it has none (False for jobs that cannot resume).
    model_path: the run's `model.path` (or several paths the run loads: its
    `reward.model_path` too); overwriting never deletes an output holding one (an SFT run's
    `model/` that an RL run in the same folder starts from, a `yatt rm` run's reward model).
    Raises ConfigError for an empty name, a folder that cannot be created or written, or a
    refused reuse.
    """
    run_dir = os.fspath(run_dir)  # (a Path, from Python)
    folder, created, lock = _make_and_lock(run_dir)
    found = [name for name in outputs if _holds_output(folder / name)]
    if not (found or resuming) and _foreign_config(folder / _SAVED_CONFIG):
        if not overwrite:
            raise ConfigError(
                f"logging.run_dir={run_dir} holds a {_SAVED_CONFIG} that yatt did not write, "
                "and the run would replace it with its own: choose another folder, move the "
                "file, or set logging.overwrite=true to replace it"
            )
        found.append(_SAVED_CONFIG)
    if not found or resuming:
        return RunDirClaim(folder, created=created, lock=lock)
    shown = ", ".join(f"{name}/" if (folder / name).is_dir() else name for name in found)
    if not overwrite:
        resume_hint = ""
        if resumable and _holds_output(folder / _CHECKPOINTS):
            resume_hint = "pass checkpoint.resume=... to continue it, or "
        elif resumable:  # e.g. a run that failed after its step-0 evaluation
            resume_hint = "it holds no checkpoint to resume; "
        raise ConfigError(
            f"logging.run_dir={run_dir} already holds a run ({shown}): "
            f"{resume_hint}choose another folder, or set logging.overwrite=true to replace it"
        )
    _refuse_deleting_the_model(folder, found, model_path)
    return RunDirClaim(
        folder, tuple(folder / name for name in found), shown, created=created, lock=lock
    )


def _make_and_lock(run_dir: str) -> tuple[Path, bool, _FolderLock | None]:
    """The run folder `run_dir`, made if missing, checked writable and locked for this job;
    whether this call made it; the lock. A folder made here goes again if the lock fails."""
    if not run_dir.strip():
        raise ConfigError("logging.run_dir is empty; name a folder for the run's outputs")
    folder = Path(run_dir)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"logging.run_dir={run_dir} is a file, not a folder")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"logging.run_dir={run_dir}: cannot create it ({exc})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"logging.run_dir={run_dir}: the folder is not writable")
    try:
        return folder, created, _lock(folder, run_dir)
    except ConfigError:
        if created:  # (not the folder of the job holding the lock: that one made its own)
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty: never the lock file another job holds
        raise


def _refuse_deleting_the_model(
    folder: Path, found: list[str], model_path: str | tuple[str, ...]
) -> None:
    """Raise ConfigError where overwriting `found` in `folder` would delete a model the run
    loads (`model_path`: one path or several; an SFT run's `model/` that an RL run in the same
    folder starts from, a reward model there)."""
    for path in (model_path,) if isinstance(model_path, str) else model_path:
        if not path or not Path(path).exists():
            continue
        used = Path(path).resolve()
        for name in found:
            if used.is_relative_to((folder / name).resolve()):
                raise ConfigError(
                    f"logging.overwrite=true would delete {folder / name}, which holds "
                    f"{path}, a model this run loads: write this run to another folder"
                )


def _remove_empty(folder: Path) -> None:
    """Remove `folder`, which this process's claim made and locked, if nothing but the lock
    file is in it; the lock goes with it (a retry in this process locks afresh)."""
    with contextlib.suppress(OSError):  # (not empty: kept)
        if [entry.name for entry in folder.iterdir()] == [_LOCK_FILE]:
            _LOCKS.pop(folder.resolve(), None)
            (folder / _LOCK_FILE).unlink()
        folder.rmdir()


@dataclass(frozen=True)
class RunDirClaim:
    """A run folder checked for a job: `previous` are a previous run's outputs that
    `logging.overwrite` replaces (`shown`: them, as the warning names them); `created`: the
    check made the folder."""

    path: Path
    previous: tuple[Path, ...] = ()
    shown: str = ""
    created: bool = False
    lock: _FolderLock | None = field(default=None, compare=False, repr=False)  # held meanwhile

    @contextlib.contextmanager
    def removed_if_unused(self) -> Iterator[None]:
        """Within the block (a job's set-up once the folder is claimed), an error removes the
        folder again if the claim made it and nothing was written into it: a mistyped data or
        model path leaves no empty run folder behind."""
        try:
            yield
        except BaseException:
            if self.created:
                _remove_empty(self.path)
            raise

    def clear(self) -> Path:
        """Delete the previous run's outputs (call once the job's inputs loaded); the folder."""
        if self.previous:
            logger.warning("overwriting the previous run in %s: deleting %s", self.path, self.shown)
        for path in self.previous:
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        return self.path


def _foreign_config(path: Path) -> bool:
    """Whether `path` is a file that `save_config` did not write (a user's own config)."""
    if not path.is_file():
        return False
    with path.open("rb") as file:
        return file.read(len(SAVED_CONFIG_HEADER.encode())) != SAVED_CONFIG_HEADER.encode()


def _same_job(saved: Path, config: Any) -> bool:
    """Whether `saved` is the config.yaml yatt wrote for a run of exactly `config`."""
    import yaml

    from yatt.config import read_saved_config, to_dict

    if not saved.is_file() or _foreign_config(saved):
        return False
    before = read_saved_config(saved)
    return before == yaml.safe_load(yaml.safe_dump(to_dict(config), sort_keys=False))


def _finished(folder: Path, config: Any) -> bool:
    """Whether the run in `folder` got to its end: it wrote its final model (`model/`: SFT,
    the distributed controllers), or its metrics reached `train.steps` (the trainer)."""
    from yatt.common.metrics import read_metrics

    if _holds_output(folder / "model"):
        return True
    try:
        rows, _ = read_metrics(folder / "metrics.jsonl")
    except (OSError, ValueError):  # none, or damaged: not known to be finished
        return False
    return bool(rows) and rows[-1][1]["step"] >= config.train.steps


def _holds_output(path: Path) -> bool:
    """True for a non-empty file, or a folder with anything in it."""
    if path.is_dir():
        return any(path.iterdir())
    return path.is_file() and path.stat().st_size > 0


def claim_run_dir(
    config: Any, outputs: tuple[str, ...], *, resume: str, in_place: bool
) -> RunDirClaim:
    """`check_run_dir` for a job of `config` (`logging.*`, `model.path`, `checkpoint.resume`)
    that resumes from the checkpoint `resume` (resolved; "" for a fresh start), in place or
    not: a refused folder under `checkpoint.resume=auto` says that no checkpoint was found."""
    overwrite = config.logging.overwrite
    if config.checkpoint.resume == RESUME_AUTO and not resume and not overwrite:
        # The folder may hold this very job's earlier attempt, stopped before its first
        # checkpoint: a restart loop rerunning the command must not be refused forever. (One
        # that finished is kept, and refused as before.)
        folder = Path(config.logging.run_dir)
        overwrite = _same_job(folder / _SAVED_CONFIG, config) and not _finished(folder, config)
        if overwrite:
            logger.warning(
                "checkpoint.resume=auto: %s holds an earlier attempt of this same config that "
                "left no checkpoint; starting it again",
                config.logging.run_dir,
            )
    try:
        return check_run_dir(
            config.logging.run_dir, outputs, resuming=in_place, overwrite=overwrite,
            resumable=not config.checkpoint.resume,
            model_path=(config.model.path, config.reward.model_path),
        )  # fmt: skip
    except ConfigError as exc:
        if config.checkpoint.resume == RESUME_AUTO and not resume:
            raise ConfigError(f"checkpoint.resume=auto found no checkpoint; {exc}") from None
        raise
