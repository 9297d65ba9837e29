"""Builds the workers of a placement: policy ranks, samplers and reward services on devices.

- colocate: one worker per device hosting policy rank + sampler + reward (the sampler shares the
  policy's module, so weight sync is free).
- disaggregated: sampler+reward workers on the sampler devices, policy ranks on the others.
- partial: samplers on the sampler devices, reward services on the rest, policy ranks on all.
Data-parallel group r uses sampler `r % n_samplers` (and the reward service beside it); the
lowest such rank owns the sampler and pushes weights to it.
A runtime re-placement builds the new plan's cluster from the old one: each device's worker
processes take on their new roles in place (model rebuilt, process group joined anew), so a
move costs a state hand-over, not process start-ups.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from yatt.config import Config
from yatt.control.config import ControlConfig
from yatt.control.devices import Device, discover_devices
from yatt.control.placement import Placement, make_placement
from yatt.control.rank import RankWorker
from yatt.control.workers import Backend, Future, WorkerGroup, WorkerHandle, make_backend
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


def _place(backend: Backend, pool: dict[int, list[WorkerHandle]], cls: type, config: Config,
           control: ControlConfig, devices: list[Device], roles: tuple[str, ...], prefix: str,
           pending: list[Future]) -> WorkerGroup:  # fmt: skip
    """One worker per device in `devices`: a process from `pool` (on that device) takes on
    `roles` (its reset is appended to `pending`), else a new one is spawned."""
    handles = []
    for i, device in enumerate(devices):
        name = f"{prefix}{i}"
        if pool.get(device.index):
            handle = pool[device.index].pop(0)
            handle.name = name
            pending.append(handle.submit("reset", config, control, roles, name))
        else:
            handle = backend.spawn(cls, device, name, config, control, device, roles, name)
        handles.append(handle)
    return WorkerGroup(prefix, handles)


def build_cluster(config: Config, control: ControlConfig, rank_cls: type = RankWorker,
                  previous: Cluster | None = None) -> Cluster:  # fmt: skip
    """Spawn every worker of `control.placement` and join the policy ranks' process group.
    Every worker is a `rank_cls`. `previous`: a cluster on the same devices whose worker
    processes are reused (each takes on its new roles in place: a runtime re-placement costs
    no process start-up); those the new plan does not need are released.

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
    pool: dict[int, list[WorkerHandle]] = {}
    if previous is not None:
        assert previous.devices == devices, f"devices {previous.devices} -> {devices}"
        backend = previous.backend
        for handle in previous.all_handles():
            pool.setdefault(handle.device.index, []).append(handle)
    else:
        backend = make_backend(control.backend, devices)
    on = {role: [devices[i] for i in idx] for role, idx in placement.devices.items()}
    pending: list[Future] = []

    def place(role: str, roles: tuple[str, ...], prefix: str) -> WorkerGroup:
        return _place(backend, pool, rank_cls, config, control, on[role], roles, prefix, pending)

    samplers = rewards = None  # policy ranks first: they take over the previous ranks' processes
    if placement.kind == "colocate":
        ranks = place("policy", ("policy", "sampler", "reward"), "rank")
    elif placement.kind == "disaggregated":
        ranks = place("policy", ("policy",), "rank")
        samplers = place("sampler", ("sampler", "reward"), "sampler")
    else:
        ranks = place("policy", ("policy",), "rank")
        samplers = place("sampler", ("sampler",), "sampler")
        rewards = place("reward", ("reward",), "reward")
    for handle in [h for left in pool.values() for h in left]:
        backend.release(handle)
    for future in pending:
        future.result()
    address = ranks.handles[0].call("rendezvous_address")
    ranks.call_each("init_collective", [(address, r, n_ranks) for r in range(n_ranks)])
    logger.info(
        "cluster: %s on %d %s devices, %d policy ranks (%d processes reused)",
        placement.label(),
        len(devices),
        devices[0].kind,
        n_ranks,
        len(pending),
    )
    return Cluster(backend, placement, devices, ranks, samplers, rewards)
