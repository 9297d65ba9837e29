"""Placement plans: which devices each role's workers occupy.

Three schemas (WeChat-YATT's) over `n` devices:
- colocate: every role on every device; phases run one after another, the sampler sharing the
  policy's module (its weights stay put); on GPUs the policy's optimizer moments wait in host
  memory outside the update (rank.py `_swap_optimizer`; partial does the same).
- disaggregated: the sampler (with the reward service) on the first `k` devices, the policy on
  the other `n - k`; synchronous by default, and with `control.async_staleness=s > 0`
  generation of steps t+1..t+s overlaps training of step t (up to s steps of staleness).
- partial: the sampler on the first `k` devices and the reward service (a generative reward model)
  on the next ones; the policy trains on all `n` devices, so the sampler's devices also train
  and it samples in sync with training (rank.py `effective_staleness`).
Runtime re-placement (replacement.py) moves between these plans by changing `kind` and `k`.
"""

from __future__ import annotations

from dataclasses import dataclass

from yatt.errors import ConfigError

__all__ = ["PLACEMENTS", "ROLES", "Placement", "candidate_placements", "make_placement"]

# A new kind needs its device layout (make_placement), workers (cluster.build_cluster), cost
# model (replacement.predict_step_s) and task graph (sim.step_tasks): each asserts it knows
# the kind rather than treat an unknown one as partial.
PLACEMENTS = ("colocate", "disaggregated", "partial")
ROLES = ("sampler", "reward", "policy")


@dataclass(frozen=True)
class Placement:
    """A plan: `devices[role]` is the sorted tuple of device indices that role's workers use."""

    kind: str
    n_devices: int
    devices: dict[str, tuple[int, ...]]

    def __post_init__(self) -> None:
        assert self.kind in PLACEMENTS, f"placement kind {self.kind!r}"
        assert set(self.devices) == set(ROLES), f"roles {sorted(self.devices)}"
        for role, indices in self.devices.items():
            assert indices, f"role {role} has no devices"
            assert all(0 <= i < self.n_devices for i in indices), f"{role} on {indices}"
            assert list(indices) == sorted(set(indices)), f"{role} devices not sorted: {indices}"

    @property
    def n_sampler(self) -> int:
        return len(self.devices["sampler"])

    def label(self) -> str:
        if self.kind == "colocate":
            return f"colocate({self.n_devices})"
        return f"{self.kind}(sampler={self.n_sampler}/{self.n_devices})"


def make_placement(kind: str, n_devices: int, n_sampler: int = 0) -> Placement:
    """The plan of `kind` over `n_devices`; `n_sampler` = sampler devices (0 = half, rounded up).

    Raises:
        ConfigError: unknown kind, or a split that leaves a role without devices.
    """
    if kind not in PLACEMENTS:
        raise ConfigError(f"control.placement={kind!r} unknown; allowed: {list(PLACEMENTS)}")
    if n_devices < 1:
        raise ConfigError(f"a placement needs >= 1 device, got control.n_devices={n_devices}")
    everything = tuple(range(n_devices))
    if kind == "colocate":
        return Placement(kind, n_devices, dict.fromkeys(ROLES, everything))
    if n_devices < 2:
        raise ConfigError(
            f"control.placement={kind} needs >= 2 devices, got control.n_devices={n_devices}"
        )
    k = n_sampler or (n_devices + 1) // 2
    if not 1 <= k < n_devices:
        raise ConfigError(
            f"control.n_sampler={k} invalid for {kind} on {n_devices} devices; expected "
            f"1..{n_devices - 1}"
        )
    sampler, rest = everything[:k], everything[k:]
    if kind == "disaggregated":
        return Placement(kind, n_devices, {"sampler": sampler, "reward": sampler, "policy": rest})
    assert kind == "partial", f"no device layout for placement kind {kind!r}"
    return Placement(kind, n_devices, {"sampler": sampler, "reward": rest, "policy": everything})


def candidate_placements(n_devices: int) -> list[Placement]:
    """Every plan runtime re-placement may choose among on `n_devices`."""
    plans = [make_placement("colocate", n_devices)]
    for kind in ("disaggregated", "partial"):
        plans += [make_placement(kind, n_devices, k) for k in range(1, n_devices)]
    return plans
