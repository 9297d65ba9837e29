"""Pure-logic tests of yatt.control: devices, placements, shards, workers (in-process), the cost
model and its decisions, the simulator and timelines. No Ray, no models."""

import os

import pytest
import torch

from yatt.control.async_rollout import ShardQueue
from yatt.control.cluster import _reusable, role_devices
from yatt.control.config import ControlConfig
from yatt.control.devices import Device, discover_devices, widen
from yatt.control.placement import PLACEMENTS, candidate_placements, make_placement
from yatt.control.replacement import (
    PhaseCosts,
    Replanner,
    amdahl_fraction,
    costs_from_spans,
    predict_step_s,
    speedup,
)
from yatt.control.shards import make_features
from yatt.control.sim import Task, best_static, project_costs, run_tasks, simulate
from yatt.control.timeline import Span, idle_fractions, plot_timeline, spans_from_events
from yatt.control.workers import InProcessBackend, WorkerGroup, make_backend, payload_nbytes
from yatt.errors import ConfigError
from yatt.rewards import load_callable


def test_cpu_devices_are_cores():
    devices = discover_devices("cpu")
    assert devices and devices[0] == Device("cpu", 0)
    assert devices[0].ray_bundle() == {"CPU": 1.0}
    assert Device("cuda", 1).ray_bundle() == {"CPU": 1.0, "GPU": 1.0}
    with pytest.raises(ConfigError, match="tpu"):
        discover_devices("tpu")
    with pytest.raises(ConfigError, match="999"):
        discover_devices("cpu", 999)


@pytest.mark.parametrize("n_devices", [2, 3, 8])
def test_placement_plans_cover_roles(n_devices):
    colocate = make_placement("colocate", n_devices)
    assert all(d == tuple(range(n_devices)) for d in colocate.devices.values())
    split = make_placement("disaggregated", n_devices, 1)
    assert set(split.devices["sampler"]).isdisjoint(split.devices["policy"])
    assert set(split.devices["sampler"]) | set(split.devices["policy"]) == set(range(n_devices))
    partial = make_placement("partial", n_devices, 1)
    assert partial.devices["policy"] == tuple(range(n_devices))
    assert set(partial.devices["sampler"]).isdisjoint(partial.devices["reward"])
    assert len(candidate_placements(n_devices)) == 1 + 2 * (n_devices - 1)


def test_placement_errors_name_the_setting_and_value():
    with pytest.raises(ConfigError, match=r"control\.placement='spread'"):
        make_placement("spread", 2)
    with pytest.raises(ConfigError, match=r"control\.n_sampler=2"):
        make_placement("disaggregated", 2, 2)
    with pytest.raises(ConfigError, match=r"control\.placement=partial .* control\.n_devices=1"):
        make_placement("partial", 1)
    assert set(PLACEMENTS) == {"colocate", "disaggregated", "partial"}


def test_control_config_validation():
    with pytest.raises(ConfigError, match=r"control\.mode"):
        ControlConfig(mode="central")
    with pytest.raises(ConfigError, match=r"control\.async_staleness"):
        ControlConfig(async_staleness=99)
    with pytest.raises(ConfigError, match=r"control\.over_dispatch"):
        ControlConfig(over_dispatch=-0.5)
    with pytest.raises(ConfigError, match="nope:fn"):
        load_callable("nope:fn")
    assert load_callable("yatt.control.workload:char_mix_reward")("", "aab") == pytest.approx(2 / 3)


def test_shard_queues_partition_each_draw_and_reclaim_at_the_front():
    queues = [ShardQueue(100, seed=5, prompts_per_step=8, world=4, rank=r) for r in range(4)]
    whole = ShardQueue(100, seed=5, prompts_per_step=8, world=1, rank=0).take(16)
    slices = [q.take(4) for q in queues]  # two draws: each rank's slice of both
    assert sorted(p for s in slices for p in s) == sorted(whole)
    assert [s[:2] for s in slices] == [whole[2 * r : 2 * r + 2] for r in range(4)]
    queues[0].reclaim([7, 8])
    assert queues[0].take(3)[:2] == [7, 8]
    with pytest.raises(ConfigError, match="prompts_per_step=8"):
        ShardQueue(100, 5, 8, 3, 0)
    features = make_features((1, 2), 16)
    assert features.shape == (2, 16) and int(features[1, 0]) == 2


