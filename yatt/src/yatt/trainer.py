"""The single-process RL trainer: `Trainer(config).fit()` runs GRPO, PPO, RLOO or REINFORCE++.

One step is a list of named, timed phases: gen (+ reward, with DAPO refills), old_logp (skipped
for one on-policy pass: the detached current log-probs are the old ones; with bf16 rollouts the
sampler's own log-probs ride along for truncated importance weights), ref (only with KL),
values (PPO), adv, update_actor, update_critic (PPO), update_weights (the sampler takes the
new policy). Each step emits a flat metrics dict
(`critic/score/mean`, `timing_s/gen`, `perf/throughput`, ...) to JSONL and optional TensorBoard.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from yatt.algos.advantages import (
    compute_advantages,
    dynamic_sampling_mask,
    signal_of,
    without_signal,
)
from yatt.algos.kl import kl_mean, kl_penalty_token_rewards
from yatt.algos.losses import overlong_penalty
from yatt.batch import RolloutBatch
from yatt.checkpoint import (
    TRAINER,
    check_resumed_by,
    checkpoint_due,
    checkpoint_run_dir,
    drop_later_checkpoints,
    load_trainer_state,
    resolve_resume,
    save_training_checkpoint,
    truncate_metrics,
    warn_changed_scoring,
)
from yatt.common import MetricsLogger, PhaseTimer
from yatt.common.seeding import rng_state, seed_everything, set_rng_state
from yatt.common.timers import time_limit_reached
from yatt.config import Config, save_config
from yatt.data import PromptSampler, check_draw_order, draw_order
from yatt.errors import ConfigError, PromptTooLong
from yatt.rewards import RewardError
from yatt.roles.critic import CriticRole
from yatt.roles.policy import PolicyRole
from yatt.roles.reference import ReferenceRole
from yatt.roles.reward import RewardRole
from yatt.roles.rollout import RolloutRole
from yatt.run_checks import (
    check_budgets_fit_model,
    check_eval_data,
    check_job_settings,
    check_prompts_fit_model,
    check_rewards_grade_task,
    check_rows_have_answers,
    try_rewards_once,
    warn_if_nothing_kept,
)
from yatt.run_dir import RUN_OUTPUTS, claim_run_dir

__all__ = ["TrainResult", "Trainer", "configure_threads"]

logger = logging.getLogger(__name__)


def configure_threads(torch_threads: int) -> int:
    """Set torch's intra-op threads (0 = one per CPU this process may use); returns the count."""
    threads = torch_threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    return threads


@dataclass
class TrainResult:
    """What `fit` hands back to the CLI: the metric history and the eval curve."""

    run_dir: Path
    history: list[dict[str, float]]
    evals: list[tuple[int, float]] = field(default_factory=list)
    wall_s: float = 0.0
    checkpoint: Path | None = None


