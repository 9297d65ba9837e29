"""yatt's own batched rollout engine: prefill + KV-cache decode over any HF causal LM.

Prompts are laid out in a preallocated cache (`kv.py`): identical prompts (a GRPO group) and a
prefix common to all (a chat template's system prompt) are prefilled once; the engine builds
position ids and 4D masks itself and samples with per-request uniforms (`sampling.py`).
Llama-family models run yatt's fused decoder (`decoder.py`), others HF's forward (`forward.py`).
Two decode loops: dynamic (CPU default) drops finished rows from the batch as they accumulate;
static (CUDA default, `static.py`) keeps shapes fixed, replays each step as a CUDA graph and reads
tokens back only every `sync_every` steps. The model object is used as is, never copied: a
colocated trainer that updates it is seen by the next `generate`.
"""

import logging
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from yatt.errors import ConfigError, PromptTooLong
from yatt.lora import load_trained_state
from yatt.rollout.forward import DecoderForward, make_forward
from yatt.rollout.kv import PromptLayout
from yatt.rollout.sampling import SamplingParams, check_logprob, draw_uniforms, sample_next
from yatt.rollout.static import decode_static

__all__ = ["Completion", "RolloutEngine", "eos_token_ids", "model_positions"]

logger = logging.getLogger(__name__)


@dataclass
class Completion:
    """One sampled completion.

    token_ids include the EOS or stop-completing token; `text` is their decoding without
    special tokens; `logprobs[i]` is the log-prob of `token_ids[i]` under the sampling
    distribution (temperature, top-k, top-p applied; temperature 1 for greedy).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    logprobs: list[float] = field(default_factory=list)


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Token ids that end a completion: the generation config's EOS ids and the tokenizer's."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


@dataclass
class _Row:
    """Host-side state of one request while it decodes."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


class EngineBase:
    """What every rollout backend shares around its ``generate``: text prompts, weight loading."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Completion]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy new weights into the sampled model (for a separate, non-shared copy): a
        whole state dict, or `yatt.lora.trained_state` (the adapters of an adapted model)."""
        load_trained_state(self.model, state)

    def shares_weights(self, module: torch.nn.Module) -> bool:
        """Whether sampling reads ``module``'s live weights (so an update needs no push)."""
        return self.model is module

    def generate_text(
        self, prompts: list[str], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Completion]:
        """Tokenize raw text prompts (no chat template, no added special tokens) and generate."""
        prompt_ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(prompt_ids, params, seeds)


