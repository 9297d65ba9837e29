"""RankWorker: the process that runs on one device and hosts a policy rank, a sampler, a reward
service, or several of them (colocation); in parallel mode it is also the controller of its
data-parallel group.

Every worker rebuilds the model (a seeded init or a folder) and the prompt set from the Config,
so a request names prompts by index and no prompt text crosses a process boundary. Phases are
recorded as (device, role, phase, start, end) events for the timeline.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from yatt.algos.kl import kl_mean
from yatt.config import Config
from yatt.control.config import ControlConfig, driver_scores, make_reward_role
from yatt.control.devices import Device
from yatt.control.shards import Shard, ShardRequest, actor_terms, make_features
from yatt.control.transfer import pack, unpack
from yatt.data import draw_order
from yatt.errors import ConfigError, PromptTooLong
from yatt.lora import (
    check_same_base,
    has_lora,
    load_trained_state,
    read_adapters,
    trained_state,
)
from yatt.run_checks import (
    check_budgets_fit_model,
    check_prompts_fit_model,
    check_rows_have_answers,
)

__all__ = ["Collective", "RankWorker", "effective_staleness", "peak_rss_mb", "sample_version"]

logger = logging.getLogger(__name__)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sample_version(step: int, staleness: int, first_step: int = 0) -> int:
    """The policy version (number of updates) step `step` samples with: `staleness` behind,
    but never older than the weights a (re)started run began from (`first_step`)."""
    return max(step - staleness, first_step)


def effective_staleness(control: ControlConfig) -> int:
    """Generation may run up to `control.async_staleness` versions behind training when the
    samplers have devices of their own (disaggregated). Colocated samplers share the policy's
    module and sample with the latest weights; partial colocation's samplers sit on devices
    that also train, so overlapping generation with training there would only make the two
    fight for those devices (measured: 2x slower steps on 2 CPU cores): it samples in sync."""
    return control.async_staleness if control.placement == "disaggregated" else 0


def _moved(tensor: torch.Tensor, target: torch.device) -> torch.Tensor:
    """`tensor` on `target`; host copies are pinned so the copies back are asynchronous."""
    if target.type == "cpu":
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        return host.copy_(tensor, non_blocking=True)
    return tensor.to(target, non_blocking=True)


class Collective:
    """Global reductions among the policy ranks (torch.distributed: gloo on CPU, NCCL on GPU)."""

    def __init__(self, init_method: str, rank: int, world: int, device: Device) -> None:
        import torch.distributed as dist

        backend = "nccl" if device.kind == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
        self.rank, self.world = rank, world
        self.device = device.torch_device()
        self.reduce_s = 0.0

    def _all_reduce(self, tensor: torch.Tensor, op: Any = None) -> torch.Tensor:
        import torch.distributed as dist

        start_s = time.perf_counter()
        moved = tensor.to(self.device)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM if op is None else op)
        if self.device.type == "cuda":  # NCCL returns before the reduction is done
            torch.cuda.synchronize(self.device)
        self.reduce_s += time.perf_counter() - start_s
        return moved.to(tensor.device)

    def sum_scalar(self, value: float) -> float:
        """The sum of `value` over ranks (e.g. the loss normaliser of the global batch)."""
        return float(self._all_reduce(torch.tensor([value], dtype=torch.float64))[0])

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(tensor)

    def max_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise maximum of `tensor` over ranks."""
        import torch.distributed as dist

        return self._all_reduce(tensor, dist.ReduceOp.MAX)

    def sum_grads(self, params: list[torch.Tensor]) -> None:
        """Sum gradients over ranks in one flat all-reduce (losses are pre-divided by the
        global normaliser, so the sum is the full-batch gradient)."""
        grads = [p.grad for p in params]
        flat = self._all_reduce(torch.cat([g.flatten() for g in grads]))
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RankWorker:
    """Hosts the roles in `roles` (subset of "policy", "sampler", "reward") on `device`."""

    def __init__(self, config: Config, control: ControlConfig, device: Device,
                 roles: tuple[str, ...], name: str) -> None:  # fmt: skip
        if control.backend == "ray":
            device.bind()
        else:
            torch.set_num_threads(max(config.train.torch_threads, 1))
        self.device, self.roles, self.name = device, roles, name
        self.events: list[tuple] = []  # (device, role, phase, start_s, end_s[, tokens])
        self.collective: Collective | None = None
        self.rank, self.world = 0, 1
        self.reset(config, control)

    def reset(self, config: Config, control: ControlConfig, roles: tuple[str, ...] = (),
              name: str = "", device: Device | None = None) -> None:  # fmt: skip
        """(Re)build model, roles and plans from `config`, keeping the process and its process
        group: a test or benchmark can run several configurations on the same workers. With
        `roles`, the process takes on those roles (and `name`, and `device`: a CPU process
        re-pins itself) instead and leaves its process group (a runtime re-placement reuses
        worker processes; `init_collective` joins anew). A policy rank that stays one keeps its
        policy (model, optimizer and schedule: every data-parallel rank holds the same), so a
        move hands state only to processes that were not policy ranks. With `roles` and the
        same config, the others keep their module and the weights it holds
        (`_module_to_reuse`): a move's hand-over (`import_state`) then sets them. A reward
        service alone holds no module, so one given a policy or sampler role loads the model."""
        kept = getattr(self, "policy", None)
        if not roles or "policy" not in roles or config != self.config:
            kept = None
        # a policy or sampler holds the module, and a fresh spare (no roles) keeps it for later
        held_by = roles or self.roles
        holds_module = not held_by or bool({"policy", "sampler"} & set(held_by))
        reuse = roles and kept is None and holds_module
        reused = self._module_to_reuse(config, roles) if reuse else None
        # the old roles and module go before the new ones are built (no two held at once)
        self.policy = self.rollout = self.reference = self.reward = self.model = None
        if device is not None and device != self.device:
            assert device.kind == self.device.kind == "cpu", f"{self.device.name} -> {device.name}"
            self.device = device
            if control.backend == "ray":
                device.bind()
        if roles:
            if self.collective is not None:
                self.collective.close()
            self.collective, self.rank, self.world = None, 0, 1
            self.roles, self.name = roles, name or self.name
        self.config, self.control = config, control
        if kept is not None:
            model = kept.model
        elif not holds_module:
            # a reward service alone loads no policy weights (on a GPU they would sit beside
            # a policy rank's); a move that gives it a module's role loads the model then
            model = None
        else:
            model = self._module_on_device(config, control, reused)
        self.model = model  # kept for later roles (`_module_to_reuse`)
        self._staged: dict[int, dict[str, Any]] = {}  # packed weights by version
        self.holds_state = kept is not None
        self.policy = kept or (self._build_policy(model) if "policy" in self.roles else None)
        if self.policy is not None:  # a kept policy drops the process group it left
            self.policy.collective = self.collective
        if kept is not None:
            # a time-shared placement keeps the moments in host memory between updates, a
            # disaggregated rank never swaps: put them where the new placement keeps them
            self._move_optimizer_state(onto_device=control.placement == "disaggregated")
        # the reference, the initial policy for the KL loss term: a frozen copy, or with LoRA
        # the policy's module with its adapters off (a kept policy's too)
        if self.policy is not None and config.algo.uses_reference:
            assert kept is None or has_lora(model), "re-placement with a KL term needs LoRA"
            self.reference = self._build_reference(model)
        self.rollout = self._build_rollout(model) if "sampler" in self.roles else None
        scores = "reward" in self.roles and not driver_scores(config, control)
        self.reward = (
            make_reward_role(config, control, self.device.torch_device()) if scores else None
        )
        self.weights_version = 0
        self.sampler: Any = None  # handles used in parallel mode (None = this worker)
        self.reward_service: Any = None
        self.owns_sampler = False
        self.first_step = 0

    def _module_on_device(
        self, config: Config, control: ControlConfig, reused: torch.nn.Module | None
    ) -> torch.nn.Module:
        """The policy module on this process's device: `reused` (a move's), or loaded anew
        with the data, whose rows and prompts are checked against the model first."""
        from yatt.builders import build_data, build_model

        if reused is None:
            reused, self.tokenizer = build_model(config.model)
            self.train_set, self.heldout_set = build_data(config.data)
            check_rows_have_answers(config, self.train_set, self.heldout_set)
            check_prompts_fit_model(
                config, reused, self.tokenizer, self.train_set, self.heldout_set,
                length_schedule=control.length_schedule,
            )  # fmt: skip
            self._rendered: dict[int, str] = {}
        check_budgets_fit_model(config, reused, length_schedule=control.length_schedule)
        model = reused.to(self.device.torch_device()).eval()
        for param in model.parameters():  # a former policy's gradients
            param.grad = None
        return model

    # ------------------------------------------------------------------ set-up

    def _module_to_reuse(self, config: Config, roles: tuple[str, ...]) -> torch.nn.Module | None:
        """The module this process holds, for new `roles` under the same `config`, so a move
        does not load the model again (a hand-over then sets its weights: `import_state`);
        None where it must be loaded afresh: another config, or a new policy rank's KL
        reference to copy from it (the copy must hold the initial weights; with LoRA the
        reference is the base itself)."""
        model = getattr(self, "model", None)
        if model is None or config != self.config:
            return None
        if "policy" in roles and config.algo.uses_reference and not has_lora(model):
            return None
        return model

    def _build_policy(self, model: torch.nn.Module) -> Any:
        from yatt.roles.policy import PolicyRole

        cfg = self.config
        return PolicyRole(
            model, algo=cfg.algo, optim=cfg.optim, total_updates=cfg.train.steps,
            temperature=cfg.rollout.temperature or 1.0, norm_len=cfg.rollout.max_new_tokens,
            bf16_autocast=cfg.train.bf16_autocast, shared_prefix=cfg.train.shared_prefix,
            gradient_checkpointing=cfg.train.gradient_checkpointing,
        )  # fmt: skip

    def _build_reference(self, model: torch.nn.Module) -> Any:
        from yatt.roles.reference import ReferenceRole

        cfg = self.config
        return ReferenceRole(
            model, micro_batch_size=cfg.algo.micro_batch_size,
            temperature=cfg.rollout.temperature or 1.0, shared_prefix=cfg.train.shared_prefix,
            bf16_autocast=cfg.train.bf16_autocast,
        )  # fmt: skip

    def _build_rollout(self, model: torch.nn.Module) -> Any:
        from yatt.roles.rollout import RolloutRole

        return RolloutRole.build(model, self.tokenizer, self.config.rollout)

    def rendezvous_address(self) -> str:
        """A tcp:// address on this worker's host with a free port, for the process group."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        host = socket.gethostbyname(socket.gethostname())
        return f"tcp://{host}:{port}"

    def init_collective(self, init_method: str, rank: int, world: int) -> int:
        """Join the policy ranks' process group (world > 1) and hook it into the update."""
        assert self.policy is not None, f"{self.name} hosts no policy"
        self.rank, self.world = rank, world
        if world > 1:
            self.collective = Collective(init_method, rank, world, self.device)
            self.policy.collective = self.collective
        return rank

    def connect(self, sampler: Any, reward_service: Any, owns_sampler: bool) -> None:
        """Parallel mode: the sampler and reward handles this group calls (None = self)."""
        self.sampler, self.reward_service, self.owns_sampler = sampler, reward_service, owns_sampler

    @contextmanager
    def _phase(self, role: str, phase: str) -> Iterator[list[int]]:
        """Record the phase as one event per core; what the body appends to the list it gets
        rides at the end of the event (a gen's decode steps: `timeline.Span.tokens`)."""
        start_s, extra = time.time(), []
        try:
            yield extra
        finally:
            end_s = time.time()  # a multi-core worker's phase occupies each of its cores
            self.events += [(index, role, phase, start_s, end_s, *extra)
                            for index in self.device.indices]  # fmt: skip

    def drain_events(self) -> list[tuple]:
        """The events since the last drain: (device, role, phase, start_s, end_s[, tokens])."""
        events, self.events = self.events, []
        return events

    def stats(self) -> dict[str, float]:
        return {
            "peak_rss_mb": peak_rss_mb(),
            "allreduce_s": self.collective.reduce_s if self.collective else 0.0,
        }

    # ------------------------------------------------------------------ services

    def _prompt(self, index: int) -> str:
        from yatt.data import render_prompt

        if index not in self._rendered:
            example = self.train_set[index]
            self._rendered[index] = render_prompt(
                example, self.tokenizer, self.config.data.use_chat_template
            )
        return self._rendered[index]

    def generate(self, request: ShardRequest, version: int) -> Shard:
        """Sampler service: the shard's completions (+ features) under policy `version`."""
        assert self.rollout is not None, f"{self.name} hosts no sampler"
        if version != self.weights_version:
            assert version in self._staged, f"{self.name}: weights v{version} never arrived"
            with self._phase("sampler", "load_weights"):
                self.rollout.engine.load_state_dict(unpack(self._staged[version], copy=False))
                self.weights_version = version
        if request.max_new_tokens:
            self.rollout.params = dataclasses.replace(
                self.rollout.params, max_new_tokens=request.max_new_tokens
            )
        engine_logp = request.behaviour_logp and self._engine_logp_is_behaviour()
        start_s = time.perf_counter()
        with self._phase("sampler", "gen") as decoded:
            examples = [self.train_set[i] for i in request.prompt_indices]
            try:
                batch = self.rollout.generate(
                    [self._prompt(i) for i in request.prompt_indices],
                    [e.reward_fields() for e in examples],
                    list(request.group_ids), list(request.seeds), sampler_logprobs=engine_logp,
                )  # fmt: skip
            except PromptTooLong as exc:  # name the data row, not the engine's request row
                index = request.prompt_indices[exc.row // self.config.rollout.n_samples]
                source = self.train_set[index].source or f"train prompt {index}"
                raise ConfigError(f"{exc} (a sample of {source})") from exc
            decoded.append(int(batch.response_lengths.max()))  # the call's decode steps
            features = make_features(request.seeds, self.control.payload_bytes)
        gen_s = time.perf_counter() - start_s
        if engine_logp:  # the sampling distribution is the trainer's: no second forward pass
            batch.old_logp, batch.behaviour_logp = batch.behaviour_logp, None
        elif request.behaviour_logp:
            with self._phase("sampler", "behaviour_logp"):
                batch.old_logp = self._behaviour_logprobs(batch)
        return Shard(request.rank, request.step, batch, features, gen_s)

    def _engine_logp_is_behaviour(self) -> bool:
        """True when the engine's per-token log-probs are those the trainer would compute for
        the sampling weights: yatt engine, fp32, temperature-only sampling (no top-k/top-p
        filter), and a trainer computing in fp32 too (not ``train.bf16_autocast``), so they
        serve as the async batch's behaviour log-probs (up to fp32 rounding between a
        KV-cached decode and a full forward)."""
        rollout = self.config.rollout
        plain = rollout.top_p == 1.0 and rollout.top_k == 0
        fp32 = not self.config.train.bf16_autocast
        return rollout.backend == "yatt" and not rollout.samples_off_policy and plain and fp32

    def _behaviour_logprobs(self, batch: Any) -> torch.Tensor:
        """(B, R) log-probs of the sampled tokens under the weights that sampled them."""
        from yatt.roles.policy import compute_logprobs, logprob_autocast

        assert self.rollout is not None, f"{self.name} hosts no sampler"
        cfg, model = self.config, self.rollout.engine.model
        return compute_logprobs(
            model, batch, cfg.algo.micro_batch_size, cfg.rollout.temperature or 1.0,
            logprob_autocast(model, cfg.train.bf16_autocast), cfg.train.shared_prefix,
        )  # fmt: skip

    def score(self, shard: Shard) -> tuple[torch.Tensor, dict[str, float]]:
        """Reward service: (B,) rewards of the shard's completions, and the reward functions'
        own metrics (means over its rows, and the scorers' declared counts)."""
        assert self.reward is not None, f"{self.name} hosts no reward service"
        with self._phase("reward", "reward"):
            rewards, metrics = self.reward.score(shard.batch)
        return rewards, self.reward.summable_metrics(metrics)

    def evaluate(self, n_examples: int) -> tuple[int, int]:
        """Greedy held-out accuracy of this rank's policy on its share (every `world`-th) of
        the first `n_examples` held-out problems: (correct, evaluated). The ranks hold the same
        weights, so their shares add up to the whole set's score."""
        from yatt.evaluate import evaluate_run

        assert self.policy is not None, f"{self.name} hosts no policy"
        numbers = range(self.rank, min(n_examples, len(self.heldout_set)), self.world)
        if not numbers:  # fewer problems than ranks
            return 0, 0
        # built for each evaluation where the sampler's engine does not serve (its fused
        # weight copies would otherwise hold device memory for the rest of the run)
        engine = self._policy_engine()
        with self._phase("policy", "eval"):
            _, records = evaluate_run(
                engine, self.tokenizer, [self.heldout_set[i] for i in numbers], self.config,
                numbers=numbers,
            )  # fmt: skip
        return sum(record["correct"] for record in records), len(records)

    def _policy_engine(self) -> Any:
        """A decoding engine over the policy's own (live) weights: this rank's sampler engine
        where it runs them in full precision, else a new one over them (never a vLLM engine,
        which would hold a copy that no update reaches)."""
        from yatt.rollout import make_engine

        assert self.policy is not None, f"{self.name} hosts no policy"
        rollout = self.config.rollout
        engine = None if self.rollout is None else self.rollout.engine
        shared = engine is not None and engine.shares_weights(self.policy.model)  # not vLLM
        if shared and not rollout.samples_off_policy:
            return engine
        backend = "yatt" if rollout.backend == "vllm" else rollout.backend
        return make_engine(backend, self.policy.model, self.tokenizer)

    def decode_step_s(self, tokens: int = 16) -> float:
        """Sampler: seconds of one decode step at batch 1 on this worker's devices (best of
        two runs of `tokens` steps of the first training prompt, after one warm-up; the
        prompt's prefill is in the time, about one step in `tokens`): the generation floor per
        response token that runtime re-placement plans with."""
        assert self.rollout is not None, f"{self.name} hosts no sampler"
        assert tokens >= 1, f"tokens={tokens}"
        engine = self.rollout.engine
        prompt = self.rollout.encode([self._prompt(0)])
        params = dataclasses.replace(self.rollout.params, max_new_tokens=tokens, ignore_eos=True)
        engine.generate(prompt, dataclasses.replace(params, max_new_tokens=2), seeds=[0])
        best_s = math.inf
        for seed in (1, 2):
            start_s = time.perf_counter()
            [completion] = engine.generate(prompt, params, seeds=[seed])
            best_s = min(best_s, (time.perf_counter() - start_s) / len(completion.token_ids))
        return best_s

    # The thread-scaling probes below run before a run's first step, while every other worker
    # idles: a probe may pin its worker to cores another worker owns.

    def decode_scaling(self, cores: int) -> tuple[float, float]:
        """Sampler on a CPU device (`control.cpu_mapping=threads`): `decode_step_s` pinned to
        one core, then with `cores` threads on the run's first `cores` cores; the worker is
        pinned back to its device after. Runtime re-placement's Amdahl fraction of the decode
        floor comes from the pair."""
        return self._on_one_and_many(cores, self.decode_step_s)

    def update_scaling(self, cores: int, rows: int, tokens: int) -> tuple[float, float]:
        """Policy rank on a CPU device: an update's forward and backward passes over `rows`
        rows of `tokens` response tokens (`PolicyRole.probe_pass`: no optimizer step, the
        policy stays as it was), on one core and then with `cores` threads, as
        `decode_scaling`; each the median of 3 after an untimed pass (the first allocates the
        activations and the gradients' first touch)."""
        assert self.policy is not None, f"{self.name} hosts no policy"
        policy, batch = self.policy, self._probe_batch(rows, tokens)

        def update_s() -> float:
            policy.probe_pass(batch)
            times = []
            for _ in range(3):
                start_s = time.perf_counter()
                policy.probe_pass(batch)
                times.append(time.perf_counter() - start_s)
            return sorted(times)[1]

        return self._on_one_and_many(cores, update_s)

    def _on_one_and_many(self, cores: int, measure: Any) -> tuple[float, float]:
        assert self.device.kind == "cpu" and self.control.backend == "ray", (
            f"{self.name}: thread scaling needs a pinned CPU worker (Ray), not "
            f"{self.device.name} on {self.control.backend}"
        )
        assert cores >= 2, f"cores={cores}"
        try:
            Device("cpu", self.device.index).bind()
            one_s = measure()
            Device("cpu", 0, cores).bind()
            return one_s, measure()
        finally:
            self.device.bind()

    def _probe_batch(self, rows: int, tokens: int) -> Any:
        """`RolloutBatch.synthetic` of the first training prompt, in groups of
        `rollout.n_samples` rows, with zero reference log-probs where the loss has a KL term."""
        from yatt.batch import RolloutBatch

        assert self.policy is not None, f"{self.name} hosts no policy"
        prompt = self.tokenizer(self._prompt(0), add_special_tokens=False)["input_ids"]
        vocab = self.policy.model.get_input_embeddings().num_embeddings
        batch = RolloutBatch.synthetic(prompt, rows, tokens, vocab, self.config.rollout.n_samples)
        if self.config.algo.kl_coef > 0 and not self.config.algo.kl_in_reward:
            batch.ref_logp = torch.zeros_like(batch.response_mask)
        return batch

    def load_weights(self, version: int, state: dict[str, Any]) -> int:
        """Sampler: stage the policy weights of `version` (weight sync; `state` as `weights(
        packed=True)` gives it). A request names the version it needs, so the order in which
        pushes and requests arrive does not matter; the versions an in-flight async request
        may still name (k + 1 back) are kept."""
        assert self.rollout is not None, f"{self.name} hosts no sampler"
        self._staged[version] = state
        keep_from = version - effective_staleness(self.control) - 1
        for old in [v for v in self._staged if v < keep_from]:
            del self._staged[old]
        return version

    def weights(self, packed: bool = False) -> dict[str, Any]:
        """The policy's weights on the host; `packed` for a transfer (see transfer.py)."""
        assert self.policy is not None, f"{self.name} hosts no policy"
        trained = trained_state(self.policy.model)  # with LoRA: the adapters alone
        state = {k: v.detach().to("cpu") for k, v in trained.items()}
        return pack(state) if packed else state

    # ------------------------------------------------------------------ training

    def update(self, shard: Shard) -> dict[str, float]:
        """Policy rank: one update on this shard (advantages set); grads are summed over ranks.
        Returns its metrics as terms that add up over ranks (`shards.actor_terms`)."""
        assert self.policy is not None, f"{self.name} hosts no policy"
        swap_s = self._swap_optimizer(onto_device=True)
        with self._phase("policy", "update_actor"):
            batch = shard.batch  # async shards carry the sampler's behaviour log-probs
            reference = self.reference
            several = self.config.algo.ppo_passes > 1
            if (several or reference is not None) and batch.old_logp is None:
                batch.old_logp = self.policy.logprobs(batch)
            if reference is not None:  # the trainer's order: old, then reference log-probs
                batch.ref_logp = reference.logprobs(batch)
            metrics = self.policy.update(batch)
            if reference is not None:  # KL of the sampling policy (async: the behaviour one)
                metrics["actor/kl"] = kl_mean(batch.old_logp, batch.ref_logp, batch.response_mask)
            metrics["batch/feature_checksum"] = float(shard.features.sum(dtype=torch.int64))
        metrics["timing_s/swap"] = swap_s + self._swap_optimizer(onto_device=False)
        if self.rollout is not None:  # a colocated sampler moves on with the policy
            if not self.rollout.engine.shares_weights(self.policy.model):  # its own copy (vLLM)
                with self._phase("sampler", "load_weights"):
                    self.rollout.sync_weights(self.policy.model)
            self.weights_version += 1
        return actor_terms(metrics, self.policy.metric_weights)

    def _swap_optimizer(self, onto_device: bool) -> float:
        """Where the device is time-shared (every placement but disaggregated), the optimizer
        state waits in pinned host memory while others use the device, and comes back for the
        update. On CPU devices host memory is the device: a timed no-op. Returns seconds."""
        assert self.policy is not None, f"{self.name} hosts no policy"
        if self.control.placement == "disaggregated":
            return 0.0
        start_s = time.perf_counter()
        with self._phase("policy", "swap"):
            self._move_optimizer_state(onto_device)
        return time.perf_counter() - start_s

    def _move_optimizer_state(self, onto_device: bool) -> None:
        """Adam's moments onto this rank's GPU or into pinned host memory (CPU: nothing)."""
        assert self.policy is not None, f"{self.name} hosts no policy"
        if self.device.kind != "cuda":
            return
        target = self.device.torch_device() if onto_device else torch.device("cpu")
        for state in self.policy.optimizer.state.values():
            for key, value in state.items():  # moments move; the step count stays
                if torch.is_tensor(value) and value.dim() and value.device != target:
                    state[key] = _moved(value, target)
        torch.cuda.synchronize(self.device.torch_device())

    def save_policy(self, folder: str) -> str:
        """Write this rank's policy and the tokenizer as a model folder (every data-parallel
        rank holds the same weights after an update); returns the folder."""
        from pathlib import Path

        assert self.policy is not None, f"{self.name} holds no policy rank"
        return str(self.policy.save_pretrained(Path(folder), self.tokenizer))

    def export_state(self, with_optimizer: bool = True) -> dict[str, Any]:
        """Weights (and optimizer/scheduler state) of this policy rank, for a re-placement;
        packed for the transfer (see transfer.py)."""
        assert self.policy is not None, f"{self.name} hosts no policy"
        state: dict[str, Any] = {"weights": self.weights()}
        if with_optimizer:
            state["policy"] = self.policy.state_dict()
        return pack(state)

    def import_state(self, state: dict[str, Any], step: int) -> int:
        """Continue a run at `step` from `export_state` output: load weights (and optimizer
        state on policy ranks that did not keep theirs; see `reset`); a policy rank's prompt
        queue starts after the steps done."""
        if self.policy is not None and not self.holds_state:
            assert "policy" in state, f"{self.name}: a new policy rank needs optimizer state"
            self._adopt(unpack(state["weights"], copy=False), unpack(state["policy"]), step)
        else:
            self._adopt(unpack(state["weights"], copy=False) if state else None, None, step)
        return step

    def save_checkpoint(self, run_dir: str, step: int, control_state: dict[str, Any]) -> str:
        """Policy rank: write the checkpoint of `step` (steps done) into `run_dir`: this rank's
        weights, optimizer and schedule (every data-parallel rank holds the same) and the
        controllers' `control_state` with what the prompt order depends on (`draw_order`), in
        the trainer's layout (yatt.checkpoint); returns the folder."""
        from pathlib import Path

        from yatt.checkpoint import save_training_checkpoint

        assert self.policy is not None, f"{self.name} holds no policy rank"
        with self._phase("policy", "checkpoint"):
            folder = save_training_checkpoint(
                Path(run_dir), step, config=self.config, policy=self.policy,
                tokenizer=self.tokenizer, trainer_state={},
                control_state={**control_state, **draw_order(self.config, self.train_set)},
                keep_last=self.config.checkpoint.keep_last,
            )  # fmt: skip
        return str(folder)

    def restore(self, checkpoint: str, step: int) -> int:
        """Continue a run at `step` from a checkpoint folder the controllers wrote: every
        worker reads what it needs from disk (the policy's weights; a policy rank also its
        optimizer and schedule), so no state passes through the driver. The KL reference stays
        the configured initial model."""
        from pathlib import Path

        from yatt.checkpoint import CONTROLLERS, load_trainer_state, policy_folder
        from yatt.models import load_model

        state, weights = None, None
        if self.policy is not None:
            state = load_trainer_state(Path(checkpoint), writer=CONTROLLERS)["policy"]
        model = self.policy.model if self.policy is not None else None
        if model is None and self.rollout is not None:  # a reward service holds none
            model = self.rollout.engine.model
        folder = policy_folder(Path(checkpoint))
        if model is not None and has_lora(model):  # the base is this run's model.path
            weights = read_adapters(folder, model)
        elif model is not None:
            weights = load_model(folder).state_dict()  # a passing copy
        self._adopt(weights, state, step)
        if model is not None and has_lora(model):
            check_same_base(model, folder, self.config.model.path)
        return step

    def _adopt(self, weights: dict[str, Any] | None, policy_state: dict[str, Any] | None,
               step: int) -> None:  # fmt: skip
        """Take on `weights` (None: this process kept its own) and, on a policy rank, the
        optimizer and schedule `policy_state` at `step`; a sampler with its own copy of the
        weights (a separate worker, or a vLLM engine) gets them too."""
        self.first_step = self.weights_version = step
        if self.policy is not None and policy_state is not None:
            assert weights is not None, f"{self.name}: optimizer state without weights"
            load_trained_state(self.policy.model, weights)
            self.policy.load_state_dict(policy_state)  # updated in place later
            if self.control.placement != "disaggregated":  # loading put the moments on the
                self._move_optimizer_state(onto_device=False)  # device: park them till update
            self.holds_state = True
        if self.rollout is None:
            return
        if self.policy is not None:
            self.rollout.sync_weights(self.policy.model)  # a no-op where it samples the module
        elif weights is not None:
            self.rollout.engine.load_state_dict(weights)
