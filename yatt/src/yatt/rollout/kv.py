"""KV cache and batch layout for the rollout engine.

`SlabLayer` writes keys/values in place into a preallocated slab (no per-step concatenation).
`PromptLayout` places a batch of prompts in that slab as [shared prefix | left-padded suffixes |
generated tokens] and builds the matching position ids and 4D boolean attention masks, so the
model never rebuilds masks itself and a prefix common to all prompts (a chat template's system
prompt) is computed once.
"""

import torch
from transformers.cache_utils import Cache, DynamicLayer

from yatt.algos.logprobs import common_prefix_length

__all__ = ["PromptLayout", "SlabLayer", "make_cache"]


class SlabLayer(DynamicLayer):
    """A cache layer that writes keys/values in place into a (B, H, capacity, D) slab.

    Returns views of the filled prefix, so a decode step costs no copy of the whole cache.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, _ = key_states.shape
        self.device = key_states.device
        self.key_slab = key_states.new_zeros((batch, heads, self.capacity, key_states.shape[-1]))
        self.value_slab = value_states.new_zeros(
            (batch, heads, self.capacity, value_states.shape[-1])
        )
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        assert end <= self.capacity, f"KV cache overflow: {end} > {self.capacity}"
        self.key_slab[:, :, self.length : end] = key_states
        self.value_slab[:, :, self.length : end] = value_states
        self.length = end
        self.keys = self.key_slab[:, :, :end]
        self.values = self.value_slab[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        self.key_slab = self.key_slab.index_select(0, indices)
        self.value_slab = self.value_slab.index_select(0, indices)
        self.keys = self.key_slab[:, :, : self.length]
        self.values = self.value_slab[:, :, : self.length]


def make_cache(n_layers: int, capacity: int) -> Cache:
    """A cache of `n_layers` slab layers holding up to `capacity` positions per row."""
    return Cache(layers=[SlabLayer(capacity) for _ in range(n_layers)])


class PromptLayout:
    """Device tensors describing the batch in the cache: key mask, positions, filled length.

    Row layout along the cache: `prefix_len` shared prompt tokens, then each prompt's remaining
    tokens left-padded to a common width, then generated tokens.
    """

    def __init__(
        self, input_ids: torch.Tensor, key_mask: torch.Tensor, prefix_len: int, capacity: int
    ) -> None:
        self.input_ids = input_ids  # (B, W) prompt region: prefix + left-padded suffixes
        self.key_mask = key_mask  # (B, capacity) bool: True where a real token sits
        self.prefix_len = prefix_len
        self.capacity = capacity
        self.width = input_ids.shape[1]
        self.length = 0  # positions filled in the cache
        # Position of every prompt-region slot: real tokens count 0, 1, 2, ... (pads: 0).
        self.prompt_positions = (key_mask[:, : self.width].long().cumsum(-1) - 1).clamp_(min=0)
        self.positions = key_mask[:, : self.width].sum(-1, keepdim=True)  # (B, 1) next position

    @classmethod
    def build(
        cls,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        pad_id: int,
        device: torch.device,
        min_shared_prefix: int,
    ) -> "PromptLayout":
        prefix_len = common_prefix_length(prompt_ids)
        if prefix_len < min_shared_prefix or len(prompt_ids) < 2:
            prefix_len = 0
        suffix_width = max(len(p) for p in prompt_ids) - prefix_len
        width = prefix_len + suffix_width
        input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
        key_mask = torch.ones((len(prompt_ids), width + max_new_tokens), dtype=torch.bool)
        for i, ids in enumerate(prompt_ids):
            start = width - (len(ids) - prefix_len)  # first slot of this row's suffix
            input_ids[i, :prefix_len] = torch.tensor(ids[:prefix_len], dtype=torch.long)
            input_ids[i, start:] = torch.tensor(ids[prefix_len:], dtype=torch.long)
            key_mask[i, prefix_len:start] = False
        capacity = width + max_new_tokens
        return cls(input_ids.to(device), key_mask.to(device), prefix_len, capacity)

    def prompt_chunk(self, end: int, rows: int | None = None) -> dict:
        """Model inputs for prompt slots [length, end) of the first `rows` rows (all if None)."""
        start, rows = self.length, rows or self.input_ids.shape[0]
        assert 0 <= start < end <= self.width, f"bad prompt chunk [{start}, {end})"
        query = torch.arange(start, end, device=self.key_mask.device)[:, None]  # (q, 1)
        key = torch.arange(end, device=self.key_mask.device)[None, :]  # (1, K)
        real = self.key_mask[:rows, None, None, :end]  # (b, 1, 1, K)
        # Real queries see real keys up to themselves; a padding query sees only itself, so no
        # softmax row is empty (NaN-free) and nothing real ever attends to padding.
        mask = (real & (key <= query)) | (key == query)  # (b, 1, q, K)
        self.length = end
        return {
            "input_ids": self.input_ids[:rows, start:end],
            "position_ids": self.prompt_positions[:rows, start:end],
            "attention_mask": mask,
        }

    def decode_step(self, tokens: torch.Tensor) -> dict:
        """Model inputs for one new token per row. tokens: (B,) int64."""
        assert self.length >= self.width, "decode before the prompt is filled"
        position_ids = self.positions
        self.positions = self.positions + 1
        self.length += 1
        assert self.length <= self.capacity, f"decode past capacity {self.capacity}"
        mask = self.key_mask[:, None, None, : self.length]  # (B, 1, 1, L) view, no rebuild
        return {"input_ids": tokens[:, None], "position_ids": position_ids, "attention_mask": mask}

    def select(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) the given rows, in that order. rows: (B',) int64."""
        self.input_ids = self.input_ids.index_select(0, rows)
        self.key_mask = self.key_mask.index_select(0, rows)
        self.prompt_positions = self.prompt_positions.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)
