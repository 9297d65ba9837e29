"""Async rollout: bounded staleness, over-dispatch with straggler abort and prompt reclaim, and
DAPO dynamic sampling, first on fake samplers (exact bookkeeping), then on a tiny model with the
in-process backend (a sampler worker and a policy rank on 2 CPU devices)."""

import pytest
import torch

from yatt.batch import RolloutBatch
from yatt.config import load_config
from yatt.control import ControlConfig, make_controller
from yatt.control.async_rollout import GroupRollout, ShardQueue, reward_means
from yatt.control.shards import Shard, ShardRequest, make_features
from yatt.control.workers import Future, call_now

N_SAMPLES = 2


class _Lazy(Future):
    """A sampler call that is 'still running' (not done) when its prompt is a straggler."""

    def __init__(self, shard: Shard, straggler: bool, cancelled: list[int]) -> None:
        self.shard, self.straggler, self.cancelled = shard, straggler, cancelled

    def done(self) -> bool:
        return not self.straggler

    def result(self) -> Shard:
        return self.shard

    def cancel(self) -> None:
        self.cancelled.append(self.shard.batch.rows[0]["prompt"])


def _fake_shard(request: ShardRequest) -> Shard:
    rows = len(request.prompt_indices) * N_SAMPLES
    batch = RolloutBatch.from_token_lists([[1, 2]] * rows, [[3, 4, 5]] * rows)
    batch.group_ids = torch.tensor([g for g in request.group_ids for _ in range(N_SAMPLES)])
    batch.rows = [{"prompt": p} for p in request.prompt_indices for _ in range(N_SAMPLES)]
    return Shard(request.rank, request.step, batch, make_features(request.seeds, 4))


def _score(shard: Shard) -> tuple[torch.Tensor, dict[str, float]]:
    """Prompts divisible by 3 score all-equal (no signal); others score 0, 1 within the group."""
    scores = torch.tensor([
        0.0 if row["prompt"] % 3 == 0 else float(i % N_SAMPLES)
        for i, row in enumerate(shard.batch.rows)
    ])  # fmt: skip
    return scores, {"reward/toy/mean": float(scores.mean())}


def test_over_dispatch_aborts_stragglers_and_loses_no_prompt():
    queue = ShardQueue(10_000, seed=3, prompts_per_step=8, world=2, rank=1)
    rollout = GroupRollout(queue, N_SAMPLES, seed=1, over_dispatch=1.0, dynamic=True,
                           max_refills=8, budget=lambda step: 0, behaviour_logp=False)  # fmt: skip
    stragglers: set[int] = set()  # group ids whose sampling runs slow (one call in five)
    cancelled: list[int] = []

    def submit(request: ShardRequest, version: int) -> Future:
        straggler = request.seeds[0] % 5 == 0
        stragglers.update(request.group_ids if straggler else ())
        return _Lazy(_fake_shard(request), straggler, cancelled)

    trained, dropped, aborted, trained_stragglers = [], [], 0, 0
    inflight = rollout.dispatch(0, 0, submit)
    for step in range(12):
        shard, stats = rollout.collect(inflight, submit, _score, lambda: 0.0)
        inflight = rollout.dispatch(step + 1, step, submit)  # async: in flight while training
        assert stats.staleness == min(step, 1) and stats.kept == rollout.need == 4
        groups = shard.batch.group_ids.unique()
        trained_stragglers += len(set(groups.tolist()) & stragglers)
        assert len(groups) == 4 and shard.batch.size == 4 * N_SAMPLES
        assert all(p % 3 for p in stats.trained_prompts)  # only groups with a signal train
        trained += stats.trained_prompts
        dropped += stats.dropped_prompts
        aborted += stats.aborted
    assert aborted > 0 and dropped and cancelled
    # a straggler is waited for only when nothing else is left: it trains less than its share
    assert trained_stragglers < 0.1 * len(trained) < 0.5 * len(stragglers)
    in_flight = [p for request, _ in inflight.calls for p in request.prompt_indices]
    accounted = trained + dropped + queue.contents() + in_flight
    assert len(accounted) == len(set(accounted)) == queue.drawn  # none lost, none twice
    assert sorted(accounted) == sorted(ShardQueue(10_000, 3, 8, 2, 1).take(queue.drawn))


