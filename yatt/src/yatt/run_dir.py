"""The run folder (`logging.run_dir`): claimed once per job, so a fresh run never mixes its
outputs with a previous run's, and a resumed one finds them."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from yatt.errors import ConfigError

__all__ = ["claim_run_dir"]

logger = logging.getLogger(__name__)
_CHECKPOINTS = "checkpoints"  # the folder of a run's checkpoints (yatt.checkpoint's layout)


def claim_run_dir(
    run_dir: str,
    outputs: tuple[str, ...],
    *,
    resuming: bool = False,
    overwrite: bool = False,
    resumable: bool = True,
    model_path: str = "",
) -> Path:
    """Create the run folder `logging.run_dir`; returns it.

    outputs: names inside the folder that a run writes. A fresh run (not `resuming`) into a
    folder holding any of them is refused, unless `overwrite`: then they are deleted first.
    resumable: the refusal suggests `checkpoint.resume=` when the folder holds a checkpoint
    (a non-empty `checkpoints/`), else says it has none (False for jobs that cannot resume).
    model_path: the run's `model.path`; overwriting never deletes the output holding it (an
    SFT run's `model/` that an RL run in the same folder starts from).
    Raises ConfigError for an empty name, a folder that cannot be created or written, or a
    refused reuse.
    """
    if not run_dir.strip():
        raise ConfigError("logging.run_dir is empty; name a folder for the run's outputs")
    folder = Path(run_dir)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"logging.run_dir={run_dir} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"logging.run_dir={run_dir}: cannot create it ({exc})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"logging.run_dir={run_dir}: the folder is not writable")
    found = [name for name in outputs if _holds_output(folder / name)]
    if not found or resuming:
        return folder
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
    if model_path and Path(model_path).exists():
        used = Path(model_path).resolve()
        for name in found:
            if used.is_relative_to((folder / name).resolve()):
                raise ConfigError(
                    f"logging.overwrite=true would delete {folder / name}, which holds "
                    f"model.path={model_path}: write this run to another folder"
                )
    logger.warning("overwriting the previous run in %s: deleting %s", folder, shown)
    for name in found:
        path = folder / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return folder


def _holds_output(path: Path) -> bool:
    """True for a non-empty file, or a folder with anything in it."""
    if path.is_dir():
        return any(path.iterdir())
    return path.is_file() and path.stat().st_size > 0
