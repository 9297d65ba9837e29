"""yatt's own forward pass for Llama-family decoders (Llama, Qwen2, Mistral) in rollouts.

Reads the weights of a Hugging Face `*ForCausalLM` into fused tensors (Q|K|V and gate|up each one
matmul), keeps keys/values in one preallocated cache (layers, B, kv heads, capacity, head dim)
written in place, takes rotary cos/sin from a precomputed table and runs grouped-query attention
through `F.scaled_dot_product_attention` without repeating keys. The arithmetic follows HF's
modeling_llama op for op (RMSNorm in fp32, rotate-half rotary), so fp32 greedy outputs match HF.
"""

import logging

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

__all__ = ["LlamaDecoder", "StaticCache"]

logger = logging.getLogger(__name__)

_MODEL_TYPES = ("llama", "qwen2", "mistral")
_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class StaticCache:
    """Keys and values of every layer in two preallocated tensors, written in place.

    keys, values: (layers, B, kv_heads, capacity, head_dim). A chunk of T tokens is written at
    slots [start, start + T) of every row (all rows share the slot index: see `PromptLayout`).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        assert keys.shape == values.shape, f"{keys.shape} != {values.shape}"
        self.keys = keys
        self.values = values

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def select(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) the given batch rows, in that order. rows: (B',) int64."""
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)


