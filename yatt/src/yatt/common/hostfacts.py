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

__all__ = ["StealMeter", "cpu_model", "describe", "git_commit", "host_facts"]

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
    """The checked-out commit of this repository, ``unknown`` outside a git checkout; the
    environment's ``YATT_GIT_COMMIT`` wins (a copy of the tree on another machine, whose git
    folder may be stale or absent)."""
    if os.environ.get("YATT_GIT_COMMIT"):
        return os.environ["YATT_GIT_COMMIT"]
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


def _cpu_ticks(path: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(stolen, all) clock ticks of the machine's CPUs since boot, from the first line of
    ``/proc/stat`` (user nice system idle iowait irq softirq steal ...; guest time is already
    inside user); None where there is no such file or it has no steal field."""
    try:
        fields = path.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu" or not all(f.isdigit() for f in fields[1:9]):
        return None
    ticks = [int(f) for f in fields[1:9]]
    return ticks[7], sum(ticks)


class StealMeter:
    """The share of this machine's CPU time that its hypervisor gave to other guests
    ("steal" in ``/proc/stat``) between readings. On a shared virtual machine a burst of
    steal slows whatever runs then, so a bench records it beside each measured window: two
    runs compared at different steal are not compared on the same machine. ``lap`` returns
    the share since the previous reading (None where the kernel does not count steal)."""

    def __init__(self, path: Path = Path("/proc/stat")) -> None:
        self._path = path
        self._last = _cpu_ticks(path)

    def lap(self) -> float | None:
        now = _cpu_ticks(self._path)
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1])


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
