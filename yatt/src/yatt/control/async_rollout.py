"""One data-parallel group's rollout: its prompt queue, over-dispatch, straggler abort, prompt
reclaim and DAPO refills. Both controller modes run it (the parallel rank for its own group,
the single driver once per group), so their results match for the same seed.

A step needs `need` groups (prompts x n_samples rows). `dispatch` takes ceil(need * (1 + r))
prompts from the front of the group's `ShardQueue` and submits them to the sampler (one call
per group when r > 0, so groups come back one by one). `collect` takes results in completion
order (ties: submission order), scores them, keeps the groups with a learning signal (all of
them unless dynamic sampling is on), refills with new prompts while too few are valid (at most
`max_refills` times), and as soon as `need` groups are kept aborts every call still pending
and puts its prompts, and those of surplus groups, back at the front of the queue. (An abort
drops the calls still queued at a sampler before they start; a Ray actor does not interrupt the
call it is running, so with one call per group at most one group per sampler decodes on, its
result unused.) Every
prompt drawn is therefore trained on, dropped by the DAPO filter, or back in the queue: none
is lost or duplicated (tested), also across a runtime re-placement (`handover`, `resume`).

With bounded staleness the controller dispatches steps t+1..t+k before training step t; their
calls carry the policy version they must be sampled with (at most k behind) and ask the
sampler for behaviour log-probs, which the update uses as the importance-sampling denominator.
Refills are sampled when they are needed, with the newest weights (staleness 0).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from yatt.algos.advantages import dynamic_sampling_mask, signal_of, without_signal
from yatt.batch import RolloutBatch
from yatt.control.shards import Shard, ShardRequest
from yatt.control.workers import Future, wait_first
from yatt.data import PromptSampler
from yatt.errors import ConfigError, WorkerError
from yatt.rewards import RewardError

__all__ = [
    "GROUP_STRIDE",
    "GroupRollout",
    "QueueState",
    "RolloutStats",
    "ShardQueue",
    "StepDispatch",
    "deal_prompts",
    "make_group_rollout",
    "prompts_due",
]

# Group ids per step: room for every initial, over-dispatched and refilled group.
GROUP_STRIDE = 1 << 16

Submit = Callable[[ShardRequest, int], Future]
Score = Callable[[Shard], tuple[torch.Tensor, dict[str, float]]]  # rewards, their metrics
Shaping = Callable[[RolloutBatch, int], torch.Tensor]
# A group's data position at a step boundary, as a checkpoint keeps it: the global draws its
# queue consumed, and the prompts it took but neither trained nor dropped (in flight, then
# queued), in the order they are due.
QueueState = tuple[int, list[int]]


class ShardQueue:
    """The prompts data-parallel group `rank` samples next, front first.

    Each refill pulls this group's slice of the next global draw of `prompts_per_step` prompts
    from its own copy of the seeded prompt order, so every process that builds the queue of
    `rank` sees the same prompts. `reclaim` puts aborted prompts back at the front, in order.
    """

    def __init__(self, n_prompts: int, seed: int, prompts_per_step: int, world: int,
                 rank: int) -> None:  # fmt: skip
        if prompts_per_step < 1 or prompts_per_step % world:
            raise ConfigError(
                f"algo.prompts_per_step={prompts_per_step} must be a multiple of the "
                f"{world} data-parallel groups"
            )
        assert 0 <= rank < world, f"rank {rank} outside world {world}"
        self.source = PromptSampler(n_prompts, seed)
        self.prompts_per_step, self.world, self.rank = prompts_per_step, world, rank
        self.per_group = prompts_per_step // world
        self._queue: deque[int] = deque()
        self.drawn = 0
        self.draws = 0  # global draws of `prompts_per_step` consumed (skipped ones included)

    def __len__(self) -> int:
        return len(self._queue)

    def skip_draws(self, draws: int) -> None:
        """Advance the prompt order by `draws` global draws (resuming at a later step)."""
        assert not self._queue and self.drawn == 0, "skip_draws only before the first take"
        for _ in range(draws):
            self.source.take(self.prompts_per_step)
        self.draws += draws

    def _pull(self) -> None:
        """This group's slice of the next global draw, at the back of the queue."""
        first = self.rank * self.per_group
        self._queue.extend(self.source.take(self.prompts_per_step)[first:][: self.per_group])
        self.drawn += self.per_group
        self.draws += 1

    def take(self, count: int) -> list[int]:
        """The next `count` prompts (front of the queue, then fresh draws)."""
        while len(self._queue) < count:
            self._pull()
        return [self._queue.popleft() for _ in range(count)]

    def catch_up(self, draws: int) -> None:
        """Pull this group's slices of the global draws before `draws` into the queue."""
        while self.draws < draws:
            self._pull()

    def reclaim(self, prompts: list[int]) -> None:
        """Put `prompts` back at the front (their order kept): they are sampled next."""
        self._queue.extendleft(reversed(prompts))

    def contents(self) -> list[int]:
        return list(self._queue)


