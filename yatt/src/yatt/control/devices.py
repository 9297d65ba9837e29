"""Devices: one abstraction for GPUs and CPU cores, so placements are testable on a laptop.

A `Device` is one schedulable unit: a CUDA GPU, or one CPU core (a worker placed on a CPU device
pins itself to that core and runs torch with one thread). Ray sees a device as one bundle of a
placement group: `{"CPU": 1}` for a core, `{"CPU": 1, "GPU": 1}` for a GPU. A worker may also
own `cores` consecutive CPU devices (`widen`): it pins itself to all of them and runs torch
intra-op with that many threads (the "threads" CPU mapping: one process instead of a
data-parallel group, so no gradient all-reduce).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from yatt.errors import ConfigError

__all__ = ["DEVICE_KINDS", "Device", "discover_devices", "widen"]

DEVICE_KINDS = ("auto", "cpu", "cuda")
# Cores this process was allowed before its first bind (a re-roled worker re-binds).
_bound_cores: set[int] = set()


@dataclass(frozen=True)
class Device:
    """One device: `kind` "cpu" (a core) or "cuda" (a GPU), `index` among that kind's devices;
    a CPU device may span `cores` consecutive cores from `index` (one worker, that many threads)."""

    kind: str
    index: int
    cores: int = 1

    def __post_init__(self) -> None:
        assert self.kind in ("cpu", "cuda"), f"device kind {self.kind!r}"
        assert self.index >= 0, f"device index {self.index}"
        assert self.cores >= 1, f"device cores {self.cores}"
        assert self.kind == "cpu" or self.cores == 1, f"a {self.kind} device spans {self.cores}"

    @property
    def name(self) -> str:
        suffix = f"-{self.index + self.cores - 1}" if self.cores > 1 else ""
        return f"{self.kind}:{self.index}{suffix}"

    @property
    def indices(self) -> tuple[int, ...]:
        """The device indices this device covers (its timeline rows)."""
        return tuple(range(self.index, self.index + self.cores))

    def torch_device(self) -> torch.device:
        """Where tensors of a worker on this device live (a GPU by its ordinal in this
        process, see `local_ordinal`)."""
        if self.kind != "cuda":
            return torch.device("cpu")
        return torch.device("cuda", local_ordinal(self.index))

    def ray_bundle(self) -> dict[str, float]:
        """The placement-group bundle that reserves this device."""
        return {"CPU": 1.0, "GPU": 1.0} if self.kind == "cuda" else {"CPU": 1.0}

    def bind(self) -> None:
        """Make the calling process use this device: pin to the core, or select the GPU."""
        if self.kind == "cuda":
            torch.cuda.set_device(local_ordinal(self.index))
            return
        cores = sorted(os.sched_getaffinity(0) | _bound_cores)
        _bound_cores.update(cores)  # a later re-bind may widen again
        os.sched_setaffinity(0, {cores[i % len(cores)] for i in self.indices})
        torch.set_num_threads(self.cores)


def local_ordinal(index: int) -> int:
    """GPU `index` (among the devices the run was given) as this process numbers it: the same
    where the process sees every GPU (the in-process backend), 0 where it sees one alone (a Ray
    actor: Ray sets CUDA_VISIBLE_DEVICES to the GPU it reserved for the actor, which is then
    the actor's cuda:0 whatever the run calls it).

    Raises:
        ConfigError: the process sees several GPUs but not `index`.
    """
    count = torch.cuda.device_count()
    if index < count:
        return index
    if count == 1:
        return 0
    raise ConfigError(
        f"GPU {index} is not among the {count} this process sees "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
    )


def widen(devices: list[Device]) -> Device:
    """One CPU device spanning `devices` (consecutive cores), for a multi-threaded worker.

    Raises:
        ConfigError: the devices are not consecutive CPU cores.
    """
    indices = [d.index for d in devices]
    if any(d.kind != "cpu" or d.cores != 1 for d in devices) or indices != list(
        range(indices[0], indices[0] + len(indices))
    ):
        raise ConfigError(f"cannot widen {[d.name for d in devices]}: need consecutive CPU cores")
    return Device("cpu", indices[0], len(indices))


def discover_devices(kind: str = "auto", count: int = 0, oversubscribe: bool = False
                     ) -> list[Device]:  # fmt: skip
    """The first `count` devices of `kind` (0 = all). "auto" means cuda when present, else cpu.
    `oversubscribe` allows more CPU devices than cores (device i runs on core i mod cores).

    Raises:
        ConfigError: unknown kind, "cuda" on a machine without a CUDA device, or more devices
            asked for than the machine has.
    """
    if kind not in DEVICE_KINDS:
        raise ConfigError(f"device kind {kind!r} unknown; allowed: {list(DEVICE_KINDS)}")
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    available = torch.cuda.device_count() if kind == "cuda" else len(os.sched_getaffinity(0))
    if kind == "cuda" and available == 0:
        raise ConfigError(
            "control.device_kind=cuda: no CUDA device found on this machine; use "
            "control.device_kind=cpu (or auto)"
        )
    if kind == "cpu" and oversubscribe:
        available = max(available, count)
    if count < 0 or count > available:
        share = " (control.oversubscribe=true shares the cores)" if kind == "cpu" else ""
        raise ConfigError(
            f"control.n_devices={count}: this machine has {available} {kind} devices{share}"
        )
    return [Device(kind, index) for index in range(count or available)]