class _Setup:
    def __init__(self, ok: bool) -> None:
        if not ok:
            raise ConfigError("data row 3: no 'answer' field")
        self.value = 7

    def get(self, plus: int = 0) -> int:
        return self.value + plus

    @staticmethod
    def name() -> str:
        return "setup"


def test_an_init_guarded_worker_raises_its_setup_error_at_each_call():
    # (what a Ray actor's caller then sees, as a WorkerError naming the worker: raised from
    # __init__ itself, the error would end the actor's process and say only that it died)
    from yatt.control.workers import init_guarded

    guarded = init_guarded(_Setup)
    assert guarded is init_guarded(_Setup) and guarded.__name__ == "_Setup"
    assert guarded(True).get(plus=1) == 8 and guarded.name() == "setup"
    broken = guarded(False)
    for _ in range(2):
        with pytest.raises(ConfigError, match="data row 3: no 'answer' field"):
            broken.get()


def test_payload_nbytes_counts_tensors_and_texts():
    value = {"a": torch.zeros(4, 8, dtype=torch.float32), "b": ["xy", "z"]}
    assert payload_nbytes(value) == 1 + 128 + 1 + 3


class _Echo:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def add(self, value: int) -> int:
        return value + self.offset

    def fail(self) -> None:
        raise ValueError("bad value 7")


def test_inprocess_worker_group_calls_and_errors():
    backend = make_backend("inprocess", discover_devices("cpu", 1))
    assert isinstance(backend, InProcessBackend)
    device = Device("cpu", 0)
    group = WorkerGroup("echo", [backend.spawn(_Echo, device, f"e{i}", i) for i in range(3)])
    assert group.call_all("add", 10) == [10, 11, 12]
    assert group.call_each("add", [(1,), (2,), (3,)]) == [1, 3, 5]
    future = group.handles[0].submit("fail")
    with pytest.raises(ValueError, match="bad value 7"):
        future.result()
    with pytest.raises(ConfigError, match="'mpi'"):
        make_backend("mpi", [device])


def test_cost_model_prefers_colocation_for_short_and_overlap_for_long_responses():
    short = PhaseCosts(gen_s=2.0, reward_s=0.5, train_s=3.0, gen_floor_s=0.05, swap_s=0.01)
    long = PhaseCosts(gen_s=2.0, reward_s=0.5, train_s=3.0, gen_floor_s=3.0, swap_s=0.01)
    plans = candidate_placements(4)
    best_short = min(plans, key=lambda p: predict_step_s(short, p))
    best_long = min(plans, key=lambda p: predict_step_s(long, p))
    assert best_short.kind == "colocate"
    assert best_long.kind != "colocate"
    assert predict_step_s(short, make_placement("colocate", 4)) == pytest.approx(
        0.05 + 5.5 / 4 + 0.02
    )


def test_replanner_moves_only_when_the_gain_beats_the_move_cost():
    long = PhaseCosts(gen_s=2.0, reward_s=0.5, train_s=3.0, gen_floor_s=3.0)
    colocate = make_placement("colocate", 4)
    planner = Replanner(4, every_steps=5, move_cost_s=1000.0)
    planner.observe(long)
    assert planner.decide(3, colocate, 100) is None  # not a decision step
    keep = planner.decide(5, colocate, 100)
    assert keep is not None and not keep.switch and "move cost" in keep.reason
    planner.move_cost_s = 1.0
    move = planner.decide(10, colocate, 100)
    assert move.switch and move.predicted_best_s < move.predicted_current_s
    assert planner.plan_for(move).kind != "colocate"
    assert len(planner.decisions) == 2