@dataclass
class StepDispatch:
    """The calls in flight for one step of one group, oldest first."""

    step: int
    version: int
    calls: list[tuple[ShardRequest, Future]]
    next_slot: int


@dataclass
class RolloutStats:
    """What a step's collection did; prompt lists are for bookkeeping checks."""

    dispatched: int = 0
    kept: int = 0
    dropped: int = 0
    aborted: int = 0
    refills: int = 0
    staleness: int = 0
    score_s: float = 0.0
    gen_tokens: float = 0.0  # every collected call's response tokens, dropped groups included
    gen_s: float = 0.0  # the sampler seconds that generated them
    trained_prompts: list[int] = field(default_factory=list)
    dropped_prompts: list[int] = field(default_factory=list)
    reclaimed_prompts: list[int] = field(default_factory=list)
    # The reward functions' own metrics (`reward/<fn>/mean` ...), row-weighted sums over every
    # row scored, dropped groups included (as the trainer logs them), and those rows; and the
    # batch scorers' declared counts (a judge's `judge/parse_failures`), summed over calls.
    reward_sums: dict[str, float] = field(default_factory=dict)
    scored_rows: int = 0
    scorer_counts: dict[str, float] = field(default_factory=dict)

    def add_reward_metrics(self, metrics: dict[str, float], rows: int) -> None:
        """Add one scoring call's metrics (`RewardRole.summable_metrics`: every call gives the
        same keys, so every group sums the same, as the parallel controllers' all-reduce
        needs): `reward/*` means over `rows` rows, and the scorers' counts."""
        for key, value in metrics.items():
            if key.startswith("reward/"):
                self.reward_sums[key] = self.reward_sums.get(key, 0.0) + float(value) * rows
            else:
                self.scorer_counts[key] = self.scorer_counts.get(key, 0.0) + float(value)
        self.scored_rows += rows

    def metrics(self) -> dict[str, float]:
        """Counters that add up over groups (the controllers sum them, then turn the reward
        metrics' sums into means with `reward_means`)."""
        return {
            "batch/kept_groups": float(self.kept),
            "batch/dropped_groups": float(self.dropped),
            "control/dispatched_groups": float(self.dispatched),
            "control/aborted_groups": float(self.aborted),
            "control/refills": float(self.refills),
            "control/gen_tokens": self.gen_tokens,
            "control/sampler_gen_s": self.gen_s,
            "control/scored_rows": float(self.scored_rows),
            **{_REWARD_SUM + key: value for key, value in self.reward_sums.items()},
            **self.scorer_counts,
        }


_REWARD_SUM = "sum:"  # a summed reward metric in `RolloutStats.metrics`