class RolloutEngine(EngineBase):
    """Batched KV-cache sampler over a Hugging Face causal LM (shares the model's weights)."""

    # Drop finished rows from the batch once they are at least this fraction of it: a gather of
    # the cache costs about one decode step's memory traffic, a finished row costs compute.
    compact_fraction = 0.125
    # Prefill a prefix common to all prompts once when it is at least this long (tokens).
    min_shared_prefix = 16

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        static: bool | None = None,
        sync_every: int | None = None,
        cuda_graphs: bool | None = None,
        prepack: bool | None = None,
    ) -> None:
        """Args:
        model: the causal LM to sample from; used in place, never copied.
        tokenizer: its tokenizer (EOS, padding, stop-string decoding).
        device: where the batch lives; default the model's device.
        dtype: compute dtype for rollouts (e.g. torch.bfloat16 on a CPU with bf16 support);
            None runs the model's own weights. Another dtype runs a cast copy of the
            weights that is refreshed whenever a parameter changes, so it is never stale.
        static: decode with fixed shapes (no dropping of finished rows, attention over the
            whole cache under a mask) so a step can be replayed as a CUDA graph; default on
            CUDA for Llama-family models (`LlamaDecoder.supports`), which it needs; other
            models decode dynamically through HF's forward.
        sync_every: read sampled tokens back to the host every this many steps (stop checks
            and early exit); default 1 for dynamic decoding, 16 for static.
        cuda_graphs: replay the static decode step as a CUDA graph; default on for static
            decoding on CUDA.
        prepack: run the fused decoder's matmuls on oneDNN-reordered weight copies (CPU);
            default on where supported. Costs a reorder per weight refresh (measured 0.2-0.5 CPU-s
            fp32, 0.15 bf16 for SmolLM2-135M) and saves 1.1-1.6x of every decode step.
        Raises:
            ConfigError: static decoding of an unsupported model, CUDA graphs off CUDA or
                without static decoding, or sync_every < 1.
        """
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else model.device
        self._forward = make_forward(model, dtype, prepack)
        on_cuda = self.device.type == "cuda"
        fused = isinstance(self._forward, DecoderForward)
        self.static = (on_cuda and fused) if static is None else static
        if self.static and not isinstance(self._forward, DecoderForward):
            raise ConfigError(
                f"static decoding needs a Llama-family model, got {model.config.model_type!r}"
            )
        self.sync_every = sync_every if sync_every is not None else (16 if self.static else 1)
        if isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int):
            raise ConfigError(f"sync_every must be an int >= 1, got {self.sync_every!r}")
        if self.sync_every < 1:
            raise ConfigError(f"sync_every must be an int >= 1, got {self.sync_every!r}")
        self.cuda_graphs = (on_cuda and self.static) if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and not (on_cuda and self.static):
            raise ConfigError(
                f"cuda_graphs needs static decoding on a CUDA device, got device {self.device}"
            )
        self._pad_id = _pad_token_id(tokenizer)

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Completion]:
        """Sample one completion per prompt, in order.

        Args:
            prompt_ids: token ids of each prompt (any lengths, each non-empty).
            params: sampling parameters.
            seeds: one seed per prompt; row i's sample depends only on seeds[i], its prompt and
                the weights. None draws seeds from torch's global generator.
        Raises:
            ConfigError: a malformed request (prompts as non-empty lists of token ids in the
                vocabulary, one int seed each in [-2**63, 2**64));
                PromptTooLong: a prompt plus the budget needs more positions than the model has.
            SamplingError: the policy's logits held a NaN or an infinity at some decode step
                (found when the step's tokens are read back, every `sync_every` steps).
        """
        _check_request(prompt_ids, seeds, params.max_new_tokens, self.model)
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompt_ids),)).tolist()
        was_training = self.model.training
        self.model.eval()
        # a GPU other than the process's current one: its streams and graph capture too
        on_device = torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext()
        try:
            with torch.inference_mode(), on_device:
                rows = self._run(prompt_ids, params, seeds)
        finally:
            self.model.train(was_training)
        return [self._to_completion(row) for row in rows]

    def _run(
        self, prompt_ids: list[list[int]], params: SamplingParams, seeds: list[int]
    ) -> list[_Row]:
        rows = [_Row(prompt_ids=list(p)) for p in prompt_ids]
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        # Identical prompts (a GRPO group) are prefilled once; their cache rows are then copied.
        unique, inverse = _dedupe(prompt_ids)
        layout = PromptLayout.build(
            unique, params.max_new_tokens, self._pad_id, self.device, self.min_shared_prefix
        )
        uniforms = draw_uniforms(seeds, params.max_new_tokens, self.device)  # (B, N)
        self._forward.prepare(layout.capacity, self.device)
        n_rows = 1 if layout.prefix_len else len(unique)  # a shared prefix fills one row first
        cache = self._forward.new_cache(n_rows, layout.capacity, self.device)
        logits = self._prefill(layout, cache)  # (U, V)
        if len(unique) < len(rows):
            expand = torch.tensor(inverse, device=self.device)
            self._forward.select(cache, expand)
            layout.select(expand)
            logits = logits.index_select(0, expand)  # (B, V)
        if self.static:
            decode_static(
                self._forward.decoder,
                layout,
                cache,
                logits,
                uniforms,
                rows,
                _StopRule(params, eos_ids, self.tokenizer),
                self.sync_every,
                self.cuda_graphs,
            )
        else:
            self._decode(layout, cache, logits, uniforms, rows, params, eos_ids)
        assert all(r.finish_reason is not None for r in rows), "a row never finished"
        return rows

    def _decode(self, layout, cache, logits, uniforms, rows, params, eos_ids) -> None:
        """Decode with the batch shrinking as rows finish, syncing every `sync_every` steps."""
        stop_rule = _StopRule(params, eos_ids, self.tokenizer)
        active = list(range(len(rows)))  # original row index of each batch row
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        for step in range(params.max_new_tokens):
            tokens, logps = sample_next(logits, params, uniforms[:, step])
            pending.append((tokens, logps))
            last = step == params.max_new_tokens - 1
            if len(pending) == self.sync_every or last:
                step_tokens = torch.stack([t for t, _ in pending], dim=1)  # (B, k)
                step_logps = torch.stack([lp for _, lp in pending], dim=1)
                stop_rule.feed([rows[i] for i in active], step_tokens, step_logps)
                pending = []
                still = [i for i, r in enumerate(active) if rows[r].finish_reason is None]
                if not still:
                    break
                if len(active) - len(still) >= max(1, self.compact_fraction * len(active)):
                    keep = torch.tensor(still, device=self.device)
                    self._forward.select(cache, keep)
                    layout.select(keep)
                    tokens, uniforms = tokens[keep], uniforms[keep]
                    active = [active[i] for i in still]
            logits = self._forward.forward(layout.decode_step(tokens), cache)

    def _prefill(self, layout: PromptLayout, cache) -> torch.Tensor:
        """Fill the cache with the prompts; returns next-token logits (U, V)."""
        if layout.prefix_len:
            # The shared prefix runs for one row, whose cache entries are then copied to all.
            self._forward.forward(layout.prompt_chunk(layout.prefix_len, rows=1), cache)
            n_rows = layout.input_ids.shape[0]
            rows = torch.zeros(n_rows, dtype=torch.long, device=self.device)
            self._forward.select(cache, rows)
        return self._forward.forward(layout.prompt_chunk(layout.width), cache)

    def _to_completion(self, row: _Row) -> Completion:
        assert row.finish_reason in ("stop", "length"), row.finish_reason
        assert len(row.token_ids) == len(row.logprobs), "tokens and logprobs out of step"
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        return Completion(row.prompt_ids, row.token_ids, text, row.finish_reason, row.logprobs)


