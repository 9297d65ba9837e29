"""Integration: GRPO steps on a tiny random-init model with Ray on 2 CPU "devices", in both
controller modes and every placement; the modes must produce identical weights and metrics.
One Ray session per module; each placement's workers are spawned once and reset between modes."""

import dataclasses

import pytest
import torch

from yatt.config import load_config
from yatt.control.cluster import build_cluster
from yatt.control.config import ControlConfig
from yatt.control.parallel import ParallelController, ParallelRank
from yatt.control.single import SingleController
from yatt.control.workers import init_ray

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ray = pytest.importorskip("ray")

OVERRIDES = [
    "train.steps=2",
    "algo.prompts_per_step=2",
    "rollout.n_samples=4",
    "optim.lr=1e-3",
    # Adam divides by sqrt(v) + eps: with the default 1e-8 a gradient that is zero up to
    # rounding (summed in another order by a data-parallel split, or by another CPU's
    # kernels) becomes a full +-lr step; 1e-4 keeps such noise far below the tolerance.
    "optim.eps=1e-4",
    "rollout.max_new_tokens=6",
    "data.n_train=16",
    "data.n_heldout=0",
    "eval.n=0",
]
REWARD = ("yatt.control.workload:char_mix_reward",)


@pytest.fixture(scope="module")
def ray_session():
    init_ray(2)
    yield
    ray.shutdown()


def test_cpu_workers_keep_the_memory_a_step_frees(ray_session):
    """Ray's processes start with the malloc settings that keep freed memory for reuse; the
    driver's own environment is left as it was (its later children do not inherit them)."""
    import os

    from yatt.control.workers import CPU_WORKER_MALLOC

    @ray.remote(num_cpus=0)
    def malloc_settings() -> dict:
        return {key: os.environ.get(key) for key in CPU_WORKER_MALLOC}

    assert ray.get(malloc_settings.remote()) == CPU_WORKER_MALLOC
    assert not set(CPU_WORKER_MALLOC) & set(os.environ)


def test_ray_leaves_this_process_its_sigterm_handler(ray_session):
    """ray.init installs its own SIGTERM handler (a sys.exit; its core worker's crash report
    printed a stack and aborted): init_ray puts back the process's own, so `yatt train` on
    Ray stops on SIGTERM as on Ctrl-C, with its one line and resume hint."""
    import signal

    handler = signal.getsignal(signal.SIGTERM)
    assert not getattr(handler, "__module__", "").startswith("ray"), handler


def test_a_worker_that_cannot_set_up_says_why(ray_session):
    """Its construction error reaches the caller as one line naming the worker, not "died:
    its process exited" with the reason only in Ray's worker log."""
    from yatt.control.devices import discover_devices
    from yatt.control.workers import RayBackend
    from yatt.errors import WorkerError

    class _BadSetup:  # (local: pickled whole, the workers cannot import this test module)
        """Its construction refuses its input, as a rank does a prompt too long for the
        model."""

        def __init__(self, length: int) -> None:
            from yatt.errors import ConfigError

            raise ConfigError(f"a prompt of {length} tokens does not fit the model")

        def ping(self) -> str:
            return "pong"

    devices = discover_devices("cpu", 1)
    backend = RayBackend(devices)
    try:
        handle = backend.spawn(_BadSetup, devices[0], "rank0", 99999)
        with pytest.raises(WorkerError, match=r"^rank0: a prompt of 99999 tokens does not fit"):
            handle.call("ping")
    finally:
        backend.shutdown()


_GCS_KILLED = """
import os, signal, sys
import ray
from yatt.control.devices import discover_devices
from yatt.control.workers import RayBackend
devices = discover_devices("cpu", 1)
backend = RayBackend(devices)
handle = backend.spawn(dict, devices[0], "rank0")


def kill_gcs():
    # as a signal to the whole process group takes Ray's control store (GCS) with this process
    gcs = ray._private.worker._global_node.all_processes["gcs_server"][0].process
    os.kill(gcs.pid, signal.SIGKILL)
    gcs.wait()


if sys.argv[1] == "before":
    kill_gcs()
else:  # the signal comes while it releases: its first call meets a dead GCS
    kill = ray.kill
    ray.kill = lambda actor: (kill_gcs(), kill(actor))
if sys.argv[1] == "move":  # one worker released, as a re-placement does
    backend.release(handle)
else:
    backend.shutdown()
print("released", flush=True)
"""


@pytest.mark.parametrize("when", ["before", "during", "move"])
def test_a_backend_whose_ray_died_with_it_shuts_down(when):
    """Ray's own processes killed with the driver (a SIGTERM to the process group), before
    shutdown, while it releases, or while a move releases one worker: it leaves the release
    rather than wait on the dead GCS, which made Ray end the process after 60 s. (Its own
    process: this one's Ray session stays whole.)"""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _GCS_KILLED, when], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0 and "released" in done.stdout, done.stderr[-2000:]