def test_run_tasks_respects_dependencies_and_devices():
    spans, done = run_tasks([
        Task("a", "gen", (0,), 2.0), Task("b", "train", (1,), 1.0),
        Task("c", "train", (0, 1), 1.0, ("a",)), Task("d", "gen", (1,), 0.5),
    ])  # fmt: skip
    assert done == {"a": 2.0, "b": 1.0, "c": 3.0, "d": 3.5}
    assert idle_fractions(spans, 2) == pytest.approx([1 - 3 / 3.5, 1 - 2.5 / 3.5])


def test_simulator_matches_the_cost_model_in_steady_state():
    costs = [PhaseCosts(2.0, 0.5, 3.0, sync_s=0.1, swap_s=0.01, gen_floor_s=1.0)] * 12
    for plan in candidate_placements(3):
        result = simulate(costs, plan)
        assert result.step_s[-1] == pytest.approx(predict_step_s(costs[0], plan), rel=1e-6)
        assert all(0.0 <= f <= 1.0 for f in result.idle)


def test_replanning_beats_every_static_plan_when_lengths_shift():
    costs = [PhaseCosts(2.0, 0.5, 3.0, sync_s=0.05, swap_s=0.01, gen_floor_s=0.02 + 0.12 * t)
             for t in range(40)]  # fmt: skip
    _, static = best_static(costs, candidate_placements(4))
    replanner = Replanner(4, every_steps=4, move_cost_s=0.5)
    adaptive = simulate(costs, make_placement("colocate", 4), replanner)
    assert any(d.switch for d in adaptive.decisions)
    assert adaptive.total_s < static.total_s
    assert len(set(adaptive.plans)) > 1


def test_projection_scales_work_and_sync():
    costs = PhaseCosts(2.0, 0.5, 3.0, gen_floor_s=1.0)
    projected, move_s = project_costs(costs, 2, 64, param_bytes=1e9)
    assert projected.gen_s == pytest.approx(64.0) and projected.gen_floor_s == 1.0
    assert projected.sync_s > 0 and move_s > projected.sync_s


def test_timeline_spans_and_plot(tmp_path):
    spans = spans_from_events([(0, "sampler", "gen", 10.0, 12.0), (1, "policy", "update_actor",
                                                                 11.0, 13.0)])  # fmt: skip
    assert spans[0].start_s == 0.0 and spans[1].end_s == 3.0
    assert idle_fractions(spans, 2) == pytest.approx([1 / 3, 1 / 3])
    assert idle_fractions([Span(0, "r", "gen", 0, 1), Span(0, "r", "x", 0.5, 2)], 1) == [0.0]
    path = plot_timeline(spans, 2, tmp_path / "t.png")
    assert path.stat().st_size > 1000
    assert costs_from_spans(spans, steps=2, gen_floor_s=0.5).gen_s == pytest.approx(0.75)


def test_replanner_trusts_measured_step_times_and_knows_async_overlap():
    costs = PhaseCosts(gen_s=1.0, reward_s=0.0, train_s=2.0, gen_floor_s=1.0)
    split = make_placement("disaggregated", 2, 1)
    colocate = make_placement("colocate", 2)
    # async: gen on 1 device overlaps train on the other (max); synchronous: they add up
    assert predict_step_s(costs, split) == pytest.approx(2.0)
    assert predict_step_s(costs, split, overlap=False) == pytest.approx(4.0)
    planner = Replanner(2, every_steps=2, move_cost_s=0.1, overlap=True)
    planner.observe(costs)
    assert planner.predict(colocate, 2) == pytest.approx(1.0 + 3.0 / 2)
    planner.observe_step(1, colocate, 4.0)  # measured: slower than the model thought
    planner.observe_step(2, colocate, 5.0)
    assert planner.predict(colocate, 2) == pytest.approx(4.5)
    # unmeasured plans: the model's guess times the measured plans' calibration (4.5 / 2.5)
    assert planner.predict(split, 2) == pytest.approx(2.0 * 4.5 / 2.5)
    decision = planner.decide(2, colocate, 10)
    assert decision.switch and decision.chosen == split.label()
    assert planner.predict(colocate, 9) == pytest.approx(2.5)  # stale measurement: model again


