"""Standard OLTP workloads, one module each, behind the ``Workload`` interface.

A workload builds its tables and loads its initial data, registers its stored procedures,
generates a deterministic request stream from a seed, and checks its consistency invariants.
``WORKLOADS`` maps the CLI name (``tpcc``, ``ycsb``, ``smallbank``) to the class; wherever a
workload is named (CLI, cluster config), ``package.module:Class`` names your own subclass
instead (``dgcc/examples/inventory.py`` is one).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from dgcc.api import Outcome, ProcedureRegistry, TxnRequest
from dgcc.errors import ConfigError
from dgcc.storage import Database

REPLICATED = -1  # partition_of() of a read-only key every partition holds a copy of


class Workload(ABC):
    """One benchmark: schema + data, procedures, request stream, invariant checks.

    Args are workload-specific keyword options (``warehouses=4``, ``theta=0.99`` ...), validated
    in ``__init__`` with a ``ConfigError`` that names the bad value.
    """

    name: ClassVar[str]
    # Tables whose rows a plan function reads on every node that plans a call, not only on
    # the rows' owner (TPC-C: a remote stock node plans a NewOrder with its home warehouse's
    # tax): a node keeps them whole; of the other tables it keeps only the rows it owns.
    plan_tables: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def schema(self) -> Database:
        """The empty tables with their conflict keys and indexes (what checkpoints load into)."""

    @abstractmethod
    def build(self, seed: int) -> Database:
        """``schema()`` loaded with the initial data, deterministically from ``seed``."""

    @abstractmethod
    def registry(self) -> ProcedureRegistry:
        """The workload's stored procedures."""

    @abstractmethod
    def requests(self, seed: int) -> Iterator[TxnRequest]:
        """An endless, deterministic stream of requests in the standard mix."""

    @abstractmethod
    def check(self, db: Database) -> list[str]:
        """Invariant violations found in ``db`` (empty when consistent)."""

    def check_state(self, db: Database) -> list[str]:
        """The invariants that hold on any reachable state, without the outcomes ``observe`` saw.

        What a recovered database is checked against (a new process never saw the run). By
        default ``check``, for workloads whose invariants need no history (TPC-C).
        """
        return self.check(db)

    def observe(self, batch: Sequence[object], outcomes: Sequence[Outcome]) -> None:
        """See a batch's outcomes after it ran; ``check`` may use the committed results.

        Drivers call this after every batch (YCSB counts committed increments, Smallbank the
        money that entered or left the bank); by default it does nothing.
        """
        del batch, outcomes

    def partition_of(self, key: Hashable, partitions: int) -> int:
        """The partition owning a conflict key (used when the data is spread over nodes), in
        ``0..partitions-1``, or ``REPLICATED`` for a read-only key every partition holds."""
        raise NotImplementedError(
            f"{self.name} does not define partition_of(key, partitions), which places its rows "
            "on cluster nodes: implement it (and route_keys) to run it on a cluster"
        )

    def data_bytes(self) -> tuple[int, str] | None:
        """Roughly the memory the loaded data takes, and the options that size it (for the
        message when it cannot fit); None when the workload cannot tell."""
        return None

    def check_fits_memory(self, copies: int = 1) -> None:
        """Refuse, before loading anything, data this machine's available memory cannot hold:
        ``copies`` processes each loading it at once (local cluster nodes), this one by default.

        Read from ``MemAvailable``, capped by a memory cgroup's limit (``available_memory_bytes``).

        Raises:
            ConfigError: ``copies`` times the estimate (``data_bytes``) exceeds the memory
                available now.
        """
        sized, available = self.data_bytes(), available_memory_bytes()
        if sized is None or available is None or copies * sized[0] <= available:
            return
        who, needs, together = self.name, "needs", ""
        if copies > 1:
            who, needs = f"{copies} local nodes of {self.name}", "need"
            together = " together (each loads the whole database before keeping its share)"
        raise ConfigError(
            f"{who} with {sized[1]} {needs} about {copies * sized[0] / 2**30:,.1f} GiB of "
            f"memory{together}, but only {available / 2**30:,.1f} GiB is available here; "
            "load less data"
        )

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable] | None:
        """Conflict keys naming every partition a call touches, from its parameters alone.

        One key per partition suffices; the cluster routes the call to the nodes owning them.
        None (the default) means the workload cannot tell, and every node plans the call. Bad
        parameters may raise anything; the call is then planned everywhere and fails alike if
        its plan raises ``BadParams``. On a cluster of several nodes, a plan of a call more
        than one node plans that raises anything else stops the nodes (a peer may have planned
        it fine and committed its share): route your calls, and reject bad params with
        ``BadParams``.
        """
        del procedure, params
        return None

    def route_partitions(
        self, procedure: str, params: Mapping[str, Any], partitions: int
    ) -> set[int] | None:
        """A shortcut for ``route_keys``: the partitions (in ``0 .. partitions - 1``) it names,
        which must be those of its keys (calls are placed by this, while recovery's parallel
        replay places the logged calls by ``route_keys``).

        For a workload whose calls name many keys (YCSB): no key tuples to build and hash.
        None (the default) means the router places ``route_keys`` instead. Bad parameters may
        raise anything, as for ``route_keys``.
        """
        del procedure, params, partitions
        return None

    def describe(self) -> dict[str, Any]:
        """The options this instance was built with, every default included, for reports; a
        log directory's recorded workload is matched by it, so a restart that spells the same
        options differently (a default given or left out) is not refused (the default ``{}``
        matches only the same spelling)."""
        return {}


CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNLIMITED = 2**60  # a cgroup v1 "no limit" is a page-rounded 2**63 - 1


def available_memory_bytes(cgroup_root: Path = CGROUP_ROOT) -> int | None:
    """Memory this process can still take: ``MemAvailable`` of ``/proc/meminfo``, capped by
    the headroom under its memory cgroup's limit where one is set (a container's), read from
    ``cgroup_root`` (None where neither can be read)."""
    known = [v for v in (_meminfo_available(), _cgroup_headroom(cgroup_root)) if v is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom(root: Path, membership: Path = Path("/proc/self/cgroup")) -> int | None:
    """The least headroom under a memory limit of this process's cgroup or of any cgroup above
    it (cgroup v2 under ``root``, else v1 under ``root/memory``; the path from ``membership``,
    the mount's root where that is not mounted, as in a container): the limit less the usage,
    the usage less the inactive file cache the kernel reclaims first. None with no limit set
    or no cgroup readable."""
    layouts = (  # (mount, its marker, the hierarchy's name in membership, limit, usage, stat key)
        (root, "cgroup.controllers", "", "memory.max", "memory.current", "inactive_file"),
        (root / "memory", "memory.limit_in_bytes", "memory", "memory.limit_in_bytes",
         "memory.usage_in_bytes", "total_inactive_file"),
    )  # fmt: skip
    for mount, marker, hierarchy, limit_file, usage_file, inactive_key in layouts:
        if not (mount / marker).is_file():
            continue
        folder = mount / _cgroup_path(membership, hierarchy).lstrip("/")
        if not folder.is_dir():
            folder = mount
        headrooms = []
        while True:
            headroom = _headroom(folder, limit_file, usage_file, inactive_key)
            if headroom is not None:
                headrooms.append(headroom)
            if folder == mount:
                break
            folder = folder.parent
        return min(headrooms, default=None)
    return None


def _cgroup_path(membership: Path, hierarchy: str) -> str:
    """This process's cgroup in ``hierarchy`` ("" for v2, "memory" for v1), or "/"."""
    with contextlib.suppress(OSError, ValueError):
        for line in membership.read_text(encoding="ascii").splitlines():
            _, names, path = line.split(":", 2)
            if (not hierarchy and not names) or hierarchy in names.split(","):
                return path
    return "/"


def _headroom(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        limit_text = (folder / limit_file).read_text(encoding="ascii").strip()
        if limit_text == "max":
            return None
        limit = int(limit_text)
        usage = int((folder / usage_file).read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    if limit >= _UNLIMITED:
        return None
    inactive = 0
    with contextlib.suppress(OSError, ValueError):
        for line in (folder / "memory.stat").read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    return max(0, limit - max(0, usage - inactive))


WORKLOADS: dict[str, type[Workload]] = {}


def register_workload(cls: type[Workload]) -> type[Workload]:
    """Class decorator: ``cls`` under its ``name`` in ``WORKLOADS``; a second class under a
    taken name is an error (re-registering the same class, as a reload does, is not)."""
    taken = WORKLOADS.get(cls.name)
    where = (cls.__module__, cls.__qualname__)
    if taken is not None and (taken.__module__, taken.__qualname__) != where:
        raise ConfigError(
            f"workload name {cls.name!r} is taken by {taken.__module__}.{taken.__qualname__}"
        )
    WORKLOADS[cls.name] = cls
    return cls


def get_workload(name: str, **options: Any) -> Workload:
    """The workload ``name`` built with ``options``: a built-in (``WORKLOADS``), or your own
    as ``package.module:Class``, a ``Workload`` subclass importable where the engine runs (a
    cluster's node processes import it too: install it, or put it on ``PYTHONPATH``).

    Raises:
        ConfigError: an unknown name, or a path that does not import or names no Workload.
    """
    cls = import_workload(name) if ":" in name else None
    if cls is None:
        _load_builtin()
        try:
            cls = WORKLOADS[name]
        except KeyError:
            raise ConfigError(
                f"unknown workload {name!r}; choose one of: {', '.join(sorted(WORKLOADS))}, "
                "or package.module:Class for your own"
            ) from None
    return cls(**options)


def import_workload(path: str) -> type[Workload]:
    """The ``Workload`` subclass that ``package.module:Class`` names.

    Raises:
        ConfigError: naming the path and what is wrong with it.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"workload {path!r}: expected package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"workload {path!r}: cannot import {module_name!r}: {error} (is its folder on "
            "PYTHONPATH, or the package installed?)"
        ) from None
    except Exception as error:  # its own code raised on import (a SyntaxError, a bug ...)
        raise ConfigError(
            f"workload {path!r}: importing {module_name!r} raised {type(error).__name__}: {error}"
        ) from None
    cls = getattr(module, attribute, None)
    if cls is None:
        raise ConfigError(f"workload {path!r}: module {module_name} has no {attribute!r}")
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise ConfigError(
            f"workload {path!r}: {module_name}.{attribute} is {cls!r}, not a dgcc Workload subclass"
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ConfigError(f"workload {path!r}: {cls.__name__} does not implement {missing}")
    return cls


def _load_builtin() -> None:
    """Register the built-in workloads (imported here, not at module top, to keep this cheap)."""
    from dgcc.workloads import smallbank, tpcc, ycsb  # noqa: F401 - imported to register


__all__ = [
    "REPLICATED",
    "WORKLOADS",
    "Workload",
    "get_workload",
    "import_workload",
    "register_workload",
]