def _dedupe(prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Unique prompts in first-seen order, and the index of each request's prompt among them."""
    index_of: dict[tuple[int, ...], int] = {}
    inverse = [index_of.setdefault(tuple(ids), len(index_of)) for ids in prompt_ids]
    unique = [list(ids) for ids in index_of]
    return unique, inverse


def _pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ConfigError("tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
    return int(pad)


class _StopRule:
    """Appends sampled tokens to the host-side rows and decides when each row is finished."""

    def __init__(
        self, params: SamplingParams, eos_ids: set[int], tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.params = params
        self.eos_ids = eos_ids
        self.tokenizer = tokenizer

    def feed(self, rows: list[_Row], tokens: torch.Tensor, logps: torch.Tensor) -> None:
        """Append k steps of samples; tokens after a row's stop are dropped.

        rows: the batch's rows in batch order; tokens (B, k) int64, logps (B, k) float.
        Step by step across the rows, so a SamplingError names the earliest bad step.
        """
        assert tokens.shape == logps.shape, f"{tokens.shape} != {logps.shape}"
        assert tokens.shape[0] == len(rows), f"{tokens.shape[0]} token rows for {len(rows)} rows"
        token_rows, logp_rows = tokens.tolist(), logps.tolist()
        for step in range(tokens.shape[1]):
            for row, row_tokens, row_logps in zip(rows, token_rows, logp_rows, strict=True):
                if row.finish_reason is None:
                    _append_token(row, row_tokens[step], row_logps[step], self.params,
                                  self.eos_ids, self.tokenizer)  # fmt: skip


def _append_token(
    row: _Row,
    token: int,
    logp: float,
    params: SamplingParams,
    eos_ids: set[int],
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Add one sampled token to a row and decide whether the row is finished.

    Raises SamplingError when `logp` is not finite: the policy's logits were NaN or infinite
    at this step (`check_logprob`), and neither the token nor anything after it means anything.
    """
    assert row.finish_reason is None, "appending to a finished row"
    check_logprob(logp, len(row.token_ids) + 1)
    row.token_ids.append(token)
    row.logprobs.append(logp)
    if (token in eos_ids and not params.ignore_eos) or (
        params.stop and _completes_stop(tokenizer, row.token_ids, params.stop)
    ):
        row.finish_reason = "stop"
    elif len(row.token_ids) >= params.max_new_tokens:
        row.finish_reason = "length"


def _completes_stop(
    tokenizer: PreTrainedTokenizerBase, token_ids: list[int], stops: tuple[str, ...]
) -> bool:
    """Whether the newest token completed one of the stop strings."""
    # Every token carries at least one byte of the text (byte-level vocabularies split a
    # character such as 答 into several tokens), so the last len(stop in UTF-8) + 1 tokens cover
    # any stop string the newest token completed; an earlier one would have stopped the row.
    window = max(len(s.encode()) for s in stops) + 1
    tail = tokenizer.decode(token_ids[-window:], skip_special_tokens=False)
    return any(stop in tail for stop in stops)


def model_vocab(model: Any) -> int | None:
    """The token ids the model can embed (its input embedding's rows), or None where unknown."""
    try:
        return int(model.get_input_embeddings().num_embeddings)
    except (AttributeError, TypeError, NotImplementedError):
        return None


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def model_positions(model: Any) -> int | None:
    """The positions the model has for prompt and response (`max_position_embeddings`), or
    None where its config states none."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    positions = getattr(config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None


def _check_request(
    prompt_ids: list[list[int]],
    seeds: list[int] | None,
    max_new_tokens: int = 0,
    model: Any = None,
) -> None:
    """Refuse a malformed request (ConfigError, one line); `model` bounds the token ids and
    the positions a prompt plus `max_new_tokens` may take (unchecked where it is None)."""
    positions = model_positions(model) if model is not None else None
    vocab = model_vocab(model) if model is not None else None
    if not isinstance(prompt_ids, list | tuple) or not prompt_ids:
        raise ConfigError(f"generate needs a non-empty list of prompts, got {_brief(prompt_ids)}")
    for i, ids in enumerate(prompt_ids):
        if not isinstance(ids, list | tuple) or not all(type(t) is int for t in ids):
            raise ConfigError(f"prompt {i} must be a list of int token ids, got {_brief(ids)}")
        if len(ids) == 0:
            raise ConfigError(f"prompt {i} is empty; every prompt needs at least one token")
        if vocab is not None and not 0 <= min(ids) <= max(ids) < vocab:
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise ConfigError(
                f"prompt {i} holds token id {bad}, outside the vocabulary 0..{vocab - 1}"
            )
    if seeds is not None and len(seeds) != len(prompt_ids):
        raise ConfigError(f"got {len(seeds)} seeds for {len(prompt_ids)} prompts; need one each")
    if seeds is not None:
        for i, seed in enumerate(seeds):
            if type(seed) is not int or not -(2**63) <= seed < 2**64:
                raise ConfigError(f"seed {i} must be an int in [-2**63, 2**64), got {_brief(seed)}")
    # Past its positions a rotary model samples garbage and an absolute one fails its lookup.
    if positions is not None and max(map(len, prompt_ids)) + max_new_tokens > positions:
        row = next(i for i, ids in enumerate(prompt_ids) if len(ids) + max_new_tokens > positions)
        tokens = len(prompt_ids[row])
        raise PromptTooLong(
            f"prompt {row} has {tokens} tokens, and with a response budget of {max_new_tokens} "
            f"needs {tokens + max_new_tokens} positions; the model has {positions} "
            "(max_position_embeddings): shorten the prompt or the budget",
            row,
        )
