"""Builds the workers of a placement: policy ranks, samplers and reward services on devices.

- colocate: one worker per device hosting policy rank + sampler + reward (the sampler shares the
  policy's module, so weight sync is free).
- disaggregated: sampler+reward workers on the sampler devices, policy ranks on the others.
- partial: samplers on the sampler devices, reward services on the rest, policy ranks on all.
Data-parallel group r uses sampler `r % n_samplers` (and the reward service beside it); the
lowest such rank owns the sampler and pushes weights to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from yatt.config import Config
from yatt.control.config import ControlConfig
from yatt.control.devices import Device, discover_devices
from yatt.control.placement import Placement, make_placement
from yatt.control.rank import RankWorker
from yatt.control.workers import Backend, WorkerGroup, WorkerHandle, make_backend
from yatt.errors import ConfigError

__all__ = ["Cluster", "build_cluster"]

logger = logging.getLogger(__name__)


@dataclass
class Cluster:
    """The spawned workers. `samplers`/`rewards` are None when colocated inside the ranks."""

    backend: Backend
    placement: Placement
    devices: list[Device]
    ranks: WorkerGroup
    samplers: WorkerGroup | None
    rewards: WorkerGroup | None

    def sampler_for(self, rank: int) -> WorkerHandle:
        group = self.samplers or self.ranks
        return group.handles[rank % len(group)]

    def reward_for(self, rank: int) -> WorkerHandle:
        group = self.rewards or self.samplers or self.ranks
        return group.handles[rank % len(group)]

    def owns_sampler(self, rank: int) -> bool:
        return self.samplers is not None and rank < len(self.samplers)

    def all_handles(self) -> list[WorkerHandle]:
        groups = [g for g in (self.ranks, self.samplers, self.rewards) if g is not None]
        return [h for g in groups for h in g.handles]

    def reset(self, config: Config, control: ControlConfig) -> None:
        """Rebuild every worker's state from `config` (same processes, same process group)."""
        for future in [h.submit("reset", config, control) for h in self.all_handles()]:
            future.result()

    def shutdown(self) -> None:
        self.backend.shutdown()


def _spawn(backend: Backend, cls: type, config: Config, control: ControlConfig,
           devices: list[Device], roles: tuple[str, ...], prefix: str) -> WorkerGroup:  # fmt: skip
    handles = [
        backend.spawn(cls, device, f"{prefix}{i}", config, control, device, roles, f"{prefix}{i}")
        for i, device in enumerate(devices)
    ]
    return WorkerGroup(prefix, handles)


def build_cluster(config: Config, control: ControlConfig, rank_cls: type = RankWorker) -> Cluster:
    """Spawn every worker of `control.placement` and join the policy ranks' process group.

    Raises:
        ConfigError: an unusable split, or several policy ranks on the in-process backend.
    """
    devices = discover_devices(control.device_kind, control.n_devices, control.oversubscribe)
    placement = make_placement(control.placement, len(devices), control.n_sampler)
    n_ranks = len(placement.devices["policy"])
    if control.backend == "inprocess" and n_ranks > 1:
        raise ConfigError(
            f"backend 'inprocess' runs one policy rank, but placement "
            f"{placement.label()} needs {n_ranks}; use control.backend=ray"
        )
    backend = make_backend(control.backend, devices)
    on = {role: [devices[i] for i in idx] for role, idx in placement.devices.items()}
    samplers = rewards = None
    if placement.kind == "colocate":
        ranks = _spawn(
            backend,
            rank_cls,
            config,
            control,
            on["policy"],
            ("policy", "sampler", "reward"),
            "rank",
        )
    elif placement.kind == "disaggregated":
        samplers = _spawn(
            backend, RankWorker, config, control, on["sampler"], ("sampler", "reward"), "sampler"
        )
        ranks = _spawn(backend, rank_cls, config, control, on["policy"], ("policy",), "rank")
    else:
        samplers = _spawn(
            backend, RankWorker, config, control, on["sampler"], ("sampler",), "sampler"
        )
        rewards = _spawn(backend, RankWorker, config, control, on["reward"], ("reward",), "reward")
        ranks = _spawn(backend, rank_cls, config, control, on["policy"], ("policy",), "rank")
    address = ranks.handles[0].call("rendezvous_address")
    ranks.call_each("init_collective", [(address, r, n_ranks) for r in range(n_ranks)])
    logger.info(
        "cluster: %s on %d %s devices, %d policy ranks",
        placement.label(),
        len(devices),
        devices[0].kind,
        n_ranks,
    )
    return Cluster(backend, placement, devices, ranks, samplers, rewards)