def test_replanner_weighs_the_steps_left_and_waits_for_a_measured_step_after_a_move():
    costs = PhaseCosts(gen_s=1.0, reward_s=0.0, train_s=2.0, gen_floor_s=1.0)
    colocate, split = make_placement("colocate", 2), make_placement("disaggregated", 2, 1)
    planner = Replanner(2, every_steps=1, move_cost_s=7.0)
    planner.observe(costs)
    planner.observe_step(0, colocate, 4.0)  # split: model 2.0 x calibration 4.0 / 2.5 = 3.2
    keep = planner.decide(1, colocate, 8)  # saves 0.8 s/step x 8 steps < 7 s
    assert not keep.switch and keep.chosen == colocate.label()
    planner.observe_step(1, colocate, 4.0)
    move = planner.decide(2, colocate, 9)  # 0.8 x 9 > 7
    assert move.switch and move.chosen == split.label() and "9 steps left" in move.reason
    assert planner.decide(3, split, 8) is None  # split has not run a measured step yet
    planner.observe_step(3, split, 2.5)
    assert planner.decide(4, split, 7) is not None


def test_replanner_acts_on_a_jump_in_the_response_budget_at_the_next_decision():
    short = PhaseCosts(gen_s=0.1, reward_s=0.0, train_s=2.0, gen_floor_s=0.1)
    long = PhaseCosts(gen_s=0.5, reward_s=0.0, train_s=3.0, gen_floor_s=3.0)
    colocate, split = make_placement("colocate", 2), make_placement("disaggregated", 2, 1)
    planner = Replanner(2, every_steps=1, move_cost_s=1.0)
    for step in range(5):
        planner.observe(short)
        planner.observe_step(step, colocate, 1.2 + 0.1 * (step % 2))  # noise is smoothed
        assert not planner.decide(step + 1, colocate, 20 - step).switch
    assert planner.predict(colocate, 5) == pytest.approx(1.25, abs=0.02)
    planner.observe(long)  # the first long step: no average with the short ones
    planner.observe_step(5, colocate, 5.0)
    assert planner.costs == long and planner.predict(colocate, 6) == 5.0
    move = planner.decide(6, colocate, 14)
    assert move.switch and move.chosen == split.label()
    # a slower step within the regime is still averaged
    planner.observe_step(6, colocate, 6.0)
    assert planner.predict(colocate, 7) == pytest.approx(5.5)


def test_replanner_compares_with_the_plan_a_move_left_and_forgets_it_across_a_jump():
    costs = PhaseCosts(gen_s=1.0, reward_s=0.0, train_s=2.0, gen_floor_s=1.0)
    colocate, split = make_placement("colocate", 2), make_placement("disaggregated", 2, 1)
    planner = Replanner(2, every_steps=2, move_cost_s=0.0)
    planner.observe(costs)
    planner.observe_step(1, colocate, 3.0)  # measured before the move at step 2
    planner.observe_step(2, split, 4.0)
    planner.observe_step(3, split, 4.0)
    # at the next decision (step 4) colocate's measurement is every_steps + 1 old: it still
    # counts, so the planner moves back on what it saw, not on the model's ratio alone
    assert planner.predict(colocate, 4) == 3.0
    back = planner.decide(4, split, 10)
    assert back.switch and back.chosen == colocate.label()
    planner.observe_step(4, split, 12.0)  # three times slower: the regime changed
    assert colocate.label() not in planner.measured  # measured in the old regime: forgotten
    assert planner.predict(split, 5) == 12.0