# A final held-out eval (each policy rank scores its share of the problems), judged by a user's
# function by import path: length parity, on which a random tiny model gets a mix of 0 and 1.
EVAL = ["data.n_heldout=6", "eval.n=6", "eval.at_start=false", "eval.at_end=true",
        "eval.reward_fn=yatt.control.workload:parity_reward"]  # fmt: skip


def _run_both(placement: str, payload_bytes: int = 0, **changes):
    base = [o for o in OVERRIDES if not o.startswith(("data.n_heldout", "eval."))]
    config = load_config("tiny_test", [*base, *EVAL])
    control = ControlConfig(
        mode="single",
        backend="ray",
        placement=placement,
        n_devices=2,
        device_kind="cpu",
        payload_bytes=payload_bytes,
        extra_rewards=REWARD,
        **changes,
    )
    cluster = build_cluster(config, control, ParallelRank)
    try:
        single = SingleController(config, control, cluster)
        single_run, single_weights = single.fit(), single.weights()
        single_bytes = single_run.history[-1]["control/bytes_moved"]
        # the same processes as parallel controllers: their reward roles now score (a single
        # controller's workers build none: it scores on the driver)
        control = dataclasses.replace(control, mode="parallel")
        cluster.reset(config, control)
        parallel = ParallelController(config, control, cluster)
        parallel_bytes_before = parallel.bytes_moved()
        parallel_run, parallel_weights = parallel.fit(), parallel.weights()
        parallel_bytes = parallel_run.history[-1]["control/bytes_moved"] - parallel_bytes_before
    finally:
        cluster.shutdown()
    return (single_run, single_weights, single_bytes), (parallel_run, parallel_weights,
                                                         parallel_bytes)  # fmt: skip


def _assert_same(single, parallel):
    (single_run, single_weights, _), (parallel_run, parallel_weights, _) = single, parallel
    for key in single_weights:
        assert torch.equal(single_weights[key], parallel_weights[key]), key
    for s_row, p_row in zip(single_run.history, parallel_run.history):
        for key in ("critic/score/mean", "critic/score/max", "critic/score/min",
                    "critic/rewards/mean", "response_length/mean", "actor/grad_norm",
                    "actor/pg_loss", "batch/rows"):  # fmt: skip
            assert s_row[key] == pytest.approx(p_row[key], rel=1e-6, abs=1e-9), key
    assert single_run.history[0]["actor/grad_norm"] > 0  # the updates did something
    assert [step for step, _ in single_run.evals] == [len(single_run.history)]
    assert single_run.evals == parallel_run.evals  # same weights, same problems: same score


@pytest.mark.parametrize("placement", ["colocate", "disaggregated", "partial"])
def test_single_and_parallel_controllers_agree(ray_session, placement):
    payload = 4096 if placement == "colocate" else 0
    # the disaggregated run is async (k = 1) and over-dispatches: one group per sampler call,
    # waited for in completion order, the surplus cancelled (ray.cancel) and reclaimed
    changes = {"async_staleness": 1, "over_dispatch": 1.0} if placement == "disaggregated" else {}
    single, parallel = _run_both(placement, payload, **changes)
    _assert_same(single, parallel)
    if changes:
        assert [row["control/staleness"] for row in parallel[0].history] == [0.0, 1.0]
        assert all(row["control/aborted_groups"] == 2 for row in parallel[0].history)
    run = parallel[0]
    assert {"timing_s/gen", "timing_s/update_actor", "timing_s/update_weights"} <= set(
        run.history[-1]
    )
    assert {e[0] for e in run.events} == {0, 1}  # both devices did work
    assert all(w["peak_rss_mb"] > 0 for w in run.workers.values())
    if placement == "colocate":  # the single driver carries every sample's features both ways
        assert single[2] > 2 * 2 * 8 * payload > parallel[2]


_INPROCESS: dict[str, tuple[dict, list]] = {}  # config -> its in-process run (several tests')


def _inprocess_weights(config, history: list | None = None) -> dict:
    """The same run as one in-process worker (one data-parallel group: no collectives); its
    metric rows go to `history`. Run once per config (the runs are deterministic)."""
    key = repr(config)
    if key not in _INPROCESS:
        control = ControlConfig(mode="parallel", backend="inprocess", placement="colocate",
                                n_devices=1, device_kind="cpu", extra_rewards=REWARD)  # fmt: skip
        controller = ParallelController(config, control)
        run = controller.fit()
        _INPROCESS[key] = controller.weights(), run.history
    weights, rows = _INPROCESS[key]
    if history is not None:
        history.extend(rows)
    return weights


