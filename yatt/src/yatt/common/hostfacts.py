"""What a benchmark records about the machine and the code it measured.

Every bench script under ``yatt/bench`` stores these facts beside its numbers and prints the
ones its report needs (CPUs, load, commit), so a section of ``docs/benchmarks.md`` says where it
came from. Scripts add what only they know (the TRL version, the device they timed).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["cpu_model", "describe", "git_commit", "host_facts"]

_REPO = Path(__file__).resolve().parents[4]  # yatt/src/yatt/common -> the repository


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_commit(short: bool = True) -> str:
    """The checked-out commit of this repository; ``unknown`` outside a git checkout."""
    command = ["git", "-C", str(_REPO), "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def host_facts() -> dict[str, Any]:
    """Python, torch and transformers versions, usable CPUs, processor, 1-minute load average
    (now: call it at the end of a run), CUDA device (None on CPU), commit, UTC time."""
    import torch

    try:
        transformers = version("transformers")
    except PackageNotFoundError:
        transformers = "absent"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers,
        "cpus": len(os.sched_getaffinity(0)),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "load_avg_1m": os.getloadavg()[0],
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git_commit": git_commit(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def describe(host: dict[str, Any] | None) -> str:
    """`` Host: ...`` for a report, from the facts a run stored (empty when it stored none: a
    report rebuilt from a run recorded before the facts were)."""
    host = host or {}
    parts = []
    if "cpus" in host:
        parts.append(f"{host['cpus']} CPUs ({host['processor']}), torch {host['torch']}")
        parts.append(f"1-min load average at the end {host['load_avg_1m']:.1f}")
    if "git_commit" in host:
        parts.append(f"commit {host['git_commit']}")
    return f" Host: {', '.join(parts)}." if parts else ""