def reward_means(metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` (summed `RolloutStats.metrics` of every group) with each reward metric's sum
    replaced by its mean over the rows scored, as the trainer logs them."""
    rows = max(metrics.get("control/scored_rows", 0.0), 1.0)
    return {
        key.removeprefix(_REWARD_SUM): value / rows if key.startswith(_REWARD_SUM) else value
        for key, value in metrics.items()
    }


class GroupRollout:
    """Dispatch and collection for data-parallel group `queue.rank` (see the module docstring).

    need: groups per step; n_samples: rows per group; over_dispatch: r; dynamic: DAPO filter;
    max_refills: refill rounds allowed per step; budget: step -> response budget (0: the
    sampler's last);
    behaviour_logp: ask samplers for the behaviour log-probs (async runs); shaping: (batch,
    step) -> (B,) terms added to the scores to make the rewards (DAPO's overlong penalty), or
    None; the batch keeps the scores too (`RolloutBatch.scores`); source_of: prompt index ->
    where it came from (a file and line), named when a reward fails on one of its samples.
    """

    def __init__(self, queue: ShardQueue, n_samples: int, seed: int, over_dispatch: float,
                 dynamic: bool, max_refills: int, budget: Callable[[int], int],
                 behaviour_logp: bool, shaping: Shaping | None = None,
                 source_of: Callable[[int], str] | None = None) -> None:  # fmt: skip
        self.queue, self.need = queue, queue.per_group
        self.n_samples, self.seed = n_samples, seed
        self.over_dispatch, self.dynamic = over_dispatch, dynamic
        self.max_refills = max_refills if dynamic else 0
        self.budget, self.behaviour_logp = budget, behaviour_logp
        self.shaping = shaping
        self.source_of = source_of or (lambda index: f"train prompt {index}")

    def _extra(self, groups: int) -> int:
        return math.ceil(groups * (1 + self.over_dispatch) - 1e-9)

    def _submit(self, dispatch: StepDispatch, groups: int, submit: Submit, version: int) -> None:
        """Take `groups` prompts and submit them (one call per group when over-dispatching)."""
        prompts = self.queue.take(groups)
        per_call = 1 if self.over_dispatch > 0 else groups
        for first in range(0, groups, per_call):
            chunk = prompts[first : first + per_call]
            request = self._request(dispatch.step, dispatch.next_slot, chunk)
            dispatch.next_slot += len(chunk)
            dispatch.calls.append((request, submit(request, version)))

    def _global_slot(self, slot: int) -> int:
        """The step-wide position of this group's `slot`: the step's planned prompts first, in
        global order (so seeds do not depend on the split), then extras, interleaved."""
        queue = self.queue
        if slot < self.need:
            return queue.rank * self.need + slot
        return queue.prompts_per_step + (slot - self.need) * queue.world + queue.rank

    def _request(self, step: int, slot: int, prompts: list[int]) -> ShardRequest:
        n = self.n_samples
        slots = [self._global_slot(slot + i) for i in range(len(prompts))]
        assert slots[-1] < GROUP_STRIDE, f"{slots[-1]} groups in step {step}"
        base = (self.seed * 1_000_003 + step * 1009) * 4099
        return ShardRequest(
            rank=self.queue.rank, step=step, prompt_indices=tuple(prompts),
            group_ids=tuple(step * GROUP_STRIDE + g for g in slots),
            seeds=tuple(base + g * n + j for g in slots for j in range(n)),
            max_new_tokens=self.budget(step), behaviour_logp=self.behaviour_logp,
        )  # fmt: skip

    def _scored(self, score: Score, shard: Shard, request: ShardRequest
                ) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
        """``score(shard)``; a reward that fails (here or in a worker) names the data row of
        the prompt the failing sample came from, as the single-process trainer does."""
        try:
            return score(shard)
        except (RewardError, WorkerError) as error:
            failed = error if isinstance(error, RewardError) else error.__cause__
            if not isinstance(failed, RewardError):
                raise
            prompts = request.prompt_indices
            if failed.row is None or not 0 <= failed.row // self.n_samples < len(prompts):
                where = "samples of " + ", ".join(map(self.source_of, prompts))
            else:
                where = f"row {failed.row} is a sample of "
                where += self.source_of(prompts[failed.row // self.n_samples])
            raise RewardError(f"{error} ({where})", failed.row) from error

    def dispatch(self, step: int, version: int, submit: Submit) -> StepDispatch:
        """Submit the first wave of `step`: ceil(need * (1 + r)) groups."""
        dispatch = StepDispatch(step, version, [], 0)
        self._submit(dispatch, self._extra(self.need), submit, version)
        return dispatch

    def collect(self, dispatch: StepDispatch, submit: Submit, score: Score,
                clock: Callable[[], float]) -> tuple[Shard, RolloutStats]:  # fmt: skip
        """The step's shard of exactly `need` groups (fewer only if refills ran out)."""
        stats = RolloutStats(staleness=dispatch.step - dispatch.version)
        prompt_of = {}
        kept: list[Shard] = []
        last = None
        while dispatch.calls and stats.kept < self.need:
            index = wait_first([future for _, future in dispatch.calls])
            request, future = dispatch.calls.pop(index)
            prompt_of.update(zip(request.group_ids, request.prompt_indices))
            shard = future.result()
            assert shard.step == dispatch.step, f"samples of step {shard.step} at {dispatch.step}"
            stats.gen_tokens += float(shard.batch.response_mask.sum())
            stats.gen_s += shard.gen_s
            start_s = clock()
            scores, reward_metrics = self._scored(score, shard, request)
            stats.score_s += clock() - start_s
            stats.add_reward_metrics(reward_metrics, shard.batch.size)
            shard.batch.scores = scores
            extra = None if self.shaping is None else self.shaping(shard.batch, dispatch.step)
            shard.batch.rewards = scores if extra is None else scores + extra
            last = shard
            keep = self._valid_rows(shard.batch)
            for gid in request.group_ids:
                valid = bool(keep[shard.batch.group_ids == gid].any())
                (stats.trained_prompts if valid else stats.dropped_prompts).append(prompt_of[gid])
            if bool(keep.any()):
                kept.append(_select(shard, keep.nonzero().flatten()))
            stats.kept = len(stats.trained_prompts)
            if not dispatch.calls and stats.kept < self.need and stats.refills < self.max_refills:
                stats.refills += 1
                # refills are sampled now, with the newest weights (version = step)
                self._submit(dispatch, self._extra(self.need - stats.kept), submit, dispatch.step)
        stats.dispatched = dispatch.next_slot
        self._abort(dispatch, stats)
        assert last is not None, f"step {dispatch.step}: nothing was dispatched"
        if not kept:  # no valid group anywhere: the last batch, training no row
            without_signal(last.batch)
        shard = self._first_groups(kept, stats) if kept else last
        self.queue.reclaim(stats.reclaimed_prompts)
        stats.kept = len(stats.trained_prompts)
        stats.dropped = len(stats.dropped_prompts)
        return shard, stats

    def _valid_rows(self, batch: RolloutBatch) -> torch.Tensor:
        """(B,) bool: rows of groups with a learning signal (every row unless dynamic)."""
        if not self.dynamic:
            return torch.ones(batch.size, dtype=torch.bool)
        return dynamic_sampling_mask(signal_of(batch), batch.group_ids)

    def _abort(self, dispatch: StepDispatch, stats: RolloutStats) -> None:
        """Cancel the calls still pending and reclaim their prompts (front of the queue)."""
        for request, future in dispatch.calls:
            future.cancel()
            stats.reclaimed_prompts.extend(request.prompt_indices)
            stats.aborted += len(request.prompt_indices)
        dispatch.calls = []

    def handover(self, dispatches: list[StepDispatch], draws: int) -> list[int]:
        """A re-placement: cancel `dispatches` (steps in flight, oldest first) and return every
        prompt this group took but neither trained nor dropped, plus its slices of the global
        draws before `draws` (the most any group consumed), in the order they were due."""
        prompts = []
        for dispatch in dispatches:
            for request, future in dispatch.calls:
                future.cancel()
                prompts.extend(request.prompt_indices)
            dispatch.calls = []
        self.queue.catch_up(draws)
        return prompts + self.queue.take(len(self.queue))

    def queue_state(self, dispatches: list[StepDispatch]) -> QueueState:
        """This group's data position with `dispatches` (steps in flight, oldest first) still
        running: nothing is cancelled (a checkpoint; `handover` is the re-placement's)."""
        taken = [p for d in dispatches for request, _ in d.calls for p in request.prompt_indices]
        return self.queue.draws, taken + self.queue.contents()

    def resume(self, draws: int, pending: list[int]) -> None:
        """Continue after a re-placement: fresh draws from global draw `draws` on, after the
        `pending` prompts the previous plan's groups handed over (front first)."""
        queue = self.queue
        self.queue = ShardQueue(queue.source.n_prompts, queue.source.seed,
                                queue.prompts_per_step, queue.world, queue.rank)  # fmt: skip
        self.queue.skip_draws(draws)
        self.queue.reclaim(pending)

    def _first_groups(self, kept: list[Shard], stats: RolloutStats) -> Shard:
        """The first `need` kept groups; surplus groups' prompts are reclaimed."""
        surplus = stats.trained_prompts[self.need :]
        del stats.trained_prompts[self.need :]
        stats.reclaimed_prompts = surplus + stats.reclaimed_prompts
        shard = _concat(kept)
        gids = list(dict.fromkeys(shard.batch.group_ids.tolist()))[: self.need]
        rows = torch.isin(shard.batch.group_ids, torch.tensor(gids)).nonzero().flatten()
        return _select(shard, rows)


def _select(shard: Shard, rows: torch.Tensor) -> Shard:
    return Shard(shard.rank, shard.step, shard.batch.select(rows), shard.features[rows])


def _concat(shards: list[Shard]) -> Shard:
    if len(shards) == 1:
        return shards[0]
    batch = RolloutBatch.concat([s.batch for s in shards])
    return Shard(shards[0].rank, shards[0].step, batch, torch.cat([s.features for s in shards]))


def prompts_due(states: list[QueueState], n_prompts: int, seed: int,
                prompts_per_step: int) -> tuple[int, list[list[int]]]:  # fmt: skip
    """From the queue states of every group of a run (one per group, in rank order): the most
    global draws any group consumed, and per group every prompt still due, in order: its
    pending prompts, then its slices of the draws the furthest group took and it did not (as
    `GroupRollout.handover` gives them at a re-placement)."""
    draws = max(d for d, _ in states)
    due = []
    for rank, (drawn, pending) in enumerate(states):
        queue = ShardQueue(n_prompts, seed, prompts_per_step, len(states), rank)
        queue.skip_draws(drawn)
        queue.catch_up(draws)
        due.append(list(pending) + queue.contents())
    return draws, due


def deal_prompts(due: list[list[int]], n_groups: int) -> list[list[int]]:
    """Hand the prompts due to each group of a previous layout (`due`, by old rank) to
    `n_groups` new groups: old group g's go to the front of new group g mod n_groups, in order."""
    return [[p for old, prompts in enumerate(due) if old % n_groups == rank for p in prompts]
            for rank in range(n_groups)]  # fmt: skip


def make_group_rollout(config, control, world: int, rank: int, first_step: int,
                       staleness: int) -> GroupRollout:  # fmt: skip
    """Group `rank`'s rollout for `config` and `control`, its queue starting at `first_step`."""
    from yatt.algos.losses import overlong_penalty
    from yatt.builders import build_data
    from yatt.control.config import max_new_tokens_at

    train_set, _ = build_data(config.data)
    algo = config.algo

    def overlong(batch: RolloutBatch, step: int) -> torch.Tensor:  # at the step's budget
        max_len = max_new_tokens_at(control, step, config.rollout.max_new_tokens)
        return overlong_penalty(batch.response_lengths, max_len, algo.overlong_buffer,
                                algo.overlong_penalty)  # fmt: skip

    queue = ShardQueue(len(train_set), config.data.seed + config.train.seed,
                       algo.prompts_per_step, world, rank)  # fmt: skip
    queue.skip_draws(first_step)
    return GroupRollout(
        queue, config.rollout.n_samples, config.train.seed, control.over_dispatch,
        algo.dynamic_sampling, algo.max_refill_batches,
        # The resolved budget, never 0 ("keep"): a sampler keeps the last budget it was
        # given, which may be a later step's when steps are sampled ahead or refilled.
        lambda step: max_new_tokens_at(control, step, config.rollout.max_new_tokens),
        behaviour_logp=staleness > 0,
        shaping=overlong if algo.overlong_buffer > 0 else None,
        source_of=lambda index: train_set[index].source or f"train prompt {index}",
    )  # fmt: skip