def test_partial_colocation_pays_two_swaps_per_step_as_colocate_does():
    costs = PhaseCosts(gen_s=1.0, reward_s=0.0, train_s=2.0, gen_floor_s=1.0, swap_s=0.5)
    no_swap = PhaseCosts(gen_s=1.0, reward_s=0.0, train_s=2.0, gen_floor_s=1.0)
    for plan in (make_placement("colocate", 4), make_placement("partial", 4, 1)):
        extra = predict_step_s(costs, plan) - predict_step_s(no_swap, plan)
        assert extra == pytest.approx(1.0), plan.label()
        steps = 4
        sim = simulate([costs] * steps, plan).total_s - simulate([no_swap] * steps, plan).total_s
        assert sim == pytest.approx(steps * 1.0), plan.label()


def test_threads_mapping_gives_each_role_one_multi_core_worker():
    wide = widen([Device("cpu", 2), Device("cpu", 3)])
    assert wide == Device("cpu", 2, 2) and wide.indices == (2, 3) and wide.name == "cpu:2-3"
    with pytest.raises(ConfigError, match="consecutive"):
        widen([Device("cpu", 0), Device("cpu", 2)])
    with pytest.raises(ConfigError, match=r"control\.cpu_mapping"):
        ControlConfig(cpu_mapping="mpi")
    cpus = [Device("cpu", i) for i in range(4)]
    partial = make_placement("partial", 4, 1)
    threads = role_devices(partial, cpus, "threads")
    assert threads == {"sampler": [Device("cpu", 0)], "reward": [Device("cpu", 1, 3)],
                       "policy": [Device("cpu", 0, 4)]}  # fmt: skip
    assert role_devices(partial, cpus, "ranks")["policy"] == cpus  # one rank per core
    gpus = [Device("cuda", i) for i in range(4)]
    assert role_devices(partial, gpus, "threads")["policy"] == gpus  # GPUs stay ranks


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to")
def test_a_thread_scaling_probe_runs_on_one_core_then_on_all_and_pins_its_worker_back():
    """Re-placement's probes (`RankWorker.decode_scaling`, `update_scaling`) time a phase
    pinned to one core with one thread, then on the run's first `cores` cores with that many
    threads; the worker is pinned back to its own device after, also when a probe fails."""
    from types import SimpleNamespace

    from yatt.control.rank import RankWorker

    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    core = sorted(affinity)[1]
    worker = SimpleNamespace(device=Device("cpu", 1), control=SimpleNamespace(backend="ray"),
                             name="r")  # fmt: skip
    seen: list[tuple[set[int], int]] = []

    def measure() -> float:
        seen.append((os.sched_getaffinity(0), torch.get_num_threads()))
        return float(len(seen))

    def failing() -> float:
        raise RuntimeError("probe failed")

    try:
        assert RankWorker._on_one_and_many(worker, 2, measure) == (1.0, 2.0)
        assert seen == [({core}, 1), (set(sorted(affinity)[:2]), 2)]
        assert (os.sched_getaffinity(0), torch.get_num_threads()) == ({core}, 1)  # its device
        worker.device = Device("cpu", 0, 2)
        with pytest.raises(RuntimeError, match="probe failed"):
            RankWorker._on_one_and_many(worker, 2, failing)
        assert (os.sched_getaffinity(0), torch.get_num_threads()) == (set(sorted(affinity)[:2]), 2)
        worker.control.backend = "inprocess"  # unpinned workers cannot be probed
        with pytest.raises(AssertionError, match="pinned CPU worker"):
            RankWorker._on_one_and_many(worker, 2, measure)
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def test_re_placement_moves_only_to_plans_whose_ranks_split_the_prompts_evenly():
    """A move to a plan with 3 policy ranks and 8 prompts a step would fail mid-run (the
    shard queues need a multiple): such plans are no candidates."""
    from yatt.config import load_config
    from yatt.control.cluster import plans_that_fit

    config = load_config("tiny_test", ["algo.prompts_per_step=8"])
    gpus = [Device("cuda", i) for i in range(4)]
    fit, unfit = plans_that_fit(config, ControlConfig(backend="ray"), gpus)
    assert [plan.label() for plan in unfit] == ["disaggregated(sampler=1/4)"]
    assert len(fit) + 1 == len(candidate_placements(4))
    cpus = [Device("cpu", i) for i in range(4)]  # threads: a role is one worker, one rank
    threads = ControlConfig(backend="ray", cpu_mapping="threads")
    assert plans_that_fit(config, threads, cpus)[1] == []
    # the in-process backend runs one policy rank: a move to more would fail mid-run
    fit, unfit = plans_that_fit(config, ControlConfig(backend="inprocess"), cpus[:2])
    assert [plan.label() for plan in fit] == ["disaggregated(sampler=1/2)"]
    assert "colocate(2)" in [plan.label() for plan in unfit]