class LlamaDecoder:
    """Fused-weight forward of a Llama-family model, reading weights from the HF module.

    The fused copies are rebuilt by `refresh()` whenever a parameter of the model changed
    (optimizer step, `load_state_dict`, `param.data = ...`), so rollouts never see stale weights.
    """

    def __init__(self, model: PreTrainedModel, dtype: torch.dtype | None = None) -> None:
        """Args:
        model: a Llama/Qwen2/Mistral causal LM (see `supports`); used in place, never copied.
        dtype: compute dtype; None keeps the model's own.
        """
        assert self.supports(model), f"unsupported model type {model.config.model_type!r}"
        config = model.config
        self.model = model
        self.dtype = dtype or next(model.parameters()).dtype
        self.n_layers = int(config.num_hidden_layers)
        self.n_heads = int(config.num_attention_heads)
        self.n_kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.n_heads)
        self.eps = float(config.rms_norm_eps)
        self._stamp: tuple | None = None
        self._rope_cos = self._rope_sin = torch.empty(0)
        self.layers: list[dict[str, torch.Tensor | None]] = []

    @staticmethod
    def supports(model: PreTrainedModel) -> bool:
        """Whether this decoder reproduces `model`'s forward (else use the HF forward)."""
        config = model.config
        if config.model_type not in _MODEL_TYPES:
            return False
        if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            return False
        if config.model_type == "mistral" and getattr(config, "sliding_window", None):
            return False
        rope = getattr(config, "rope_parameters", None) or {}
        return getattr(config, "hidden_act", "silu") == "silu" and (
            rope.get("rope_type", "default") in _ROPE_TYPES
        )

    def refresh(self) -> None:
        """Rebuild the fused weights if any parameter changed since the last build."""
        params = list(self.model.parameters())
        stamp = tuple((id(p), p._version, p.data_ptr()) for p in params)
        if stamp == self._stamp:
            return
        with torch.no_grad():
            self._pack()
        self._stamp = stamp

    def _pack(self) -> None:
        cast = lambda t: None if t is None else t.detach().to(self.dtype)  # noqa: E731
        base = self.model.model
        self.layers = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = (attn.q_proj, attn.k_proj, attn.v_proj)
            qkv_bias = None
            if attn.q_proj.bias is not None:
                qkv_bias = torch.cat([cast(p.bias) for p in projections])
            self.layers.append(
                {
                    "norm_attn": cast(layer.input_layernorm.weight),
                    "qkv": torch.cat([cast(p.weight) for p in projections]),
                    "qkv_bias": qkv_bias,
                    "o": cast(attn.o_proj.weight),
                    "o_bias": cast(attn.o_proj.bias),
                    "norm_mlp": cast(layer.post_attention_layernorm.weight),
                    "gate_up": torch.cat([cast(mlp.gate_proj.weight), cast(mlp.up_proj.weight)]),
                    "down": cast(mlp.down_proj.weight),
                }
            )
        self.embed = cast(base.embed_tokens.weight)
        self.norm = cast(base.norm.weight)
        self.lm_head = cast(self.model.lm_head.weight)
        self.lm_head_bias = cast(getattr(self.model.lm_head, "bias", None))

    def new_cache(self, batch_size: int, capacity: int, device: torch.device) -> StaticCache:
        """An empty cache for `batch_size` rows of `capacity` positions each."""
        shape = (self.n_layers, batch_size, self.n_kv_heads, capacity, self.head_dim)
        keys = torch.zeros(shape, dtype=self.dtype, device=device)
        return StaticCache(keys, torch.zeros_like(keys))

    def rope_table(self, n_positions: int, device: torch.device) -> None:
        """Precompute rotary cos/sin for positions [0, n_positions) (grows, never shrinks)."""
        if self._rope_cos.shape[0] >= n_positions and self._rope_cos.device == device:
            return
        positions = torch.arange(n_positions, device=device)[None, :]  # (1, P)
        probe = torch.zeros(1, dtype=torch.float32, device=device)
        cos, sin = self.model.model.rotary_emb(probe, positions)  # (1, P, D) fp32
        # HF casts cos/sin to the activations' dtype before rotating; so do we.
        self._rope_cos, self._rope_sin = cos[0].to(self.dtype), sin[0].to(self.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: StaticCache,
        slots: torch.Tensor,
        span: int,
    ) -> torch.Tensor:
        """Run T new tokens per row through the model, writing their keys/values to the cache.

        Args:
            input_ids: (B, T) int64.
            positions: (B, T) int64 rotary positions (must be < the `rope_table` size).
            mask: (B, 1, T, span) bool, True where a query may attend to a cache slot.
            cache: the rows' cache; B == cache.batch_size.
            slots: (T,) int64 cache slots the new tokens are written to.
            span: attention reads cache slots [0, span).
        Returns:
            next-token logits of the last position, (B, V) in the compute dtype.
        """
        hidden = F.embedding(input_ids, self.embed)  # (B, T, E)
        cos = self._rope_cos[positions].unsqueeze(1)  # (B, 1, T, D)
        sin = self._rope_sin[positions].unsqueeze(1)
        for index, weights in enumerate(self.layers):
            hidden = self._layer(hidden, weights, cache, index, (cos, sin, mask, slots, span))
        last = _rms_norm(hidden[:, -1, :], self.norm, self.eps)  # (B, E)
        return F.linear(last, self.lm_head, self.lm_head_bias)  # (B, V)

    def _layer(self, hidden, weights, cache: StaticCache, index: int, context) -> torch.Tensor:
        cos, sin, mask, slots, span = context
        batch, n_new, _ = hidden.shape
        normed = _rms_norm(hidden, weights["norm_attn"], self.eps)
        qkv = F.linear(normed, weights["qkv"], weights["qkv_bias"])  # (B, T, (H + 2Hkv) D)
        qkv = qkv.view(batch, n_new, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        qkv = qkv.transpose(1, 2)  # (B, H + 2Hkv, T, D)
        query, key, value = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        cache.keys[index].index_copy_(2, slots, key)
        cache.values[index].index_copy_(2, slots, value)
        keys = cache.keys[index, :, :, :span]  # (B, Hkv, S, D)
        values = cache.values[index, :, :, :span]
        attended = self._attention(query, keys, values, mask)  # (B, T, H D)
        hidden = hidden + F.linear(attended, weights["o"], weights["o_bias"])
        normed = _rms_norm(hidden, weights["norm_mlp"], self.eps)
        gate, up = F.linear(normed, weights["gate_up"]).chunk(2, dim=-1)  # (B, T, I) each
        return hidden + F.linear(F.silu(gate) * up, weights["down"])

    def _attention(self, query, keys, values, mask) -> torch.Tensor:
        """Grouped-query attention; query (B, H, T, D) -> (B, T, H D)."""
        batch, _, n_new, _ = query.shape
        group = self.n_heads // self.n_kv_heads
        # Query head h reads kv head h // group; folding the group into the query axis lets
        # one SDPA call serve every head without repeating keys (queries are independent).
        folded = query.reshape(batch, self.n_kv_heads, group * n_new, self.head_dim)
        folded_mask = mask.unsqueeze(2).expand(-1, -1, group, -1, -1)  # (B, 1, G, T, S)
        folded_mask = folded_mask.reshape(batch, 1, group * n_new, mask.shape[-1])
        out = F.scaled_dot_product_attention(
            folded, keys, values, attn_mask=folded_mask, scale=self.head_dim**-0.5
        )  # (B, Hkv, G T, D)
        out = out.view(batch, self.n_heads, n_new, self.head_dim).transpose(1, 2)
        return out.reshape(batch, n_new, self.n_heads * self.head_dim)


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm: normalise in fp32, cast back, then scale."""
    as_float = hidden.float()
    variance = as_float.pow(2).mean(-1, keepdim=True)
    return weight * (as_float * torch.rsqrt(variance + eps)).to(hidden.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