def test_a_replacement_hands_over_every_pending_prompt_to_the_new_groups():
    """Two groups over-dispatch (async, DAPO) for a few steps, hand over at a re-placement to
    one group, which runs on: every prompt of the global stream is trained, dropped, queued
    or in flight exactly once."""
    cancelled: list[int] = []

    def submit(request: ShardRequest, version: int) -> Future:
        return _Lazy(_fake_shard(request), request.seeds[0] % 5 == 0, cancelled)

    def rollout(world: int, rank: int) -> GroupRollout:
        return GroupRollout(ShardQueue(10_000, 3, 8, world, rank), N_SAMPLES, seed=1,
                            over_dispatch=1.0, dynamic=True, max_refills=8,
                            budget=lambda step: 0, behaviour_logp=False)  # fmt: skip

    def run(groups: list[GroupRollout], steps: range) -> list:
        inflight = [g.dispatch(steps[0], steps[0], submit) for g in groups]
        for step in steps:
            for index, group in enumerate(groups):
                _, stats = group.collect(inflight[index], submit, _score, lambda: 0.0)
                accounted.extend(stats.trained_prompts + stats.dropped_prompts)
                inflight[index] = group.dispatch(step + 1, step, submit)
        return inflight

    accounted: list[int] = []
    old = [rollout(2, 0), rollout(2, 1)]
    inflight = run(old, range(3))
    old[1].queue.catch_up(old[1].queue.draws + 2)  # group 1 drew ahead; group 0 lags behind
    draws = max(g.queue.draws for g in old)
    pending = [g.handover([d], draws) for g, d in zip(old, inflight)]
    assert all(not d.calls for d in inflight) and old[0].queue.draws == draws
    new = rollout(1, 0)
    new.resume(draws, pending[0] + pending[1])
    assert new.queue.contents() == pending[0] + pending[1]
    inflight = run([new], range(3, 6))
    accounted += [p for request, _ in inflight[0].calls for p in request.prompt_indices]
    accounted += new.queue.contents()
    total = new.queue.draws * 8
    assert len(accounted) == len(set(accounted)) == total  # none lost, none twice
    assert sorted(accounted) == sorted(ShardQueue(10_000, 3, 8, 1, 0).take(total))