def test_amdahl_fractions_round_trip_and_shape_the_cost_model():
    assert speedup(1.0, 4) == pytest.approx(4.0) and speedup(0.0, 4) == pytest.approx(1.0)
    assert amdahl_fraction(3.0, 3.0 / speedup(0.6, 2), 2) == pytest.approx(0.6)
    assert amdahl_fraction(1.0, 2.0, 2) == 0.0  # slower on 2: clipped, never negative
    # a CPU worker on 2 cores: decode and training scale poorly (fractions < 1), so overlap
    # wins once decode is long, and colocation still wins while it is short
    cpu = {"gen_parallel": 0.6, "train_parallel": 0.7}
    long = PhaseCosts(gen_s=0.3, reward_s=0.0, train_s=5.0, gen_floor_s=5.0, **cpu)
    short = PhaseCosts(gen_s=0.1, reward_s=0.0, train_s=2.0, gen_floor_s=0.3, **cpu)
    colocate, split = make_placement("colocate", 2), make_placement("disaggregated", 2, 1)
    assert predict_step_s(long, colocate) == pytest.approx(
        5.0 / speedup(0.6, 2) + 0.3 / 2 + 5.0 / speedup(0.7, 2)
    )
    assert predict_step_s(long, split) < predict_step_s(long, colocate)
    assert predict_step_s(short, colocate) < predict_step_s(short, split)
    perfect = PhaseCosts(gen_s=0.3, reward_s=0.0, train_s=5.0, gen_floor_s=5.0, gen_parallel=1)
    assert predict_step_s(perfect, colocate) < predict_step_s(perfect, split)
    for plan in candidate_placements(2):  # the simulator agrees with the model in steady state
        assert simulate([long] * 8, plan).step_s[-1] == pytest.approx(predict_step_s(long, plan))


def test_costs_from_spans_count_a_multi_core_worker_once_with_its_speedup():
    # one worker on cores 0-1: gen 1.0 s (floor 0.8 on one core), update 2.0 s, on both rows
    spans = [Span(d, "policy", "update_actor", 1.0, 3.0) for d in (0, 1)]
    spans += [Span(d, "sampler", "gen", 0.0, 1.0) for d in (0, 1)]
    costs = costs_from_spans(spans, 1, gen_floor_s=0.8, gen_parallel=0.5, train_parallel=0.5)
    floor_on_two = 0.8 / speedup(0.5, 2)
    assert costs.gen_s == pytest.approx((1.0 - floor_on_two) * 2)
    assert costs.train_s == pytest.approx(2.0 * speedup(0.5, 2))  # one-core seconds
    assert costs.train_on(2) == pytest.approx(2.0)  # predicts the measured span back
    # two single-core ranks with distinct clocks: each span counts as its own work
    ranks = [Span(0, "policy", "update_actor", 0.0, 2.0), Span(1, "policy", "update_actor",
                                                              0.0, 2.1)]  # fmt: skip
    assert costs_from_spans(ranks, 1).train_s == pytest.approx(4.1)


