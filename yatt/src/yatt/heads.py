"""ScalarHeadModel: a transformer backbone plus a linear head giving one scalar per token.

Used as the PPO critic (per-token values) and as the Bradley–Terry reward model (the value at the
last attended token is the sequence score). Saved as a safetensors folder: the backbone as a HF
base model (`from_pretrained` reads it) + `value_head.safetensors` + `scalar_head.json`.
"""

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel

from yatt.algos.logprobs import group_prefixes, position_ids_from_mask
from yatt.errors import ModelError
from yatt.models import (
    follow_umask,
    forward_after_common_start,
    forward_on_prefix_cache,
    from_pretrained_checked,
)

__all__ = ["ScalarHeadModel"]

logger = logging.getLogger(__name__)

_HEAD_FILE = "value_head.safetensors"
_META_FILE = "scalar_head.json"


class ScalarHeadModel(nn.Module):
    """Backbone (HF base model returning `last_hidden_state`) + Linear(hidden, 1) in float32.

    `values[b, t]` scores the prefix input_ids[b, :t+1]; with `token_logprobs` output (B, T-1),
    where entry t is the token t+1 drawn from state t, align critic values as `values[:, :-1]`.
    """

    def __init__(self, backbone: PreTrainedModel, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        hidden_size = backbone.config.hidden_size
        self.head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            weight = torch.randn(1, hidden_size, generator=generator) / (hidden_size + 1) ** 0.5
            self.head.weight.copy_(weight)
            self.head.bias.zero_()
        self.head.to(next(backbone.parameters()).device)

    @classmethod
    def from_causal_lm(cls, causal_lm: PreTrainedModel, seed: int = 0) -> "ScalarHeadModel":
        """Wrap the decoder of a causal LM (its LM head is dropped). Shares its weights: pass a
        copy (e.g. a freshly loaded model) when the causal LM keeps training elsewhere."""
        return cls(causal_lm.base_model, seed=seed)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        *,
        trained_head: str = "",
    ) -> "ScalarHeadModel":
        """Load a saved ScalarHeadModel folder, or start one (new head) from a causal LM folder.

        trained_head: the setting that names the folder when it must hold a trained head (a
            reward model, whose random head would score at random); "" allows a new one.
        Raises ModelError when the folder is missing or unloadable, or lacks a trained head
        that `trained_head` asks for.
        """
        folder = Path(path)
        if not folder.is_dir():
            where = f"{trained_head}={folder}" if trained_head else f"folder {str(folder)!r}"
            raise ModelError(f"scalar-head model {where} does not exist")
        if trained_head and not (folder / _META_FILE).exists():
            raise ModelError(
                f"{trained_head}={folder} is not a trained reward model (no {_META_FILE}): a "
                "causal LM there would score with a random head; train one "
                "(yatt.rewards.model.train_reward_model) or drop the setting"
            )
        if not (folder / "config.json").is_file():
            raise ModelError(f"scalar-head model folder {str(folder)!r} has no config.json")
        # (The policy's checks: unreadable weights, a bad config.json, missing weights. The LM
        # head of a causal LM folder is dropped, so its weights are no surprise.)
        backbone = from_pretrained_checked(
            AutoModel, folder, dtype=dtype, what="backbone", ignore_unexpected=("lm_head.",)
        )
        model = cls(backbone)
        if (folder / _META_FILE).exists():
            try:
                model.head.load_state_dict(load_file(folder / _HEAD_FILE))
            except Exception as exc:  # missing, truncated or foreign: safetensors/torch raise
                detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                raise ModelError(f"cannot load the head {folder / _HEAD_FILE}: {detail}") from None
        else:
            logger.info("no %s in %s: new value head on a pretrained backbone", _META_FILE, folder)
        return model.to(device)

    def save(self, path: str | Path, tokenizer=None) -> Path:
        """Write backbone (safetensors) + head + metadata (+ tokenizer if given) into `path`."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(folder, safe_serialization=True)
        head_state = {
            key: value.detach().cpu().contiguous() for key, value in self.head.state_dict().items()
        }
        save_file(head_state, folder / _HEAD_FILE)
        meta = {"hidden_size": self.head.in_features, "head_dtype": "float32"}
        (folder / _META_FILE).write_text(json.dumps(meta, indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        follow_umask(folder)
        return folder

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Per-token scalars (B, T) float32 for ids and mask (B, T), any padding side."""
        output = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
        hidden = output.last_hidden_state  # (B, T, H)
        return self.head(hidden.float()).squeeze(-1)  # (B, T)

    def sequence_scores(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Score of each sequence (B,): the scalar at its last attended token."""
        values = self(input_ids, attention_mask)  # (B, T)
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = torch.where(attention_mask.bool(), positions, -1).amax(dim=-1)  # (B,)
        assert (last >= 0).all(), "a row has no attended token"
        return values.gather(1, last[:, None]).squeeze(1)

    def shared_prefix_scores(
        self, prefix_ids: Tensor, prefix_mask: Tensor, suffix_ids: Tensor, suffix_mask: Tensor,
        rows: Tensor,
    ) -> Tensor:  # fmt: skip
        """Score (B,) of each sequence prefix `rows[b]` + suffix b: prefixes (G, P) left-padded,
        each of at least one token; suffixes (B, S) right-padded, each of at least one token.
        Each prefix runs through the backbone once and its KV cache serves every sequence of
        it, gradients flowing through it: the scores equal `sequence_scores` of the whole
        sequences up to rounding (a reward model's chosen and rejected texts share a prompt)."""
        output = self.backbone(input_ids=prefix_ids, attention_mask=prefix_mask,
                               position_ids=position_ids_from_mask(prefix_mask),
                               use_cache=True)  # fmt: skip
        return self._suffix_scores(output, prefix_mask, suffix_ids, suffix_mask, rows)

    def common_prefix_scores(
        self, prefixes: list[list[int]], start: int, pad_id: int, suffix_ids: Tensor,
        suffix_mask: Tensor, rows: Tensor,
    ) -> Tensor:  # fmt: skip
        """`shared_prefix_scores` of token-list `prefixes` that all begin with the same `start`
        tokens (a chat template's system turn): that start runs once, each prefix's rest on
        its cache (`forward_after_common_start`), then the suffixes on theirs. The same scores
        and gradients up to rounding."""
        output, prefix_mask = forward_after_common_start(
            self.backbone, prefixes, start, pad_id, suffix_ids.device
        )
        return self._suffix_scores(output, prefix_mask, suffix_ids, suffix_mask, rows)

    def _suffix_scores(
        self, prefix_output, prefix_mask: Tensor, suffix_ids: Tensor, suffix_mask: Tensor,
        rows: Tensor,
    ) -> Tensor:  # fmt: skip
        """Each suffix b on the cache of prefix `rows[b]`; its score at its last token."""
        full_mask = torch.cat([prefix_mask[rows], suffix_mask], dim=1)
        output = forward_on_prefix_cache(self.backbone, prefix_output, rows, suffix_ids, full_mask)
        values = self.head(output.last_hidden_state.float()).squeeze(-1)  # (B, S)
        last = suffix_mask.sum(dim=1) - 1
        assert (last >= 0).all(), "a sequence has no suffix token"
        return values.gather(1, last[:, None]).squeeze(1)

    def shared_prefix_values(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_width: int, group_ids: Tensor
    ) -> Tensor:
        """`forward(...)[:, P-1 : P-1+R]` (B, R): the scalars of the state before each response
        column, prompts left-padded to `prompt_width` P and responses after them; each distinct
        prompt (one per group id) runs once and its KV cache serves its group's rows, gradients
        flowing through it, so the values equal the row-by-row ones up to rounding (PPO's
        critic over a GRPO-style group)."""
        response_width = input_ids.shape[1] - prompt_width
        assert response_width >= 1 and prompt_width >= 1, f"P={prompt_width} R={response_width}"
        prefix_ids, prefix_mask, inverse = group_prefixes(
            input_ids, attention_mask, prompt_width, group_ids
        )
        output = self.backbone(input_ids=prefix_ids, attention_mask=prefix_mask,
                               position_ids=position_ids_from_mask(prefix_mask),
                               use_cache=True)  # fmt: skip
        first = self.head(output.last_hidden_state[:, -1:].float()).squeeze(-1)[inverse]  # (B, 1)
        if response_width == 1:
            return first
        full_mask = attention_mask[:, : prompt_width + response_width - 1]
        output = forward_on_prefix_cache(self.backbone, output, inverse,
                                         input_ids[:, prompt_width:-1], full_mask)  # fmt: skip
        rest = self.head(output.last_hidden_state.float()).squeeze(-1)  # (B, R-1)
        return torch.cat([first, rest], dim=1)
