"""Builds the workers of a placement: policy ranks, samplers and reward services on devices.

- colocate: one worker per device hosting policy rank + sampler + reward (the sampler shares the
  policy's module, so weight sync is free).
- disaggregated: sampler+reward workers on the sampler devices, policy ranks on the others.
- partial: samplers on the sampler devices, reward services on the rest, policy ranks on all.
Under `control.cpu_mapping="threads"` each role's CPU devices become one multi-core worker.
Data-parallel group r uses sampler `r % n_samplers` (and the reward service beside it); the
lowest such rank owns the sampler and pushes weights to it.
A runtime re-placement builds the new plan's cluster from the old one: worker processes take
on their new roles in place (process group joined anew; a CPU process may re-pin itself to
other cores; a policy rank that stays one keeps its model and optimizer, the others their
module), so a move costs a state hand-over, not process start-ups or model loads (except for a
former reward service alone, which holds no policy module and loads it): CPU processes
the new plan does not need are parked as spares, and a re-placing CPU cluster starts with one
process per core.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from yatt.config import Config, check_controller_settings
from yatt.control.config import ControlConfig
from yatt.control.devices import Device, discover_devices, widen
from yatt.control.placement import Placement, candidate_placements, make_placement
from yatt.control.rank import RankWorker
from yatt.control.workers import Backend, Future, WorkerGroup, WorkerHandle, make_backend
from yatt.errors import ConfigError

__all__ = ["Cluster", "build_cluster", "plans_that_fit", "role_devices"]

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
    spares: list[WorkerHandle] = field(default_factory=list)

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
           pending: list[Future], prefer: list[WorkerHandle]) -> WorkerGroup:  # fmt: skip
    """One worker per device in `devices`: a process from `pool` (on that device; `prefer`red
    ones first) takes on `roles` (its reset is appended to `pending`), else one is spawned."""
    handles = []
    for i, device in enumerate(devices):
        name = f"{prefix}{i}"
        handle = _reusable(pool, device, prefer)
        if handle is not None:
            handle.name, handle.device = name, device
            pending.append(handle.submit("reset", config, control, roles, name, device))
        else:
            handle = backend.spawn(cls, device, name, config, control, device, roles, name)
        handles.append(handle)
    return WorkerGroup(prefix, handles)


def _reusable(pool: dict[int, list[WorkerHandle]], device: Device,
              prefer: list[WorkerHandle]) -> WorkerHandle | None:  # fmt: skip
    """A pooled process for `device`, taken out of `pool`: one on that device, else (CPU: a
    process re-pins itself to other cores) any pooled one; a GPU process stays on its GPU.
    Among those, a `prefer`red one first (policy ranks keep their state when they stay ranks)."""
    here = pool.get(device.index, [])
    elsewhere = [h for index, hs in pool.items() if index != device.index for h in hs]
    candidates = here + elsewhere if device.kind == "cpu" else here
    if not candidates:
        return None
    handle = min(candidates, key=lambda h: (h not in prefer, candidates.index(h)))
    for handles in pool.values():
        if handle in handles:
            handles.remove(handle)
    return handle


def role_devices(placement: Placement, devices: list[Device], cpu_mapping: str
                 ) -> dict[str, list[Device]]:  # fmt: skip
    """The devices of each role's workers: one per device, or (CPU devices under the "threads"
    mapping) one multi-core device per role, so a role spread over cores runs as one process."""
    on = {role: [devices[i] for i in indices] for role, indices in placement.devices.items()}
    if cpu_mapping == "threads" and devices[0].kind == "cpu":
        on = {role: [widen(group)] for role, group in on.items()}
    return on


def plans_that_fit(config: Config, control: ControlConfig, devices: list[Device]
                   ) -> tuple[list[Placement], list[Placement]]:  # fmt: skip
    """The plans runtime re-placement may move to on `devices`, and those it may not: a plan
    fits when `algo.prompts_per_step` divides evenly over its policy ranks (one data-parallel
    group each), as `build_cluster` requires of a run's first plan, and, on the in-process
    backend, when it has one policy rank."""
    fit: list[Placement] = []
    unfit: list[Placement] = []
    for plan in candidate_placements(len(devices)):
        n_ranks = len(role_devices(plan, devices, control.cpu_mapping)["policy"])
        one_rank_only = control.backend == "inprocess" and n_ranks > 1  # see build_cluster
        (unfit if config.algo.prompts_per_step % n_ranks or one_rank_only else fit).append(plan)
    return fit, unfit


def build_cluster(config: Config, control: ControlConfig, rank_cls: type = RankWorker,
                  previous: Cluster | None = None) -> Cluster:  # fmt: skip
    """Spawn every worker of `control.placement` and join the policy ranks' process group.
    Every worker is a `rank_cls`. `previous`: a cluster on the same devices whose worker
    processes are reused (each takes on its new roles in place: a runtime re-placement costs
    no process start-up; policy ranks stay ranks where they can, keeping their state); those
    the new plan does not need are parked as spares (CPU) or released (GPU). A re-placing CPU
    cluster starts with spares up to one process per core.

    Raises:
        ConfigError: an unusable split, several policy ranks on the in-process backend, a
            setting the controllers do not support (`check_controller_settings`), or a backend
            that is not installed.
    """
    if previous is None:
        check_controller_settings(config, control)
    devices = discover_devices(control.device_kind, control.n_devices, control.oversubscribe)
    placement = make_placement(control.placement, len(devices), control.n_sampler)
    on = role_devices(placement, devices, control.cpu_mapping)
    n_ranks = len(on["policy"])
    if control.backend == "inprocess" and n_ranks > 1:
        raise ConfigError(
            f"backend 'inprocess' runs one policy rank, but placement "
            f"{placement.label()} needs {n_ranks}; use control.backend=ray"
        )
    if previous is None and config.algo.prompts_per_step % n_ranks:  # before any worker starts
        raise ConfigError(
            f"algo.prompts_per_step={config.algo.prompts_per_step} must be a multiple of the "
            f"{n_ranks} data-parallel groups of {placement.label()} (control.placement, "
            "control.n_devices, control.n_sampler and control.cpu_mapping set how many)"
        )
    pool: dict[int, list[WorkerHandle]] = {}
    old_ranks: list[WorkerHandle] = []
    if previous is not None:
        assert previous.devices == devices, f"devices {previous.devices} -> {devices}"
        backend, old_ranks = previous.backend, previous.ranks.handles
        for handle in previous.all_handles() + previous.spares:
            pool.setdefault(handle.device.index, []).append(handle)
    else:
        backend = make_backend(control.backend, devices)
    try:
        return _build(backend, pool, old_ranks, rank_cls, config, control, placement, devices,
                      on, n_ranks, fresh=previous is None)  # fmt: skip
    except BaseException:
        if previous is None:  # workers this call started: nobody else holds them to close
            backend.shutdown()
        raise


def _build(backend: Backend, pool: dict[int, list[WorkerHandle]], old_ranks: list[WorkerHandle],
           rank_cls: type, config: Config, control: ControlConfig, placement: Placement,
           devices: list[Device], on: dict[str, list[Device]], n_ranks: int, fresh: bool
           ) -> Cluster:  # fmt: skip
    """`build_cluster`'s workers on `backend`, roles handed to `pool`'s processes first."""
    pending: list[Future] = []

    def place(role: str, roles: tuple[str, ...], prefix: str) -> WorkerGroup:
        prefer = old_ranks if role == "policy" else []
        return _place(backend, pool, rank_cls, config, control, on[role], roles, prefix,
                      pending, prefer)  # fmt: skip

    samplers = rewards = None  # policy ranks first: they take over the previous ranks' processes
    if placement.kind == "colocate":
        ranks = place("policy", ("policy", "sampler", "reward"), "rank")
    elif placement.kind == "disaggregated":
        ranks = place("policy", ("policy",), "rank")
        samplers = place("sampler", ("sampler", "reward"), "sampler")
    else:
        assert placement.kind == "partial", f"no workers for placement kind {placement.kind!r}"
        ranks = place("policy", ("policy",), "rank")
        samplers = place("sampler", ("sampler",), "sampler")
        rewards = place("reward", ("reward",), "reward")
    spares = _spares(backend, pool, rank_cls, config, control, on, fresh=fresh)
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
    return Cluster(backend, placement, devices, ranks, samplers, rewards, spares)


def _spares(backend: Backend, pool: dict[int, list[WorkerHandle]], cls: type, config: Config,
            control: ControlConfig, on: dict[str, list[Device]], fresh: bool
            ) -> list[WorkerHandle]:  # fmt: skip
    """Idle processes kept for later moves: the pooled ones the plan left over (GPU: released
    instead, an idle process would hold on to GPU memory); a `fresh` re-placing CPU cluster
    spawns them up to one process per core (a move should not wait for a start-up)."""
    devices = discover_devices(control.device_kind, control.n_devices, control.oversubscribe)
    left = [h for handles in pool.values() for h in handles]
    if devices[0].kind == "cuda":
        for handle in left:
            backend.release(handle)
        return []
    if not (fresh and control.replace_every and control.backend == "ray"):
        return left
    used = {d.index for group in on.values() for d in group}
    free = [d for d in devices if d.index not in used]
    return [backend.spawn(cls, d, f"spare{d.index}", config, control, d, (), "") for d in free]
