"""The controller interface both modes implement, and the loop that drives them."""

from __future__ import annotations

import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yatt.checkpoint import checkpoint_due
from yatt.common.timers import time_limit_reached
from yatt.config import Config
from yatt.control.async_rollout import QueueState, deal_prompts, prompts_due
from yatt.control.cluster import Cluster
from yatt.control.config import ControlConfig
from yatt.control.rank import peak_rss_mb
from yatt.control.workers import gather
from yatt.errors import ConfigError
from yatt.run_checks import check_eval_data

__all__ = [
    "Controller",
    "RunResult",
    "add_idle_metrics",
    "add_perf_metrics",
    "evaluate_ranks",
    "start_eval",
    "step_eval",
]

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """Metric history, per-worker stats and the phase events of a run."""

    history: list[dict[str, float]]
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out accuracy)
    workers: dict[str, dict[str, float]] = field(default_factory=dict)
    events: list[tuple] = field(default_factory=list)  # timeline.Span's fields
    driver_peak_rss_mb: float = 0.0
    bytes_moved: int = 0
    wall_s: float = 0.0
    decisions: list[dict[str, Any]] = field(default_factory=list)  # Decision.record() each
    run_dir: Path | None = None  # where fit_distributed wrote the run's outputs


def add_perf_metrics(metrics: dict[str, float], step_s: float) -> None:
    """The step's wall time and the trainer's rates over it: tokens/s (`perf/throughput`,
    prompt and response), samples/s; and `perf/gen_tokens_per_s`, the tokens the samplers
    generated for the step (dropped groups included) per second they spent generating them
    (per sampler: async steps are generated while others train)."""
    rows = metrics["batch/rows"]
    metrics["timing_s/step"] = step_s
    metrics["perf/throughput"] = metrics["batch/tokens"] / step_s
    metrics["perf/samples_per_s"] = rows / step_s
    sampler_s = max(metrics["control/sampler_gen_s"], 1e-9)
    metrics["perf/gen_tokens_per_s"] = metrics["control/gen_tokens"] / sampler_s


def add_idle_metrics(history: list[dict[str, float]], events: list, n_devices: int) -> None:
    """Per step, `perf/idle_frac/dev{i}` and their mean `perf/idle_frac` from the phase events
    inside the step's window (moves count as idle; so do devices that wait while the policy
    ranks evaluate, which happens inside the window of the step it follows, and of step 1 for
    the evaluation before training)."""
    from yatt.control.timeline import Span, idle_fractions

    spans = [Span(*event) for event in events if event[2] != "move"]
    start_s = min((s.start_s for s in spans), default=0.0)
    for row in history:
        end_s = row["control/step_end_s"]
        if end_s > start_s:
            idle = idle_fractions(spans, n_devices, (start_s, end_s))
            row.update({f"perf/idle_frac/dev{d}": f for d, f in enumerate(idle)})
            row["perf/idle_frac"] = sum(idle) / n_devices
        start_s = end_s


def evaluate_ranks(ranks: Any, n_examples: int, step: int) -> dict[str, float]:
    """Held-out accuracy of the policy on the first `n_examples` problems, each policy rank
    scoring its share with its own weights (no process gathers the problems or completions):
    `eval/accuracy`, `eval/problems` (how many were scored) and `timing_s/eval`.

    Raises ConfigError when there is no held-out problem to score."""
    start_s = time.perf_counter()
    shares = ranks.call_all("evaluate", n_examples)
    correct, count = sum(share[0] for share in shares), sum(share[1] for share in shares)
    eval_s = time.perf_counter() - start_s
    if not count:
        raise ConfigError(f"eval.n={n_examples}: the held-out set is empty, nothing to evaluate")
    accuracy = correct / count
    logger.info("step %d: held-out accuracy %.1f%% on %d (%.1f s)", step, 100 * accuracy, count,
                eval_s)  # fmt: skip
    return {"eval/accuracy": accuracy, "eval/problems": count, "timing_s/eval": eval_s}


def start_eval(config: Config, ranks: Any, total: int, progress: Any, result: RunResult) -> None:
    """`eval.at_start`: score the initial policy; the row goes to `progress` as step 0."""
    if not (config.eval.at_start and config.eval.n > 0):
        return
    row = evaluate_ranks(ranks, config.eval.n, 0)
    result.evals.append((0, row["eval/accuracy"]))
    if progress is not None:
        progress(0, total, row)