def test_each_gen_call_takes_out_the_floor_of_the_decode_steps_it_ran():
    # async: the last short step's spans hold its update and the sampling of the first long
    # step (96 decode steps at 50 ms: a 4.8 s floor, not the 0.2 s of the step's own budget)
    spans = [Span(1, "policy", "update_actor", 0.0, 1.5), Span(0, "sampler", "gen", 0.0, 5.0, 96)]
    costs = costs_from_spans(spans, 1, gen_floor_s=0.2, decode_step_s=0.05)
    assert costs.gen_floor_s == pytest.approx(4.8) and costs.gen_s == pytest.approx(0.2)
    # where a call's decode steps are unknown, the step's floor stands in
    unknown = costs_from_spans([Span(0, "sampler", "gen", 0.0, 5.0)], 1, gen_floor_s=0.2,
                               decode_step_s=0.05)  # fmt: skip
    assert unknown.gen_floor_s == pytest.approx(0.2) and unknown.gen_s == pytest.approx(4.8)
    # and the rank records the decode steps of every gen call it makes
    assert spans_from_events([(0, "sampler", "gen", 1.0, 2.0, 7)])[0].tokens == 7


def test_reused_processes_prefer_policy_ranks_and_gpus_stay_put():
    backend = InProcessBackend()
    cpu = [backend.spawn(_Echo, Device("cpu", i), f"w{i}", i) for i in range(3)]
    pool = {0: [cpu[0]], 1: [cpu[1]], 2: [cpu[2]]}
    assert _reusable(pool, Device("cpu", 0, 2), prefer=[cpu[2]]) is cpu[2]  # a rank re-pins
    assert _reusable(pool, Device("cpu", 1), prefer=[]) is cpu[1]  # else the one on the core
    assert _reusable(pool, Device("cpu", 1), prefer=[]) is cpu[0]  # else any CPU process
    assert _reusable(pool, Device("cpu", 1), prefer=[]) is None
    gpu = backend.spawn(_Echo, Device("cuda", 0), "g", 0)
    assert _reusable({0: [gpu]}, Device("cuda", 1), prefer=[gpu]) is None  # its GPU only


def test_settings_that_cannot_take_effect_are_named():
    from yatt.control.config import ControlConfig, ignored_settings

    assert ignored_settings(ControlConfig()) == []
    assert ignored_settings(ControlConfig(placement="disaggregated", async_staleness=1)) == []
    notes = ignored_settings(ControlConfig(async_staleness=1, n_sampler=1))
    assert notes == [
        "control.async_staleness=1 has no effect: control.placement=colocate samples in sync "
        "(only disaggregated overlaps sampling with training)",
        "control.n_sampler=1 has no effect: colocate runs every role on every device",
    ]
    # re-placement may move to a plan that uses them; on one device it has nothing to choose
    assert ignored_settings(ControlConfig(async_staleness=1, replace_every=2, n_devices=2)) == []
    (note,) = ignored_settings(ControlConfig(replace_every=2, n_devices=1))
    assert note.startswith("control.replace_every=2 has no effect: one device")
    # re-placement runs the parallel controllers: a single-controller setting is named, and the
    # run's record says what ran
    from yatt.control.run import settings_label

    both = ControlConfig(mode="single", replace_every=2, n_devices=2)
    (note,) = ignored_settings(both)
    assert note.startswith("control.mode=single has no effect: runtime re-placement")
    assert settings_label(both, 2).startswith("parallel controllers")


def test_the_simulation_runs_a_synchronous_disaggregated_plan_in_series():
    costs = PhaseCosts(gen_s=1.0, reward_s=0.0, train_s=2.0, gen_floor_s=1.0)
    split = make_placement("disaggregated", 2, 1)
    steps = 6
    for overlap in (True, False):
        sim = simulate([costs] * steps, split, overlap=overlap)
        # steady state: the model's max(rollout, train) when async, their sum when not
        assert sim.step_s[-1] == pytest.approx(predict_step_s(costs, split, overlap)), overlap
    planner = Replanner(2, every_steps=100, move_cost_s=0.0, overlap=False)
    assert simulate([costs] * steps, split, planner).step_s[-1] == pytest.approx(4.0)
