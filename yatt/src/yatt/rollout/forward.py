"""The model call behind the rollout engine: yatt's fused decoder or HF's own forward.

Both adapters share one small interface (`prepare`, `new_cache`, `forward`, `select`), taking the
inputs `PromptLayout` builds (input ids, position ids, a 4D boolean mask over cache slots).
`DecoderForward` runs `decoder.LlamaDecoder` (Llama-family models); `HFForward` calls the HF
module with a slab cache (any causal LM), optionally through a cast copy of its weights.
"""

import inspect

import torch
from torch.func import functional_call
from transformers import PreTrainedModel

from yatt.rollout.decoder import LlamaDecoder, StaticCache
from yatt.rollout.kv import make_cache

__all__ = ["DecoderForward", "HFForward", "make_forward"]


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
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.2x names the cache argument `cache`; older 5.x `past_key_values`.
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def prepare(self, capacity: int, device: torch.device) -> None:
        self._weights = self._cast.current() if self._cast is not None else None

    def new_cache(self, batch_size: int, capacity: int, device: torch.device):
        n_layers = int(self.model.config.get_text_config().num_hidden_layers)
        return make_cache(n_layers, capacity)  # slabs are sized by the first call's batch

    def forward(self, inputs: dict, cache) -> torch.Tensor:
        """One model call (with cast weights swapped in if set); next-token logits (B, V)."""
        inputs = inputs | {self._cache_kwarg: cache, "use_cache": True, "logits_to_keep": 1}
        if self._weights is None:
            return self.model(**inputs).logits[:, -1, :]
        return functional_call(self.model, self._weights, (), inputs).logits[:, -1, :]

    @staticmethod
    def select(cache, rows: torch.Tensor) -> None:
        cache.batch_select_indices(rows)


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