class Trainer:
    """Builds the roles from a Config and runs the RL loop on one process."""

    def __init__(
        self,
        config: Config,
        *,
        model: Any = None,
        tokenizer: Any = None,
        reward: Any = None,
    ) -> None:
        """Build everything from `config`; `model`/`tokenizer`/`reward` replace the configured
        ones (tests pass tiny models and fake rewards through here). A fresh run into a
        `logging.run_dir` that holds a previous run raises ConfigError, unless
        `logging.overwrite` (then the previous metrics, checkpoints and TensorBoard logs are
        deleted); so does evaluating with no held-out prompts (before any work is done)."""
        from yatt.builders import adapt_model, build_data, build_model, resume_into

        self.config = config
        check_eval_data(config)
        check_job_settings(config, "yatt train")
        check_rewards_grade_task(config, train=reward is None)  # a given reward is the caller's
        resume = resolve_resume(
            config.checkpoint.resume, config.logging.run_dir, config.train.steps
        )
        if resume:
            check_resumed_by(Path(resume), TRAINER)
            warn_changed_scoring(Path(resume), config)
        # A checkpoint of this run folder continues the run in place; one of another folder
        # starts a new run here from its state (the folder is claimed as for a fresh run).
        self._in_place = (
            bool(resume)
            and checkpoint_run_dir(Path(resume)) == Path(config.logging.run_dir).resolve()
        )
        claim = claim_run_dir(config, RUN_OUTPUTS, resume=resume, in_place=self._in_place)
        self._claim = claim  # its lock keeps other jobs out of the folder while this one lives
        with claim.removed_if_unused():  # a failed set-up leaves no empty folder
            self.run_dir = claim.path
            configure_threads(config.train.torch_threads)
            seed_everything(config.train.seed)
            self.train_set, self.heldout_set = build_data(config.data)  # bad data fails fast
            check_rows_have_answers(config, self.train_set, self.heldout_set, train=reward is None)
            initial = model  # the KL reference: the configured model, also when resuming
            if model is None:
                model, tokenizer = build_model(config.model, resume_from=resume or None)
                initial = model  # (with adapters: the policy, run with them off)
                if resume and config.algo.uses_reference and not config.model.lora_rank:
                    initial = build_model(config.model)[0]
            else:
                adapt_model(model, config.model)  # a caller's own model
                if resume:  # (its own weights stay the KL reference, as the configured one's)
                    if config.algo.uses_reference and not config.model.lora_rank:
                        initial = copy.deepcopy(model)
                    resume_into(model, config.model, resume)
            check_budgets_fit_model(config, model)
            self.tokenizer = tokenizer
            self.prompt_texts = [self._render(example) for example in self.train_set]
            check_prompts_fit_model(config, model, tokenizer, self.train_set, self.heldout_set,
                                    rendered=self.prompt_texts)  # fmt: skip
            self.sampler = PromptSampler(len(self.train_set), config.data.seed + config.train.seed)
            self._draw_order = draw_order(config, self.train_set)  # in each checkpoint
            self._sampled: list[int] = []  # train_set indices of the last sampled prompts
            self._generated_tokens = 0.0  # response tokens generated in the current step
            self._build_roles(model, reward, initial)
            self.step = 0
            self.timer = PhaseTimer()
            if resume:
                self._resume(Path(resume))
            if claim.previous and hasattr(self.reward, "combined"):  # (a caller's own: theirs)
                try_rewards_once(self.reward.combined, self.prompt_texts[0], self.train_set[0])
            claim.clear()  # logging.overwrite: the previous run goes only once this one loaded
        warn_if_nothing_kept(config)  # (once the run starts: a refused one has nothing to keep)

    # ------------------------------------------------------------------ set-up

    def _render(self, example: Any) -> str:
        from yatt.data import render_prompt

        return render_prompt(example, self.tokenizer, self.config.data.use_chat_template)

    def _build_roles(self, model: torch.nn.Module, reward: Any, initial: torch.nn.Module) -> None:
        cfg = self.config
        model.eval()
        self.policy = PolicyRole(
            model, algo=cfg.algo, optim=cfg.optim, total_updates=cfg.train.steps,
            temperature=cfg.rollout.temperature or 1.0, norm_len=cfg.rollout.max_new_tokens,
            bf16_autocast=cfg.train.bf16_autocast, shared_prefix=cfg.train.shared_prefix,
            gradient_checkpointing=cfg.train.gradient_checkpointing,
        )  # fmt: skip
        self.reference = None
        if cfg.algo.uses_reference:
            self.reference = ReferenceRole(
                initial,
                micro_batch_size=cfg.algo.micro_batch_size,
                temperature=cfg.rollout.temperature or 1.0,
                shared_prefix=cfg.train.shared_prefix,
                bf16_autocast=cfg.train.bf16_autocast,
            )
        self.critic = None
        if cfg.algo.uses_critic:
            self.critic = CriticRole.from_policy(
                model, algo=cfg.algo, optim=cfg.optim, total_updates=cfg.train.steps,
                norm_len=cfg.rollout.max_new_tokens, shared_prefix=cfg.train.shared_prefix,
                gradient_checkpointing=cfg.train.gradient_checkpointing,
            )  # fmt: skip
        device = next(model.parameters()).device  # a reward model scores beside the policy
        self.reward = reward if reward is not None else RewardRole(cfg.reward, device=device)
        self.rollout = RolloutRole.build(model, self.tokenizer, cfg.rollout)
        self._eval_engine: Any = None if cfg.rollout.samples_off_policy else self.rollout.engine

    def _resume(self, checkpoint: Path) -> None:
        state = load_trainer_state(checkpoint, needs_critic=self.critic is not None)
        if isinstance(state.get("sampler"), dict):  # (else: the error below names it)
            self._check_draw_order(state["sampler"], checkpoint)
        try:
            self.policy.load_state_dict(state["policy"])
            if self.critic is not None:
                self.critic.load_pretrained(checkpoint / "critic")
                self.critic.load_state_dict(state["critic"])
            self.sampler.load_state_dict(state["sampler"])
            set_rng_state(state["rng"])
            self.step = int(state["step"])
        except (KeyError, TypeError, ValueError, RuntimeError, OSError) as exc:
            # A state from another model or algorithm, or edited by hand.
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise ConfigError(
                f"checkpoint.resume={checkpoint}: its trainer state does not fit this run: {detail}"
            ) from exc
        if self._in_place:
            overwrite = self.config.logging.overwrite
            drop_later_checkpoints(self.run_dir, checkpoint, self.step, overwrite)
        logger.info("resumed from %s at step %d", checkpoint, self.step)

    def _check_draw_order(self, recorded: dict[str, Any], checkpoint: Path) -> None:
        """The checkpoint's data position fits this run's prompts and order (ConfigError);
        one written before the order was recorded is checked for its size only."""
        if "n_prompts" in recorded:  # (a position counts prompts: any draw size continues it)
            check_draw_order(recorded, self._draw_order, str(checkpoint), draw_size=False)
        else:
            position = recorded.get("position", 0)
            if type(position) is not int or not 0 <= position <= len(self.train_set):
                raise ConfigError(
                    f"checkpoint.resume={checkpoint} stands at prompt {position!r} of its data "
                    f"epoch, not one of this run's training set of {len(self.train_set)}: "
                    "resume with the data.* of the run that wrote it"
                )

    # ------------------------------------------------------------------ the loop

    def fit(self, progress: Any = None, until_step: int | None = None) -> TrainResult:
        """Run up to `train.steps` steps (from the resume step), with evals and checkpoints.

        until_step: stop after this step (the schedule still spans `train.steps`), e.g. to
        simulate an interrupted run.
        """
        from yatt.evaluate import examples_due

        cfg = self.config
        save_config(cfg, self.run_dir)
        metrics_logger = self._open_sinks()
        result = TrainResult(run_dir=self.run_dir, history=metrics_logger.history)
        start_s = time.perf_counter()
        try:
            if cfg.eval.at_start and cfg.eval.n > 0 and self.step == 0:
                row = self._evaluate(metrics_logger, cfg.eval.n)
                result.evals.append((0, row["eval/accuracy"]))
            last_step = cfg.train.steps if until_step is None else min(cfg.train.steps, until_step)
            while self.step < last_step:
                metrics = self.train_step()
                self.step += 1
                limit_s = cfg.train.time_limit_s
                out_of_time = time_limit_reached(limit_s, start_s, self.step, cfg.train.steps)
                n_examples = examples_due(cfg.eval, self.step, cfg.train.steps, out_of_time)
                failed: Exception | None = None
                if n_examples:  # its seconds are logged, not kept in the step's row
                    try:
                        row = self._evaluate(None, n_examples)
                    except Exception as error:  # (a reward's bug on one completion ...)
                        failed = error  # the step trained: its row and checkpoint stand
                    else:
                        metrics |= {k: v for k, v in row.items() if k != "timing_s/eval"}
                        result.evals.append((self.step, metrics["eval/accuracy"]))
                metrics_logger.log(self.step, metrics)
                result.checkpoint = self._maybe_checkpoint(out_of_time) or result.checkpoint
                if failed is not None:
                    raise failed
                if progress is not None:
                    progress(self.step, cfg.train.steps, metrics)
                if out_of_time:
                    break
        finally:
            metrics_logger.close()
        result.wall_s = time.perf_counter() - start_s
        return result

    def train_step(self) -> dict[str, float]:
        """One RL step; returns its flat metrics dict."""
        cfg = self.config
        step_start_s, step_start_cpu_s = time.perf_counter(), time.process_time()
        batch, sample_metrics = self._gen_and_score()
        with self.timer.phase("old_logp"):
            if cfg.algo.ppo_passes > 1 or self.reference is not None:
                batch.old_logp = self.policy.logprobs(batch)
        with self.timer.phase("ref"):
            if self.reference is not None:
                batch.ref_logp = self.reference.logprobs(batch)
        with self.timer.phase("values"):
            if self.critic is not None:
                batch.values = self.critic.values(batch)
        with self.timer.phase("adv"):
            self._advantages(batch)
        batch.check("rewards", "advantages")
        with self.timer.phase("update_actor"):
            actor_metrics = self.policy.update(batch)
        critic_metrics = {}
        with self.timer.phase("update_critic"):
            if self.critic is not None:
                critic_metrics = self.critic.update(batch)
        with self.timer.phase("update_weights"):
            self.rollout.sync_weights(self.policy.model)
        timings = self.timer.pop()
        timings["timing_s/step"] = time.perf_counter() - step_start_s
        # CPU seconds of this process (all threads): with one torch thread this is the step
        # time a quiet machine would show, whatever else is running.
        timings["perf/step_cpu_s"] = time.process_time() - step_start_cpu_s
        return {**sample_metrics, **actor_metrics, **critic_metrics,
                **self._batch_metrics(batch, timings), **timings}  # fmt: skip

    # ------------------------------------------------------------------ phases

    def _sample(self, round_index: int) -> RolloutBatch:
        cfg = self.config
        indices = self.sampler.take(cfg.algo.prompts_per_step)
        n_samples = cfg.rollout.n_samples
        # Seeds are a pure function of (run seed, step, round, row): resumes replay exactly.
        # A refill round starts past every row of the one before (a round of more than 4099
        # rows reused the next round's seeds: other prompts, the same random draws).
        rows = len(indices) * n_samples
        base = (cfg.train.seed * 1_000_003 + self.step * 1009) * 4099
        base += round_index * max(4099, cfg.algo.prompts_per_step * n_samples)
        seeds = [base + row for row in range(rows)]
        group_base = (self.step * (cfg.algo.max_refill_batches + 1) + round_index) * len(indices)
        self._sampled = indices  # for naming a prompt's source when its reward fails
        examples = [self.train_set[i] for i in indices]
        rows = [e.reward_fields() for e in examples]
        try:
            return self.rollout.generate(
                [self.prompt_texts[i] for i in indices], rows,
                [group_base + k for k in range(len(indices))], seeds,
            )  # fmt: skip
        except PromptTooLong as exc:  # name the data row, not the engine's request row
            raise ConfigError(f"{exc} ({self._failed_prompt(exc.row)})") from exc

    def _gen_and_score(self) -> tuple[RolloutBatch, dict[str, float]]:
        """gen + reward phases; with dynamic sampling, drop all-equal groups and refill.

        The score and reward metrics describe the batch trained on; the reward functions'
        own metrics (`reward/*`) every row sampled in the step, dropped groups included."""
        algo = self.config.algo
        rounds = 1 + (algo.max_refill_batches if algo.dynamic_sampling else 0)
        kept: list[RolloutBatch] = []
        component_sums: dict[str, float] = {}
        counted = getattr(getattr(self.reward, "combined", None), "counted_metrics", ())
        sampled_rows, generated = 0, 0.0
        kept_groups = dropped_groups = 0
        last = None
        for round_index in range(rounds):
            with self.timer.phase("gen"):
                last = self._sample(round_index)
            with self.timer.phase("reward"):
                components = self._score(last)
            for key, value in components.items():  # means row-weighted over the rounds,
                weight = 1 if key in counted else last.size  # a scorer's counts summed
                component_sums[key] = component_sums.get(key, 0.0) + value * weight
            sampled_rows += last.size
            generated += float(last.response_mask.sum())
            if not algo.dynamic_sampling:
                kept.append(last)
                break
            keep_rows = dynamic_sampling_mask(signal_of(last), last.group_ids)
            n_groups = len(set(last.group_ids.tolist()))
            groups_here = len(set(last.group_ids[keep_rows].tolist()))
            kept_groups, dropped_groups = (
                kept_groups + groups_here,
                dropped_groups + n_groups - groups_here,
            )
            if groups_here:
                kept.append(last.select(keep_rows.nonzero().flatten()))
            if kept_groups >= algo.prompts_per_step:
                break
        assert last is not None
        # no signal anywhere: the last batch, training no row (its zero gradient still moves
        # AdamW's momentum, as any step does)
        batch = RolloutBatch.concat(kept) if kept else without_signal(last)
        metrics = {
            key: total if key in counted else total / sampled_rows
            for key, total in component_sums.items()
        }
        self._generated_tokens = generated  # every round's, for perf/gen_tokens_per_s
        if algo.dynamic_sampling:
            batch = _first_groups(batch, algo.prompts_per_step)
            metrics["batch/kept_groups"] = float(min(kept_groups, algo.prompts_per_step))
            metrics["batch/dropped_groups"] = float(dropped_groups)
        assert batch.scores is not None and batch.rewards is not None
        metrics.update({
            "critic/score/mean": float(batch.scores.mean()),
            "critic/score/max": float(batch.scores.max()),
            "critic/score/min": float(batch.scores.min()),
            "critic/rewards/mean": float(batch.rewards.mean()),
        })  # fmt: skip
        return batch.check("rewards"), metrics

    def _score(self, batch: RolloutBatch) -> dict[str, float]:
        """Set the batch's scores and rewards (scores plus the overlong penalty); returns the
        reward functions' own metrics (means over the batch's rows)."""
        algo = self.config.algo
        try:
            scores, reward_metrics = self.reward.score(batch)
        except RewardError as exc:
            raise RewardError(f"{exc} ({self._failed_prompt(exc.row)})", exc.row) from exc
        batch.scores, batch.rewards = scores, scores
        if algo.overlong_buffer > 0:
            batch.rewards = scores + overlong_penalty(
                batch.response_lengths, self.config.rollout.max_new_tokens,
                algo.overlong_buffer, algo.overlong_penalty,
            )  # fmt: skip
        return {key: float(value) for key, value in reward_metrics.items()}

    def _failed_prompt(self, row: int | None) -> str:
        """Where the prompt of a failed batch row (None: unknown) came from."""
        sources = [self.train_set[i].source or f"train prompt {i}" for i in self._sampled]
        if row is None:
            return "batch prompts from " + ", ".join(sources)
        return f"row {row} is a sample of {sources[row // self.config.rollout.n_samples]}"

    def _advantages(self, batch: RolloutBatch) -> None:
        algo = self.config.algo
        token_rewards = None
        if algo.kl_in_reward and batch.ref_logp is not None:
            assert batch.old_logp is not None
            token_rewards = kl_penalty_token_rewards(
                batch.rewards, batch.old_logp, batch.ref_logp, batch.response_mask,
                coef=algo.kl_coef, kind=algo.kl_kind,
            )  # fmt: skip
        batch.token_rewards = token_rewards
        batch.advantages, batch.returns = compute_advantages(
            algo.estimator, rewards=batch.rewards, group_ids=batch.group_ids,
            values=batch.values, mask=batch.response_mask, gamma=algo.gamma, lam=algo.lam,
            norm_std=algo.norm_std, token_rewards=token_rewards,
        )  # fmt: skip

    def _batch_metrics(self, batch: RolloutBatch, timings: dict[str, float]) -> dict[str, float]:
        lengths = batch.response_lengths
        step_s = timings["timing_s/step"]
        tokens = float(batch.attention_mask.sum())
        metrics = {
            "response_length/mean": float(lengths.mean()),
            "response_length/max": float(lengths.max()),
            "response_length/clip_ratio": sum(r == "length" for r in batch.finish_reasons)
            / max(batch.size, 1),
            "actor/entropy": self.rollout.last_entropy_estimate,
            "critic/advantages/mean": _masked_mean(batch.advantages, batch.response_mask),
            "critic/advantages/abs_mean": _masked_mean(batch.advantages.abs(), batch.response_mask),
            "perf/throughput": tokens / step_s,
            "perf/samples_per_s": batch.size / step_s,
            # every token generated for the step (dropped groups too) per second of generation
            "perf/gen_tokens_per_s": self._generated_tokens / max(timings["timing_s/gen"], 1e-9),
        }
        if batch.ref_logp is not None:
            assert batch.old_logp is not None, "old log-probs are computed whenever KL is on"
            metrics["actor/kl"] = kl_mean(batch.old_logp, batch.ref_logp, batch.response_mask)
        return metrics

    # ------------------------------------------------------------------ evals, sinks, checkpoints

    def _evaluate(self, metrics_logger: MetricsLogger | None, n_examples: int) -> dict[str, float]:
        """Held-out accuracy on the first `n_examples` problems, as a row: `eval/accuracy`,
        `eval/problems` (how many were scored) and `timing_s/eval`; logged to
        `metrics_logger` when given."""
        from yatt.evaluate import evaluate_run

        examples = self.heldout_set[:n_examples]
        if self._eval_engine is None:  # held-out accuracy is the trained (fp32) model's own
            from yatt.rollout import make_engine

            self._eval_engine = make_engine(self.config.rollout.backend, self.policy.model,
                                            self.tokenizer)  # fmt: skip
        with self.timer.phase("eval"):
            accuracy, _ = evaluate_run(self._eval_engine, self.tokenizer, examples, self.config)
        eval_s = self.timer.pop().get("timing_s/eval", 0.0)
        logger.info("step %d: held-out accuracy %.1f%% on %d (%.1f s)", self.step, 100 * accuracy,
                    len(examples), eval_s)  # fmt: skip
        row = {"eval/accuracy": accuracy, "eval/problems": len(examples), "timing_s/eval": eval_s}
        if metrics_logger is not None:
            metrics_logger.log(self.step, row)
        return row

    def _open_sinks(self) -> MetricsLogger:
        path = self.run_dir / "metrics.jsonl"
        if self.step == 0:
            path.unlink(missing_ok=True)
        else:
            truncate_metrics(path, self.step)
        board = self.run_dir / "tensorboard" if self.config.logging.tensorboard else None
        return MetricsLogger.to_files(path, board, self.step)

    def _maybe_checkpoint(self, out_of_time: bool = False) -> Path | None:
        """The checkpoint due after this step (`checkpoint_due`), if one is."""
        cfg = self.config.checkpoint
        if not checkpoint_due(self.config, self.step, out_of_time):
            return None
        return save_training_checkpoint(
            self.run_dir, self.step, config=self.config, policy=self.policy,
            tokenizer=self.tokenizer, critic=self.critic, keep_last=cfg.keep_last,
            trainer_state={
                "sampler": {**self.sampler.state_dict(), **self._draw_order},
                "rng": rng_state(),
            },
        )  # fmt: skip


def _first_groups(batch: RolloutBatch, n_groups: int) -> RolloutBatch:
    """Rows of the first `n_groups` distinct groups (in row order)."""
    wanted: list[int] = []
    for group in batch.group_ids.tolist():
        if group not in wanted:
            wanted.append(group)
    keep = set(wanted[:n_groups])
    return batch.select([i for i, g in enumerate(batch.group_ids.tolist()) if g in keep])


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))
