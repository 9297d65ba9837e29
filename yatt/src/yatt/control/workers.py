"""Worker groups: a role's workers behind one interface, with two backends.

- `InProcessBackend`: the worker object lives in the calling process; calls run immediately.
  For small runs and tests (one process; no data-parallel collectives across workers).
- `RayBackend`: each worker is a Ray actor pinned to one bundle (= one device) of a placement
  group; several workers may share a device (colocation) with fractional resources.

`WorkerHandle.submit(method, *args)` returns a `Future`; `call` waits for it. A Future passed
as an argument reaches the worker as its result, straight from the worker that made it (Ray
passes the object by reference: a state hand-over does not go through the caller). Handles count
the bytes of tensors and texts they pass in both directions (`bytes_moved`), which is how the
controller benchmarks compare data movement. Only this module and its Ray backend know about Ray.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import logging
import os
import signal
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from yatt.control.devices import Device
from yatt.control.transfer import PackedTensor
from yatt.errors import ConfigError, WorkerDied, WorkerError, YattError

__all__ = [
    "BACKENDS",
    "Backend",
    "Future",
    "InProcessBackend",
    "RayBackend",
    "WorkerGroup",
    "WorkerHandle",
    "call_now",
    "gather",
    "make_backend",
    "payload_nbytes",
    "require_backend",
    "wait_first",
]

logger = logging.getLogger(__name__)
BACKENDS = ("inprocess", "ray")
# Up to this many workers may share one device bundle (each asks for 1/this of it).
MAX_WORKERS_PER_DEVICE = 8


def payload_nbytes(value: Any, _counted: set[int] | None = None) -> int:
    """Bytes of the tensors, texts and numbers inside `value` (what a transfer must carry); a
    PackedTensor that appears twice (tied weights, see `pack`) travels, and counts, once."""
    counted = set() if _counted is None else _counted
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, PackedTensor):
        if id(value) in counted:
            return 0
        counted.add(id(value))
        return value.nbytes
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, int | float | bool) or value is None:
        return 8
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return sum(payload_nbytes(getattr(value, f.name), counted) for f in fields)
    if isinstance(value, dict):
        return sum(
            payload_nbytes(k, counted) + payload_nbytes(v, counted) for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return sum(payload_nbytes(v, counted) for v in value)
    return 0


class Future(ABC):
    """The pending result of a submitted call."""

    @abstractmethod
    def result(self) -> Any: ...

    def done(self) -> bool:
        """True when `result` would not block."""
        return True

    def cancel(self) -> None:  # noqa: B027 - a finished call has nothing to cancel
        """Drop a call that has not started yet (a running one finishes; its result is unused)."""


def call_now(function: Any, *args: Any) -> Future:
    """`function(*args)` run here and now, as a finished Future (errors re-raised by result)."""
    try:
        return _DoneFuture(function(*args))
    except Exception as exc:  # re-raised by result(), as Ray does
        return _DoneFuture(error=exc)


def gather(futures: list[Future]) -> list[Any]:
    """The futures' results in order; the first call to fail, in completion order, raises at
    once. (In submission order, a driver would wait forever on a rank blocked in a collective
    with the rank that failed; raising lets the caller shut the workers down.)"""
    results: list[Any] = [None] * len(futures)
    refs = {f._ref: i for i, f in enumerate(futures) if isinstance(f, _RayFuture)}
    if len(refs) == len(futures) > 1:
        import ray

        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            index = refs[ready[0]]
            try:
                results[index] = futures[index].result()
            except WorkerError as error:
                raise _root_cause(error, [futures[refs[ref]] for ref in pending]) from None
        return results
    return [f.result() for f in futures]


def _root_cause(first: WorkerError, others: list[Future]) -> WorkerError:
    """The error to report when `first` failed: a worker that died meanwhile, if one did (its
    peers' collectives then fail with a connection reset, which comes first but says less)."""
    import ray

    ready, _ = ray.wait([f._ref for f in others], num_returns=len(others), timeout=2.0)
    for future in others:
        if future._ref in ready:
            try:
                future.result()
            except WorkerDied as error:
                return error
            except WorkerError:
                pass
    return first


def wait_first(futures: list[Future]) -> int:
    """Index of the earliest-submitted future among those finished, blocking until one is
    (other kinds of future: the oldest). Calls to one worker finish in submission order, so
    with one sampler per group the order is fixed."""
    assert futures, "wait_first needs at least one future"
    ready = [i for i, f in enumerate(futures) if f.done()]
    if ready:
        return ready[0]
    refs = [f._ref for f in futures if isinstance(f, _RayFuture)]
    if len(refs) < len(futures):
        return 0
    import ray

    ray.wait(refs, num_returns=1)
    return next(i for i, f in enumerate(futures) if f.done())


class _DoneFuture(Future):
    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class WorkerHandle(ABC):
    """One worker on one device."""

    def __init__(self, device: Device, name: str) -> None:
        self.device = device
        self.name = name
        self.bytes_moved = 0

    @abstractmethod
    def submit(self, method: str, *args: Any) -> Future: ...

    def call(self, method: str, *args: Any) -> Any:
        return self.submit(method, *args).result()


class _LocalHandle(WorkerHandle):
    def __init__(self, worker: Any, device: Device, name: str) -> None:
        super().__init__(device, name)
        self.worker = worker

    def submit(self, method: str, *args: Any) -> Future:
        args = tuple(a.result() if isinstance(a, Future) else a for a in args)
        return call_now(getattr(self.worker, method), *args)


class _RayFuture(Future):
    def __init__(self, ref: Any, handle: WorkerHandle) -> None:
        self._ref, self._handle = ref, handle

    def done(self) -> bool:
        import ray

        ready, _ = ray.wait([self._ref], num_returns=1, timeout=0)
        return bool(ready)

    def cancel(self) -> None:
        import ray

        ray.cancel(self._ref)

    def result(self) -> Any:
        """The call's value. Raises WorkerError (one line naming the worker) for a call that
        raised there, or a worker whose process died; the worker's own exception is its
        cause."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            value = ray.get(self._ref)
        except RayTaskError as error:  # the worker's exception, under Ray's remote traceback
            cause = error.cause if isinstance(error.cause, BaseException) else error
            # Bad input (a reward's value, a data row) says what it is; a bug names its type.
            named = str(cause)
            if not isinstance(cause, YattError):
                named = f"{type(cause).__name__}: {named}"
            detail = " ".join(named.split())[:500]
            raise WorkerError(f"{self._handle.name}: {detail}") from cause
        except RayActorError as error:
            raise WorkerDied(
                f"{self._handle.name} ({self._handle.device.name}) died: its process exited "
                "(a crash, os._exit or the OOM killer; see its log under /tmp/ray)"
            ) from error
        self._handle.bytes_moved += payload_nbytes(value)
        return value


class _RayHandle(WorkerHandle):
    def __init__(self, actor: Any, device: Device, name: str) -> None:
        super().__init__(device, name)
        self.actor = actor

    def submit(self, method: str, *args: Any) -> Future:
        assert not any(isinstance(a, Future) and not isinstance(a, _RayFuture) for a in args), (
            f"{method}: a local Future passed to a Ray worker"
        )
        self.bytes_moved += payload_nbytes([a for a in args if not isinstance(a, _RayFuture)])
        refs = [a._ref if isinstance(a, _RayFuture) else a for a in args]
        return _RayFuture(getattr(self.actor, method).remote(*refs), self)

    def __reduce__(self):  # handles travel to other actors (parallel controllers call samplers)
        return (_RayHandle, (self.actor, self.device, self.name))


class Backend(ABC):
    """Creates workers on devices."""

    name = "backend"

    @abstractmethod
    def spawn(self, cls: type, device: Device, name: str, *args: Any) -> WorkerHandle: ...

    def shutdown(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the workers and resources this backend created."""

    def release(self, handle: WorkerHandle) -> None:  # noqa: B027 - nothing held by default
        """Release one worker (its device stays reserved for the backend's other workers)."""


class InProcessBackend(Backend):
    """Workers are plain objects in this process (no pinning: the caller's threads are shared)."""

    name = "inprocess"

    def spawn(self, cls: type, device: Device, name: str, *args: Any) -> WorkerHandle:
        return _LocalHandle(cls(*args), device, name)


class _QuietAuthDefault(logging.Filter):
    """Drops Ray's note that token authentication is on by default, printed at every start of
    a local instance; the setting itself stays as Ray chose it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this")


# glibc malloc settings of CPU workers (read at process start): serve allocations below 4 GiB
# from the heap and never trim it, so the memory a step frees is reused by the next. With the
# defaults every allocation above 32 MiB is fresh pages from the kernel, handed back on free:
# a 135M-parameter CPU update then faults about 300k pages in again each step (0.5 s of kernel
# time, 10-20% of the update on one core); kept, none, for about 0.7 GiB more resident memory.
CPU_WORKER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**34)}


def init_ray(num_cpus: int, num_gpus: int = 0) -> None:
    """Start a local Ray instance for this process's workers: no dashboard, the workers' output
    kept out of the driver's, the driver's logging left as it is, less Ray's note on its
    default token authentication (which stays on). Without GPUs, Ray's processes start with
    `CPU_WORKER_MALLOC` (unless the environment sets those variables; this process's own
    environment is left as it was)."""
    import ray

    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _QuietAuthDefault) for f in auth_log.filters):
        auth_log.addFilter(_QuietAuthDefault())
    added = [] if num_gpus else [key for key in CPU_WORKER_MALLOC if key not in os.environ]
    os.environ.update({key: CPU_WORKER_MALLOC[key] for key in added})
    # ray.init replaces this process's SIGTERM handler (with a sys.exit, and its core worker's
    # crash reporter): the one this process had (the CLI's, which stops a run as Ctrl-C does,
    # with a resume hint) comes back once it has started.
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)  # fmt: skip
    except BaseException:  # Ctrl-C mid-start: stop the processes it started so far
        ray.shutdown()
        raise
    finally:  # the started processes have them; later children of this one do not
        for key in added:
            del os.environ[key]
        if sigterm is not None:  # (None: a handler not set from Python, left as Ray set it)
            signal.signal(signal.SIGTERM, sigterm)


def gcs_reachable(timeout_s: float = 1.0) -> bool:
    """Whether the Ray cluster's GCS (its control store) still accepts connections."""
    import ray

    host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    return True


@functools.cache
def init_guarded(cls: type) -> type:
    """``cls`` for a Ray actor whose construction may fail on bad input: the exception is kept
    and every call raises it, so the caller's WorkerError names it (a data row too long for
    the model, a bad config value). Raised from ``__init__``, Ray would end the actor's
    process and the caller would see only that it died."""

    def init(self: Any, *args: Any) -> None:
        self._yatt_init_error = None
        try:
            cls.__init__(self, *args)
        except Exception as error:  # (raised again by each call; what a worker cannot set up)
            self._yatt_init_error = error

    def guard(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self._yatt_init_error is not None:
                raise self._yatt_init_error
            return method(self, *args, **kwargs)

        return guarded

    methods = {
        name: guard(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("__")
        and not isinstance(inspect.getattr_static(cls, name), staticmethod | classmethod)
    }
    return type(cls.__name__, (cls,), {"__init__": init, **methods})


# how often a release waiting on Ray's calls checks that the GCS still lives
RELEASE_POLL_S = 0.5


class RayBackend(Backend):
    """Workers are Ray actors on the bundles of one placement group (one bundle per device)."""

    name = "ray"

    def __init__(self, devices: list[Device]) -> None:
        import ray
        from ray.util.placement_group import placement_group

        if not ray.is_initialized():
            init_ray(len(devices), sum(d.kind == "cuda" for d in devices))
        self.devices = devices
        self.group = placement_group([d.ray_bundle() for d in devices], strategy="PACK")
        ray.get(self.group.ready(), timeout=120)
        self._actors: list[Any] = []

    def spawn(self, cls: type, device: Device, name: str, *args: Any) -> WorkerHandle:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = device.index  # a multi-core CPU device is scheduled on its first core's bundle
        assert self.devices[bundle].index == device.index, f"{device.name} not in the group"
        share = 1.0 / MAX_WORKERS_PER_DEVICE
        options = {
            "num_cpus": share,
            "num_gpus": share if device.kind == "cuda" else 0,
            "name": None,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=bundle
            ),
        }
        actor = ray.remote(init_guarded(cls)).options(**options).remote(*args)
        self._actors.append(actor)
        return _RayHandle(actor, device, name)

    def release(self, handle: WorkerHandle) -> None:
        """Kill one worker (a move); as ``shutdown``, a GCS gone under it ends the wait."""
        assert isinstance(handle, _RayHandle), f"{handle.name} is not a Ray worker"
        if gcs_reachable():
            _while_gcs_lives(_release_ray, [handle.actor], None)
        self._actors.remove(handle.actor)

    def shutdown(self) -> None:
        """Kill the actors and remove the placement group, unless Ray's GCS (its control
        store) is gone, before or while this runs: Ray's own processes then went with it (a
        signal to the whole process group), and with them what it held, and a call waiting
        on the GCS would wait 60 s, then Ray would end this process (``_while_gcs_lives``)."""
        actors, self._actors = self._actors, []
        if gcs_reachable():
            _while_gcs_lives(_release_ray, actors, self.group)


def _while_gcs_lives(release: Callable[..., None], *args: Any) -> None:
    """``release(*args, errors)`` in a thread of its own, waited for while the GCS lives: a
    GCS dying under its calls is noticed (and a signal handler gets its turn in this thread
    between checks), and this returns then, leaving the thread waiting. An error the release
    put in ``errors`` is raised here."""
    errors: list[BaseException] = []
    releasing = threading.Thread(
        target=release, args=(*args, errors), daemon=True, name="yatt-ray-release"
    )
    releasing.start()
    while releasing.is_alive():
        releasing.join(RELEASE_POLL_S)
        if releasing.is_alive() and not gcs_reachable():
            return
    if errors:
        raise errors[0]


def _release_ray(actors: list[Any], group: Any, errors: list[BaseException]) -> None:
    """Kill `actors` and remove placement `group` (None: keep it); an exception goes to
    `errors`."""
    import ray
    from ray.util.placement_group import remove_placement_group

    try:
        for actor in actors:
            ray.kill(actor)
        if group is not None:
            remove_placement_group(group)
    except BaseException as error:  # raised again by the waiting caller
        errors.append(error)


def require_backend(name: str) -> None:
    """Raise ConfigError when backend `name` needs a package that is not installed (Ray)."""
    if name == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "control.backend=ray needs Ray, which is not installed: pip install './yatt[ray]' "
            "(or train without control.backend=ray)"
        )


def make_backend(name: str, devices: list[Device]) -> Backend:
    """Backend by name ("inprocess" or "ray"); raises ConfigError for others, or for Ray when
    it is not installed."""
    require_backend(name)
    if name == "inprocess":
        return InProcessBackend()
    if name == "ray":
        return RayBackend(devices)
    raise ConfigError(f"worker backend {name!r} unknown; allowed: {list(BACKENDS)}")


class WorkerGroup:
    """The workers of one role (`role` names the group: rank, sampler or reward), one handle
    per device (or per multi-core CPU worker)."""

    def __init__(self, role: str, handles: list[WorkerHandle]) -> None:
        assert handles, f"worker group {role} is empty"
        self.role = role
        self.handles = handles

    def __len__(self) -> int:
        return len(self.handles)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """The same call on every worker, concurrently; results in worker order."""
        return gather([h.submit(method, *args) for h in self.handles])

    def call_each(self, method: str, per_worker_args: list[tuple]) -> list[Any]:
        """Worker i gets `per_worker_args[i]`, concurrently; results in worker order."""
        assert len(per_worker_args) == len(self.handles), (
            f"{len(per_worker_args)} argument tuples for {len(self.handles)} workers"
        )
        return gather([h.submit(method, *a) for h, a in zip(self.handles, per_worker_args)])

    @property
    def bytes_moved(self) -> int:
        return sum(h.bytes_moved for h in self.handles)
