"""yatt's own batched rollout engine: prefill + KV-cache decode over any HF causal LM.

Prompts are laid out in a preallocated cache (`kv.py`): identical prompts (a GRPO group) and a
prefix common to all (a chat template's system prompt) are prefilled once; the engine builds
position ids and 4D masks itself, samples with per-request uniforms (`sampling.py`) and drops
finished rows from the batch as they accumulate. The model object is used as is, never copied:
a colocated trainer that updates it is seen by the next `generate`. On CUDA each decode step
still syncs once to read the sampled tokens; static shapes and CUDA graphs are a later step.
"""

import inspect
import logging
from dataclasses import dataclass, field

import torch
from torch.func import functional_call
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache

from yatt.errors import ConfigError
from yatt.rollout.kv import PromptLayout, make_cache
from yatt.rollout.sampling import SamplingParams, draw_uniforms, sample_next

__all__ = ["Completion", "RolloutEngine", "eos_token_ids"]

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


class _CastWeights:
    """The model's parameters cast to another dtype, recast only when a parameter changed.

    A parameter counts as changed when its in-place version counter or its storage moved, which
    covers optimizer steps, `load_state_dict` and `param.data = ...`.
    """

    def __init__(self, model: PreTrainedModel, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype
        self._cast: dict[str, tuple[tuple[int, int, int], torch.Tensor]] = {}

    def current(self) -> dict[str, torch.Tensor]:
        weights = {}
        for name, param in self.model.named_parameters():
            stamp = (id(param), param._version, param.data_ptr())
            cached = self._cast.get(name)
            if cached is None or cached[0] != stamp:
                cached = (stamp, param.detach().to(self.dtype))
                self._cast[name] = cached
            weights[name] = cached[1]
        return weights


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
        """Copy new weights into the sampled model (for a separate, non-shared copy)."""
        self.model.load_state_dict(state)

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
    ) -> None:
        """Args:
        model: the causal LM to sample from; used in place, never copied.
        tokenizer: its tokenizer (EOS, padding, stop-string decoding).
        device: where the batch lives; default the model's device.
        dtype: compute dtype for rollouts (e.g. torch.bfloat16 on a CPU with bf16 support);
            None runs the model's own weights. Another dtype runs a cast copy of the
            weights that is refreshed whenever a parameter changes, so it is never stale.
        """
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else model.device
        model_dtype = next(model.parameters()).dtype
        self._cast = _CastWeights(model, dtype) if dtype not in (None, model_dtype) else None
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.2x names the cache argument `cache`; older 5.x `past_key_values`.
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
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
            ConfigError: empty prompt list or prompt, or len(seeds) != len(prompt_ids).
        """
        _check_request(prompt_ids, seeds)
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompt_ids),)).tolist()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
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
        cache = make_cache(self._n_layers(), layout.capacity)
        weights = self._cast.current() if self._cast is not None else None
        logits = self._prefill(layout, cache, weights)  # (U, V)
        if len(unique) < len(rows):
            expand = torch.tensor(inverse, device=self.device)
            cache.batch_select_indices(expand)
            layout.select(expand)
            logits = logits.index_select(0, expand)  # (B, V)
        active = list(range(len(rows)))  # original row index of each batch row
        for step in range(params.max_new_tokens):
            tokens, logps = sample_next(logits, params, uniforms[:, step])
            for row_index, token, logp in zip(active, tokens.tolist(), logps.tolist()):
                if rows[row_index].finish_reason is None:  # finished rows await compaction
                    _append_token(rows[row_index], token, logp, params, eos_ids, self.tokenizer)
            still = [i for i, r in enumerate(active) if rows[r].finish_reason is None]
            if not still:
                break
            if len(active) - len(still) >= max(1, self.compact_fraction * len(active)):
                keep = torch.tensor(still, device=self.device)
                cache.batch_select_indices(keep)
                layout.select(keep)
                tokens, uniforms = tokens[keep], uniforms[keep]
                active = [active[i] for i in still]
            logits = self._forward(layout.decode_step(tokens), cache, weights)
        assert all(r.finish_reason is not None for r in rows), "a row never finished"
        return rows

    def _prefill(
        self, layout: PromptLayout, cache: Cache, weights: dict[str, torch.Tensor] | None
    ) -> torch.Tensor:
        """Fill the cache with the prompts; returns next-token logits (U, V)."""
        if layout.prefix_len:
            # The shared prefix runs for one row, whose cache entries are then copied to all.
            self._forward(layout.prompt_chunk(layout.prefix_len, rows=1), cache, weights)
            n_rows = layout.input_ids.shape[0]
            cache.batch_select_indices(torch.zeros(n_rows, dtype=torch.long, device=self.device))
        return self._forward(layout.prompt_chunk(layout.width), cache, weights)

    def _forward(
        self, inputs: dict, cache: Cache, weights: dict[str, torch.Tensor] | None
    ) -> torch.Tensor:
        """One model call (with `weights` swapped in if given); next-token logits (B, V)."""
        inputs |= {self._cache_kwarg: cache, "use_cache": True, "logits_to_keep": 1}
        if weights is None:
            return self.model(**inputs).logits[:, -1, :]
        return functional_call(self.model, weights, (), inputs).logits[:, -1, :]

    def _to_completion(self, row: _Row) -> Completion:
        assert row.finish_reason in ("stop", "length"), row.finish_reason
        assert len(row.token_ids) == len(row.logprobs), "tokens and logprobs out of step"
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        return Completion(row.prompt_ids, row.token_ids, text, row.finish_reason, row.logprobs)

    def _n_layers(self) -> int:
        config = self.model.config.get_text_config()
        return int(config.num_hidden_layers)


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


def _append_token(
    row: _Row,
    token: int,
    logp: float,
    params: SamplingParams,
    eos_ids: set[int],
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Add one sampled token to a row and decide whether the row is finished."""
    assert row.finish_reason is None, "appending to a finished row"
    row.token_ids.append(token)
    row.logprobs.append(logp)
    if token in eos_ids or (params.stop and _completes_stop(tokenizer, row.token_ids, params.stop)):
        row.finish_reason = "stop"
    elif len(row.token_ids) >= params.max_new_tokens:
        row.finish_reason = "length"


def _completes_stop(
    tokenizer: PreTrainedTokenizerBase, token_ids: list[int], stops: tuple[str, ...]
) -> bool:
    """Whether the newest token completed one of the stop strings."""
    # Every token decodes to at least one character, so the last len(stop) + 1 tokens cover any
    # stop string the newest token completed; an earlier one would have stopped the row already.
    window = max(len(s) for s in stops) + 1
    tail = tokenizer.decode(token_ids[-window:], skip_special_tokens=False)
    return any(stop in tail for stop in stops)


def _check_request(prompt_ids: list[list[int]], seeds: list[int] | None) -> None:
    if not prompt_ids:
        raise ConfigError("generate needs at least one prompt, got an empty list")
    for i, ids in enumerate(prompt_ids):
        if len(ids) == 0:
            raise ConfigError(f"prompt {i} is empty; every prompt needs at least one token")
    if seeds is not None and len(seeds) != len(prompt_ids):
        raise ConfigError(f"got {len(seeds)} seeds for {len(prompt_ids)} prompts; need one each")