@pytest.mark.parametrize("in_a_worker", [False, True])
def test_a_failing_reward_names_the_data_row_its_sample_came_from(in_a_worker):
    """As the single-process trainer does: "row r is a sample of data.jsonl:L" (the reward
    raised here, or in a worker process, whose error carries it as its cause)."""
    from yatt.errors import WorkerError
    from yatt.rewards import RewardError

    queue = ShardQueue(10_000, seed=3, prompts_per_step=4, world=1, rank=0)
    rollout = GroupRollout(queue, N_SAMPLES, seed=1, over_dispatch=0.0, dynamic=False,
                           max_refills=0, budget=lambda step: 0, behaviour_logp=False,
                           source_of=lambda index: f"data.jsonl:{index + 1}")  # fmt: skip

    def score(shard: Shard) -> tuple:
        error = RewardError("reward 'f' raised KeyError on row 5", 5)
        if not in_a_worker:
            raise error
        raise WorkerError(f"reward0: {error}") from error

    dispatch = rollout.dispatch(0, 0, lambda request, version: call_now(_fake_shard, request))
    prompt = dispatch.calls[0][0].prompt_indices[5 // N_SAMPLES]
    named = rf"on row 5 \(row 5 is a sample of data.jsonl:{prompt + 1}\)"
    with pytest.raises(RewardError, match=named):
        rollout.collect(dispatch, lambda request, version: None, score, lambda: 0.0)


def test_every_request_carries_its_steps_resolved_response_budget():
    """Before the schedule's first entry a step's budget is rollout.max_new_tokens, sent as
    such: a sampler keeps the last budget it got, which (steps sampled ahead, refills) may be
    a later step's."""
    from yatt.control.async_rollout import make_group_rollout

    config = load_config("tiny_test", ["rollout.max_new_tokens=16"])
    control = ControlConfig(length_schedule=("10:64",))
    rollout = make_group_rollout(config, control, world=1, rank=0, first_step=0, staleness=1)
    budgets = {step: rollout._request(step, 0, [0]).max_new_tokens for step in (7, 8, 9, 20)}
    assert budgets == {7: 16, 8: 16, 9: 64, 20: 64}  # step index 9 is logged step 10


def test_reclaimed_prompts_go_to_the_front_of_the_queue():
    queue = ShardQueue(100, seed=0, prompts_per_step=2, world=1, rank=0)
    rollout = GroupRollout(queue, N_SAMPLES, seed=1, over_dispatch=1.0, dynamic=False,
                           max_refills=0, budget=lambda step: 0, behaviour_logp=True)  # fmt: skip

    def submit(request: ShardRequest, version: int) -> Future:
        assert request.behaviour_logp and version == 0
        return call_now(_fake_shard, request)

    dispatch = rollout.dispatch(0, 0, submit)
    assert len(dispatch.calls) == 4  # (1 + r) x 2 groups, one call each
    shard, stats = rollout.collect(dispatch, submit, _score, lambda: 0.0)
    assert stats.aborted == 2 and stats.dispatched == 4
    assert queue.contents()[:2] == stats.reclaimed_prompts
    # The reward functions' own metrics: a row-weighted mean over the rows scored (2 groups
    # of the 4 dispatched; the aborted 2 were never scored), as the trainer logs them.
    logged = reward_means(stats.metrics())
    assert logged["control/scored_rows"] == shard.batch.size == 2 * N_SAMPLES
    assert logged["reward/toy/mean"] == pytest.approx(float(shard.batch.scores.mean()))


OVERRIDES = ["train.steps=4", "algo.prompts_per_step=2", f"rollout.n_samples={N_SAMPLES}",
             "optim.lr=1e-2", "rollout.max_new_tokens=6", "data.n_train=64",
             "data.n_heldout=0", "eval.n=0"]  # fmt: skip


def _run(config_overrides=(), **changes):
    config = load_config("tiny_test", [*OVERRIDES, *config_overrides])
    control = ControlConfig(**{"backend": "inprocess", "n_devices": 2, "device_kind": "cpu",
                               "placement": "disaggregated", "n_sampler": 1,
                               "extra_rewards": ("yatt.control.workload:char_mix_reward",),
                               **changes})  # fmt: skip
    controller = make_controller(config, control)
    try:
        run = controller.fit()
        return run, controller.weights()
    finally:
        controller.close()


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_staleness_zero_is_the_synchronous_run_and_k_is_a_bound():
    sync_run, sync_w = _run(placement="colocate", n_devices=1)
    zero_run, zero_w = _run(async_staleness=0)
    assert _same(sync_w, zero_w)
    assert [h["control/staleness"] for h in zero_run.history] == [0.0] * 4
    async_run, async_w = _run(async_staleness=2)
    staleness = [h["control/staleness"] for h in async_run.history]
    assert staleness == [0.0, 1.0, 2.0, 2.0]  # never above k; k once the pipeline is full
    assert not any(e[2] == "behaviour_logp" for e in async_run.events)  # engine log-probs
    assert async_run.history[0]["critic/score/mean"] == sync_run.history[0]["critic/score/mean"]
    assert not _same(sync_w, async_w)  # later steps trained on samples of older weights
    # colocated: optimizer offload/onload around each update (timed; a no-op on CPU devices)
    assert sum(e[2] == "swap" for e in sync_run.events) == 2 * 4
    assert all(h["timing_s/swap"] >= 0 for h in sync_run.history)
    assert not any(e[2] == "swap" for e in async_run.events)  # disaggregated: nothing shared


def test_a_time_limit_stops_an_async_run_with_steps_generated_ahead():
    run, _ = _run(["train.time_limit_s=1e-9"], async_staleness=2)  # steps 2-3 were in flight
    assert len(run.history) == 1


def test_dynamic_sampling_with_over_dispatch_in_async_mode_agrees_across_modes():
    dapo = ("algo.dynamic_sampling=true", "algo.max_refill_batches=6")
    changes = {"async_staleness": 1, "over_dispatch": 0.5,
               "extra_rewards": ("yatt.control.workload:parity_reward",)}  # fmt: skip
    single_run, single_w = _run(dapo, mode="single", **changes)
    parallel_run, parallel_w = _run(dapo, mode="parallel", **changes)
    assert _same(single_w, parallel_w)
    for row in parallel_run.history:
        assert row["batch/kept_groups"] == 2 and row["batch/rows"] == 2 * N_SAMPLES
    assert sum(h["batch/dropped_groups"] for h in parallel_run.history) > 0
    assert sum(h["control/aborted_groups"] for h in parallel_run.history) > 0
    for row in parallel_run.history:  # the generation rate counts the dropped groups' tokens
        trained = row["response_length/mean"] * row["batch/rows"]
        assert row["control/gen_tokens"] >= trained
        if row["batch/dropped_groups"]:
            assert row["control/gen_tokens"] > trained
    assert [h["batch/dropped_groups"] for h in single_run.history] == [
        h["batch/dropped_groups"] for h in parallel_run.history
    ]


def test_async_samples_carry_the_sampling_log_probs_a_forward_pass_would_give():
    """The sampler's behaviour log-probs come from the engine when its distribution is the
    trainer's (fp32, no top-p/top-k); with a filter they are recomputed by a forward pass."""
    from yatt.control.devices import Device
    from yatt.control.rank import RankWorker
    from yatt.roles.policy import compute_logprobs

    request = ShardRequest(0, 0, (0, 1), (0, 1), (11, 12, 13, 14), behaviour_logp=True)
    for extra, phases in ((), 0), (("rollout.top_p=0.9",), 1):
        config = load_config("tiny_test", [*OVERRIDES, *extra])
        control = ControlConfig(backend="inprocess", device_kind="cpu", n_devices=1)
        worker = RankWorker(config, control, Device("cpu", 0), ("sampler",), "sampler0")
        batch = worker.generate(request, 0).batch
        assert batch.old_logp is not None and batch.behaviour_logp is None
        assert sum(e[2] == "behaviour_logp" for e in worker.events) == phases
        forward = compute_logprobs(worker.rollout.engine.model, batch, 4,
                                   config.rollout.temperature or 1.0)  # fmt: skip
        mask = batch.response_mask.bool()
        assert mask.sum() > 4
        if phases:  # the filtered distribution differs from the trainer's: recomputed
            assert torch.equal(batch.old_logp[mask], forward[mask])
        else:
            assert torch.allclose(batch.old_logp[mask], forward[mask], atol=1e-4)