def _assert_close(weights, reference):
    for key in reference:
        assert torch.allclose(weights[key], reference[key], rtol=1e-4, atol=1e-6), key


def test_data_parallel_update_equals_the_full_batch_update(ray_session):
    """Two ranks, each with half the batch, all-reducing gradients and the loss normaliser,
    train the same weights as one process with the whole batch (up to summation order)."""
    # two passes: clip metrics that differ from 0, and a KL term: every kind of update metric
    config = load_config("tiny_test", [*OVERRIDES, "algo.ppo_passes=2", "algo.kl_coef=0.05"])
    control = ControlConfig(mode="parallel", backend="ray", placement="colocate", n_devices=2,
                            device_kind="cpu", extra_rewards=REWARD)  # fmt: skip
    controller = ParallelController(config, control)
    try:
        run = controller.fit()
        weights = controller.weights()
    finally:
        controller.cluster.shutdown()
    assert run.workers["rank0"]["allreduce_s"] > 0
    whole_history: list = []
    _assert_close(weights, _inprocess_weights(config, whole_history))
    # the global batch's update metrics, not the mean of the ranks' shares: losses sum, token
    # means weigh by tokens (each rank's loss is divided by the global normaliser)
    for row, whole in zip(run.history, whole_history, strict=True):
        for key in ("actor/pg_loss", "actor/clipfrac", "actor/ppo_kl", "actor/kl",
                    "actor/grad_norm", "actor/trained_rows_frac"):  # fmt: skip
            assert row[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-7), key


def _script_moves(monkeypatch, targets: dict) -> None:
    """Replace the planner's decisions: move to `targets[step]` before each step listed."""
    from yatt.control.replacement import Decision, Replanner

    def decide(self, step, current, steps_left):
        if step not in targets:
            return None
        target = targets[step]
        return Decision(step, current.label(), target.label(), True, 1.0, 0.5, 0.0, "scripted")

    monkeypatch.setattr(Replanner, "decide", decide)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_runtime_replacement_moves_and_continues_the_run(ray_session, monkeypatch, lora):
    """Moves colocate(2) -> partial(1/2) -> colocate(2) before steps 1 and 2 hand over weights,
    optimizer state and the prompt order in the same worker processes (re-roled, not
    respawned): every plan samples synchronously, so the run equals an unmoved one. With LoRA
    adapters the moves and weight pushes carry the adapters alone, and a KL term works: the
    reference is the base model, with the adapters off, on whichever ranks train."""
    from yatt.control.adaptive import AdaptiveController
    from yatt.control.placement import make_placement

    adapters = ["model.lora_rank=4", "optim.lr=1e-2", "algo.kl_coef=0.1"] if lora else []
    config = load_config("tiny_test", [*OVERRIDES, "train.steps=3", *adapters])
    control = ControlConfig(mode="parallel", backend="ray", placement="colocate", n_devices=2,
                            device_kind="cpu", extra_rewards=REWARD, replace_every=1)  # fmt: skip
    targets = {1: make_placement("partial", 2, 1), 2: make_placement("colocate", 2)}
    _script_moves(monkeypatch, targets)
    controller = AdaptiveController(config, control, decode_step_s=0.001)
    # one rank per core, as on GPUs: the decode floor does not divide, an update's rows do
    assert controller.parallel == {"gen_parallel": 0.0, "train_parallel": 1.0}
    first_actors = {h.actor for h in controller.cluster.all_handles()}
    try:
        run = controller.fit()
        weights = controller.cluster.ranks.handles[0].call("weights")
        last_actors = {h.actor for h in controller.cluster.all_handles()}
    finally:
        controller.close()
    assert [h["control/move_s"] > 0 for h in run.history] == [False, True, True]
    # control.json's record of them: the logged step each came before, from, to, why
    assert run.decisions == [
        {"step": 2, "from": "colocate(2)", "to": targets[1].label(), "switch": True,
         "reason": "scripted"},
        {"step": 3, "from": targets[1].label(), "to": "colocate(2)", "switch": True,
         "reason": "scripted"},
    ]  # fmt: skip
    assert controller.plan.kind == "colocate" and last_actors == first_actors
    assert sum(e[2] == "move" for e in run.events) == 2 * 2  # two moves, on both devices
    # a colocated start never pushes weights: the planner's push cost is one timed export
    assert controller.sync_s > 0 and controller.replanner.costs.sync_s == controller.sync_s
    assert all(key.endswith(("lora_a", "lora_b")) for key in weights) == lora
    if lora:  # the policy moved away from its base, which the reference still is
        assert all(row["actor/kl"] > 0 for row in run.history[1:])
    _assert_close(weights, _inprocess_weights(config))