def step_eval(config: Config, ranks: Any, metrics: dict[str, float], step: int, total: int,
              out_of_time: bool, result: RunResult) -> None:  # fmt: skip
    """The periodic or final evaluation due after step `step` (1-based), into its metrics."""
    from yatt.evaluate import examples_due

    n_examples = examples_due(config.eval, step, total, out_of_time)
    if n_examples:  # as the trainer's rows (the seconds are logged, not kept)
        row = evaluate_ranks(ranks, n_examples, step)
        metrics |= {k: v for k, v in row.items() if k != "timing_s/eval"}
        result.evals.append((step, metrics["eval/accuracy"]))


@contextlib.contextmanager
def closing_on_error(cluster: Cluster, owned: bool) -> Iterator[None]:
    """A controller's set-up after its cluster started: on an error the cluster's workers
    are shut down when the controller started them (`owned`): no caller holds it yet."""
    try:
        yield
    except BaseException:
        if owned:
            cluster.shutdown()
        raise


class Controller(ABC):
    """Runs RL steps on a Cluster; `fit` returns the run's metrics and observability data.

    `checkpoint_dir`: the run folder periodic checkpoints (`checkpoint.every`) go to
    (`<checkpoint_dir>/checkpoints/step_<n>`, the trainer's layout); None writes none.
    """

    mode = "controller"
    checkpoint_dir: Path | None = None

    def __init__(self, config: Config, control: ControlConfig, cluster: Cluster) -> None:
        self.config, self.control, self.cluster = config, control, cluster

    @abstractmethod
    def step(self, step: int) -> dict[str, float]:
        """One RL step over the global batch; returns the step's reduced metrics."""

    @abstractmethod
    def queue_states(self) -> list[QueueState]:
        """Every data-parallel group's data position (rank order), steps in flight running."""

    @abstractmethod
    def resume_queues(self, draws: int, shares: list[list[int]], step: int) -> None:
        """Resume at `step`: group r samples `shares[r]` first, then global draws from `draws`."""

    def fit(self, steps: int | None = None, progress: Any = None, start_step: int = 0
            ) -> RunResult:  # fmt: skip
        """Run steps `start_step` .. `steps` (default `train.steps`), evaluating on held-out
        problems as `eval.*` asks (at start, every `eval.every` steps, at the end), and saving
        checkpoints every `checkpoint.every` steps into `checkpoint_dir`, as the single-process
        trainer does; `progress(step, total, metrics)` gets each step's row (and step 0's
        evaluation row). `start_step` > 0 continues a run `restore` resumed. Runtime
        re-placement runs this loop too (`_before_step`, `_after_step`, `_collect`)."""
        check_eval_data(self.config)
        total = steps or self.config.train.steps
        result = RunResult(history=[])
        start_s = time.perf_counter()
        if start_step == 0:
            start_eval(self.config, self.cluster.ranks, total, progress, result)
        for step in range(start_step, total):
            self._before_step(step, total, result)
            step_start_s = time.perf_counter()
            metrics = self.step(step)
            add_perf_metrics(metrics, time.perf_counter() - step_start_s)
            self._after_step(step, start_step, metrics)
            out_of_time = time_limit_reached(self.config.train.time_limit_s, start_s, step + 1,
                                             total)  # fmt: skip
            failed: Exception | None = None
            try:
                step_eval(self.config, self.cluster.ranks, metrics, step + 1, total,
                          out_of_time, result)  # fmt: skip
            except Exception as error:  # (a reward's bug on one completion ...)
                failed = error  # the step trained: its row and checkpoint stand, as the
                # single-process trainer keeps them
            metrics["control/bytes_moved"] = float(self.bytes_moved())
            metrics["control/step_end_s"] = time.time()
            result.history.append(metrics)
            if progress is not None:
                progress(step + 1, total, metrics)
            try:
                self.maybe_checkpoint(step + 1, out_of_time)
            finally:
                if failed is not None:  # the evaluation's error, whatever the checkpoint did
                    raise failed
            if out_of_time:
                break  # steps generated ahead are dropped
        result.wall_s = time.perf_counter() - start_s
        self._collect(result)
        result.driver_peak_rss_mb = peak_rss_mb()
        result.bytes_moved = self.bytes_moved()
        add_idle_metrics(result.history, result.events, len(self.cluster.devices))
        return result

    def _before_step(self, step: int, total: int, result: RunResult) -> None:
        """Before each step of `fit` (runtime re-placement decides and moves here)."""
        del step, total, result  # nothing to do for a fixed placement

    def _after_step(self, step: int, start_step: int, metrics: dict[str, float]) -> None:
        """After each step of `fit`, before its evaluation and checkpoint (runtime
        re-placement feeds its planner the step's costs here)."""
        del step, start_step, metrics

    def _collect(self, result: RunResult) -> None:
        """At the end of `fit`: each worker's stats and every phase event into `result`."""
        handles = self.cluster.all_handles()
        for handle, stats in zip(handles, [h.submit("stats") for h in handles]):
            result.workers[handle.name] = stats.result()
        for handle in handles:
            result.events.extend(handle.call("drain_events"))

    def maybe_checkpoint(self, done: int, out_of_time: bool = False) -> Path | None:
        """The checkpoint of `done` steps (with `checkpoint_dir` set) when the trainer's rule
        (`checkpoint_due`) has one there: `checkpoint.every` divides it, or it is the last step
        with `checkpoint.at_end`, or `train.time_limit_s` stops the run there with either set.
        So a rerun with `checkpoint.resume=auto` finds a finished run complete, and a stopped
        one goes on. (`fit_distributed` also writes the final policy to `model/`.)"""
        if self.checkpoint_dir is None or not checkpoint_due(self.config, done, out_of_time):
            return None
        return self.save_checkpoint(self.checkpoint_dir, done)

    def save_checkpoint(self, run_dir: Path, done: int) -> Path:
        """Write the checkpoint of `done` steps into `run_dir` (yatt.checkpoint's layout): the
        policy rank 0 holds (every rank holds the same) and every group's data position. Steps
        in flight (async) keep running; a resume samples their prompts again."""
        state = {"queues": [[draws, list(pending)] for draws, pending in self.queue_states()]}
        handle = self.cluster.ranks.handles[0]
        folder = Path(handle.call("save_checkpoint", str(run_dir), done, state))
        if self.control.backend != "inprocess":  # (else the rank logged it in this process)
            logger.info("saved checkpoint %s", folder)  # a Ray rank's line stays in its worker
        return folder

    def restore(self, checkpoint: Path, state: dict[str, Any]) -> int:
        """Take on a checkpoint of the controllers (`state`: its `load_control_state`): every
        worker loads its weights (policy ranks their optimizer and schedule) from the folder,
        and each group's queue starts with the prompts that were still due; returns the step
        to continue from (`fit(start_step=...)`). The group count may differ from the run that
        wrote it: old group g's prompts go to new group g mod n (`deal_prompts`)."""
        step = int(state["step"])
        restoring = [h.submit("restore", str(checkpoint), step) for h in self.cluster.all_handles()]
        try:
            gather(restoring)
        except Exception as exc:  # a state from another model, or edited by hand
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise ConfigError(
                f"checkpoint.resume={checkpoint}: its state does not fit this run: {detail}"
            ) from exc
        # The draws' order as the checkpoint recorded it (fit_distributed checked it is this
        # config's: check_resume_fits).
        states = [(draws, pending) for draws, pending in state["queues"]]
        draws, due = prompts_due(states, state["n_prompts"], state["order_seed"],
                                 state["prompts_per_step"])  # fmt: skip
        self.resume_queues(draws, deal_prompts(due, len(self.cluster.ranks)), step)
        logger.info("resumed from %s at step %d", checkpoint, step)
        return step

    def close(self) -> None:
        """Release the workers."""
        self.cluster.shutdown()

    def bytes_moved(self) -> int:
        """Bytes the driver process sent to or received from workers so far (the processes of
        the cluster and its spares: under re-placement on CPU cores a process may be parked,
        or be handed a new role, and keeps its count; a GPU process a move releases takes its
        count along)."""
        return sum(h.bytes_moved for h in self.cluster.all_handles() + self.cluster.spares)

    def save_policy(self, folder: Path) -> Path:
        """Rank 0 writes the trained policy (with the tokenizer) into `folder`."""
        return Path(self.cluster.ranks.handles[0].call("save_policy", str(folder)))

    def weights(self) -> dict:
        """The policy weights of rank 0 (all ranks hold the same after each update)."""
        return self.cluster.ranks.handles[0].call("weights")
