"""The model call behind the rollout engine: yatt's fused decoder or HF's own forward.

Both adapters share one small interface (`prepare`, `new_cache`, `forward`, `select`), taking the
inputs `PromptLayout` builds (input ids, position ids, a 4D boolean mask over cache slots).
`DecoderForward` runs `decoder.LlamaDecoder` (Llama-family models); `HFForward` calls the HF
module with a slab cache (any causal LM), optionally through a cast copy of its weights.
"""

import torch
from torch.func import functional_call
from transformers import PreTrainedModel

from yatt.errors import ConfigError
from yatt.models import cache_kwarg
from yatt.rollout.decoder import LlamaDecoder, StaticCache
from yatt.rollout.kv import make_cache

__all__ = ["DecoderForward", "HFForward", "make_forward", "sliding_window"]


class DecoderForward:
    """yatt's fused Llama-family forward over a `StaticCache`."""

    def __init__(
        self, model: PreTrainedModel, dtype: torch.dtype | None, prepack: bool | None = None
    ) -> None:
        self.decoder = LlamaDecoder(model, dtype, prepack)

    def prepare(self, capacity: int, device: torch.device) -> None:
        """Refresh fused weights if the model changed; make rotary tables cover `capacity`."""
        self.decoder.refresh()
        self.decoder.rope_table(capacity, device)

    def new_cache(self, batch_size: int, capacity: int, device: torch.device) -> StaticCache:
        return self.decoder.new_cache(batch_size, capacity, device)

    def forward(self, inputs: dict, cache: StaticCache) -> torch.Tensor:
        """Next-token logits (B, V); the new tokens fill the last T slots of the mask's span."""
        mask = inputs["attention_mask"]  # (B, 1, T, span)
        n_new, span = mask.shape[-2], mask.shape[-1]
        slots = torch.arange(span - n_new, span, device=mask.device)
        return self.decoder.forward(
            inputs["input_ids"], inputs["position_ids"], mask, cache, slots, span
        )

    @staticmethod
    def select(cache: StaticCache, rows: torch.Tensor) -> None:
        cache.select(rows)


class HFForward:
    """The HF module's own forward with an in-place slab cache (any causal LM)."""

    def __init__(self, model: PreTrainedModel, dtype: torch.dtype | None) -> None:
        self.model = model
        model_dtype = next(model.parameters()).dtype
        self._cast = _CastWeights(model, dtype) if dtype not in (None, model_dtype) else None
        self._weights: dict[str, torch.Tensor] | None = None
        self._cache_kwarg = cache_kwarg(model)
        # HF takes a 4D mask as given; only SDPA reads a boolean one as "may attend" (eager
        # attention adds the mask to the scores: True/False would mask nothing).
        implementation = getattr(model.config, "_attn_implementation", None) or "sdpa"
        self._additive = None if implementation == "sdpa" else (dtype or model_dtype)
        self._window = sliding_window(model.config)

    def prepare(self, capacity: int, device: torch.device) -> None:
        """Raises ConfigError where a row could span more positions than the model's sliding
        window: the engine's mask over the cache is a full causal one, which equals the
        window's only while every row fits in it."""
        if self._window is not None and capacity > self._window:
            raise ConfigError(
                f"{self.model.config.model_type} attends within a sliding window of "
                f"{self._window} tokens, and this batch's prompt plus response budget spans "
                f"{capacity}: yatt's rollout engine masks the whole prefix; use "
                "rollout.backend=hf (HF generate applies the window), or shorter prompts or "
                "rollout.max_new_tokens"
            )
        self._weights = self._cast.current() if self._cast is not None else None

    def new_cache(self, batch_size: int, capacity: int, device: torch.device):
        n_layers = int(self.model.config.get_text_config().num_hidden_layers)
        return make_cache(n_layers, capacity)  # slabs are sized by the first call's batch

    def forward(self, inputs: dict, cache) -> torch.Tensor:
        """One model call (with cast weights swapped in if set); next-token logits (B, V)."""
        inputs = inputs | {self._cache_kwarg: cache, "use_cache": True, "logits_to_keep": 1}
        if self._additive is not None:  # 0 where a query may attend, the dtype's min elsewhere
            allowed = inputs["attention_mask"]
            additive = torch.zeros(allowed.shape, dtype=self._additive, device=allowed.device)
            inputs["attention_mask"] = additive.masked_fill_(
                ~allowed, torch.finfo(self._additive).min
            )
        if self._weights is None:
            return self.model(**inputs).logits[:, -1, :]
        return functional_call(self.model, self._weights, (), inputs).logits[:, -1, :]

    @staticmethod
    def select(cache, rows: torch.Tensor) -> None:
        cache.batch_select_indices(rows)


def sliding_window(config) -> int | None:
    """The sliding window (tokens) some or all of a model's layers attend within, else None
    (Mistral's `sliding_window`; Gemma's and Qwen's where `layer_types` names sliding layers)."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None  # (Qwen2 keeps a window in its config with use_sliding_window off)
    if layer_types is None and getattr(text, "use_sliding_window", True) is False:
        return None
    return int(window)


def make_forward(
    model: PreTrainedModel, dtype: torch.dtype | None, prepack: bool | None = None
) -> DecoderForward | HFForward:
    """yatt's decoder where it reproduces the model (Llama family), else HF's forward.

    `prepack` (see `LlamaDecoder`) applies to yatt's decoder only.
    """
    if LlamaDecoder.supports(model):
        return DecoderForward(model, dtype, prepack)
    return HFForward(model, dtype)


class _CastWeights:
    """The model's parameters cast to another dtype, recast only when a parameter changed.

    A parameter counts as changed when its in-place version counter or its storage moved, which
    covers writes autograd sees, `load_state_dict` and `param.data = ...`; after a write it does
    not see (a fused optimizer step, `param.data.copy_`) call
    `torch.autograd.graph.increment_version` on the parameters (see `LlamaDecoder`).
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