def test_threads_mapping_moves_between_plans(ray_session, monkeypatch, caplog):
    """cpu_mapping="threads": colocate(2) is one worker pinned to both cores (2 threads, no
    all-reduce) beside a parked spare process; a move to disaggregated(1/2) re-pins the policy
    worker to one core (keeping its optimizer state) and makes the spare the sampler, a move
    back re-pins it to both cores. Synchronous plans, so the run equals the unmoved one.
    Before the run the worker timed a decode step and an update's passes on one core and on
    both for the planner's Amdahl fractions (the probes leave the policy as it was: the
    weights still match)."""
    import logging

    caplog.set_level(logging.INFO, logger="yatt.control.adaptive")
    from yatt.control.adaptive import AdaptiveController
    from yatt.control.placement import make_placement

    config = load_config("tiny_test", [*OVERRIDES, "train.steps=3"])
    control = ControlConfig(mode="parallel", backend="ray", placement="colocate", n_devices=2,
                            device_kind="cpu", extra_rewards=REWARD, replace_every=1,
                            cpu_mapping="threads")  # fmt: skip
    targets = {1: make_placement("disaggregated", 2, 1), 2: make_placement("colocate", 2)}
    _script_moves(monkeypatch, targets)
    controller = AdaptiveController(config, control, decode_step_s=0.001)
    assert [h.device.name for h in controller.cluster.all_handles()] == ["cpu:0-1"]
    assert controller.decode_step_s == 0.001  # given: kept
    # the fractions are the measured ones the log names (not data-parallel ranks' 0 and 1)
    measured = [r.getMessage() for r in caplog.records if "Amdahl fraction" in r.getMessage()]
    assert len(measured) == 2 and "with 2 threads" in measured[1], measured
    for message, key in zip(measured, ("gen_parallel", "train_parallel"), strict=True):
        assert message.endswith(f"Amdahl fraction {controller.parallel[key]:.2f}"), message
    processes = {h.actor for h in controller.cluster.all_handles() + controller.cluster.spares}
    assert len(processes) == 2  # the worker and a parked spare: a move starts no process
    try:
        run = controller.fit()
        weights = controller.cluster.ranks.handles[0].call("weights")
        devices = [h.device.name for h in controller.cluster.all_handles()]
        last = {h.actor for h in controller.cluster.all_handles() + controller.cluster.spares}
    finally:
        controller.close()
    assert devices == ["cpu:0-1"] and last == processes
    assert run.workers["colocate(2)/rank0"]["allreduce_s"] == 0
    # the driver's traffic counts as the other controllers count it (re-placement recorded 0),
    # spares included: it never drops when a move parks a process
    moved = [row["control/bytes_moved"] for row in run.history]
    assert moved == sorted(moved) and run.bytes_moved >= moved[-1] > 0
    updates = [e for e in run.events if e[2] == "update_actor"]
    assert sorted(e[0] for e in updates) == [0, 0, 1, 1, 1]  # steps 0 and 2 on both cores, 1 on 1
    assert [h["control/move_s"] > 0 for h in run.history] == [False, True, True]
    _assert_close(weights, _inprocess_weights(config))


def test_two_ranks_resume_from_a_checkpoint_as_the_run_went_on(ray_session, tmp_path, caplog):
    """Two data-parallel policy ranks write a checkpoint at step 2 (rank 0's weights, optimizer
    and schedule, and both groups' data positions); the same workers, reset to the initial
    model, restore it and finish step 3 with the uninterrupted run's weights. The driver's log
    names the checkpoint (the rank's own line stays in its worker)."""
    import logging

    from yatt.checkpoint import load_control_state

    config = load_config("tiny_test", [*OVERRIDES, "train.steps=3", "checkpoint.every=2"])
    control = ControlConfig(mode="parallel", backend="ray", placement="colocate", n_devices=2,
                            device_kind="cpu", extra_rewards=REWARD)  # fmt: skip
    controller = ParallelController(config, control)
    controller.checkpoint_dir = tmp_path
    try:
        with caplog.at_level(logging.INFO, logger="yatt.control.controller"):
            controller.fit()
        saved = [r.getMessage() for r in caplog.records if r.name == "yatt.control.controller"]
        assert saved == [f"saved checkpoint {tmp_path / 'checkpoints' / 'step_000002'}"]
        whole = controller.weights()
        controller.cluster.reset(config, control)  # back to the initial model, same processes
        resumed = ParallelController(config, control, controller.cluster)
        checkpoint = tmp_path / "checkpoints" / "step_000002"
        state = load_control_state(checkpoint)
        assert len(state["queues"]) == 2  # one data position per group
        assert resumed.restore(checkpoint, state) == 2
        run = resumed.fit(start_step=2)
        weights = resumed.weights()
    finally:
        controller.close()
    assert len(run.history) == 1
    assert all(torch.equal(whole[k], weights[k]) for k in whole)
