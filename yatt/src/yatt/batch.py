"""RolloutBatch: the typed record roles pass to each other during one RL step.

Layout: every row is `[prompt, left-padded to P][response, right-padded to R]`, so the response
always starts at column P. Shapes: B = rows (prompts x samples), P = prompt width, R = response
width. Per-token tensors that roles produce (log-probs, values, advantages) cover the response
columns only: (B, R), aligned with `response_mask`. `check()` runs when a batch is produced and
again before it is consumed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["RolloutBatch"]

_TOKEN_FIELDS = (
    "old_logp", "behaviour_logp", "ref_logp", "values", "advantages", "returns", "token_rewards"
)  # fmt: skip


@dataclass
class RolloutBatch:
    """One step's samples. Optional fields are filled in by later phases of the step.

    Attributes:
        input_ids: (B, P+R) long, prompt left-padded, response right-padded.
        attention_mask: (B, P+R) long, 1 on real prompt and response tokens.
        response_mask: (B, R) float, 1 on generated tokens (incl. a final EOS), 0 on padding.
        prompt_width: P, the column where responses start.
        group_ids: (B,) long, rows sampled from the same prompt share an id.
        rewards: (B,) float sequence scores (after penalties), or None before scoring.
        scores: (B,) float sequence scores before penalties, set where penalties apply (the
            trainer and the distributed controllers keep both for their metrics); else None.
        old_logp, ref_logp, values, advantages, returns, token_rewards: (B, R) float or None.
        behaviour_logp: (B, R) float log-probs the sampler drew the tokens with, set only when
            its distribution differs from the trainer's (bf16 rollouts); None otherwise.
        prompts, completions: the texts, B each; rows: the dataset fields per row (for rewards).
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    prompt_width: int
    group_ids: Tensor
    prompts: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    rewards: Tensor | None = None
    scores: Tensor | None = None
    old_logp: Tensor | None = None
    behaviour_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    values: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    token_rewards: Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_width(self) -> int:
        return int(self.response_mask.shape[1])

    @property
    def response_lengths(self) -> Tensor:
        """(B,) number of generated tokens per row."""
        return self.response_mask.sum(dim=1)

    @property
    def response_ids(self) -> Tensor:
        """(B, R) the generated token ids (padding where response_mask is 0)."""
        return self.input_ids[:, self.prompt_width :]

    def check(self, *required: str) -> RolloutBatch:
        """Assert every shape invariant, and that the `required` optional fields are set."""
        batch_size, width = self.input_ids.shape
        assert self.input_ids.dtype == torch.long, f"input_ids dtype {self.input_ids.dtype}"
        assert self.attention_mask.shape == (batch_size, width), (
            f"attention_mask {tuple(self.attention_mask.shape)} != {(batch_size, width)}"
        )
        response_width = width - self.prompt_width
        assert response_width >= 1, f"no response columns: width {width}, P {self.prompt_width}"
        assert self.response_mask.shape == (batch_size, response_width), (
            f"response_mask {tuple(self.response_mask.shape)} != {(batch_size, response_width)}"
        )
        response_attention = self.attention_mask[:, self.prompt_width :].to(self.response_mask)
        assert torch.equal(response_attention, self.response_mask), "response mask != attention"
        assert self.group_ids.shape == (batch_size,), f"group_ids {tuple(self.group_ids.shape)}"
        for name in ("prompts", "completions", "rows", "finish_reasons"):
            values = getattr(self, name)
            assert len(values) in (0, batch_size), f"{name}: {len(values)} != {batch_size}"
        for name in ("rewards", "scores"):
            value = getattr(self, name)
            if value is not None:
                assert value.shape == (batch_size,), f"{name} {tuple(value.shape)}"
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None:
                assert value.shape == self.response_mask.shape, (
                    f"{name} {tuple(value.shape)} != {tuple(self.response_mask.shape)}"
                )
        for name in required:
            assert getattr(self, name) is not None, f"batch field {name} is missing"
        return self

    def select(self, rows: Tensor | list[int]) -> RolloutBatch:
        """A new batch holding only `rows` (indices), with every field sliced alike."""
        index = torch.as_tensor(rows, dtype=torch.long)
        picked = index.tolist()
        changes = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, Tensor):
                changes[item.name] = value[index]
            elif isinstance(value, list) and value:
                changes[item.name] = [value[i] for i in picked]
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device) -> RolloutBatch:
        """This batch with every tensor field on `device` (itself where all are there already).
        Batches live on the host; a role moves each micro-batch to its model's device."""
        changes = {
            item.name: value.to(device)
            for item in dataclasses.fields(self)
            if isinstance(value := getattr(self, item.name), Tensor) and value.device != device
        }
        return dataclasses.replace(self, **changes) if changes else self

    @staticmethod
    def from_token_lists(
        prompt_ids: list[list[int]], response_ids: list[list[int]]
    ) -> RolloutBatch:
        """Left-pad prompts to P and right-pad responses to R into one (B, P+R) batch."""
        prompt_width = max(len(ids) for ids in prompt_ids)
        response_width = max(max(len(ids) for ids in response_ids), 1)
        batch_size = len(prompt_ids)
        input_ids = torch.zeros(batch_size, prompt_width + response_width, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
            start = prompt_width - len(prompt)
            end = prompt_width + len(response)
            input_ids[row, start:prompt_width] = torch.tensor(prompt, dtype=torch.long)
            input_ids[row, prompt_width:end] = torch.tensor(response, dtype=torch.long)
            attention_mask[row, start:end] = 1
        return RolloutBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            response_mask=attention_mask[:, prompt_width:].float(),
            prompt_width=prompt_width,
            group_ids=torch.arange(batch_size),
        )

    @staticmethod
    def synthetic(
        prompt_ids: list[int], rows: int, tokens: int, vocab: int, group: int
    ) -> RolloutBatch:
        """`rows` copies of one prompt in groups of `group` rows (as a GRPO step samples a
        prompt `group` times: the update shares each group's prompt pass), each with `tokens`
        response tokens drawn (seeded) from `vocab`, advantages of alternating sign (every row
        trains): an update's input of a given shape, for timing and memory probes."""
        assert rows >= 1 and group >= 1, f"rows={rows}, group={group}"
        drawn = torch.randint(vocab, (rows, tokens), generator=torch.Generator().manual_seed(0))
        batch = RolloutBatch.from_token_lists([prompt_ids] * rows, drawn.tolist())
        batch.group_ids = torch.arange(rows) // group
        signs = torch.tensor([1.0, -1.0]).repeat(rows)[:rows, None]
        batch.advantages = signs * batch.response_mask
        return batch.check("advantages")

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Stack batches row-wise, re-padding prompts (left) and responses (right) as needed."""
        assert batches, "concat of no batches"
        prompt_width = max(b.prompt_width for b in batches)
        response_width = max(b.response_width for b in batches)
        padded = [b._pad_to(prompt_width, response_width) for b in batches]
        merged = {}
        for item in dataclasses.fields(RolloutBatch):
            values = [getattr(b, item.name) for b in padded]
            if item.name == "prompt_width":
                merged[item.name] = prompt_width
            elif all(isinstance(v, Tensor) for v in values):
                merged[item.name] = torch.cat(values)
            elif all(isinstance(v, list) for v in values):
                merged[item.name] = [x for v in values for x in v]
            else:
                assert all(v is None for v in values), f"{item.name} set on only some batches"
                merged[item.name] = None
        return RolloutBatch(**merged).check()

    def _pad_to(self, prompt_width: int, response_width: int) -> RolloutBatch:
        left = prompt_width - self.prompt_width
        right = response_width - self.response_width
        if left == 0 and right == 0:
            return self
        pad = torch.nn.functional.pad
        changes: dict = {
            "input_ids": pad(self.input_ids, (left, right), value=0),
            "attention_mask": pad(self.attention_mask, (left, right), value=0),
            "response_mask": pad(self.response_mask, (0, right), value=0.0),
            "prompt_width": prompt_width,
        }
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None:
                changes[name] = pad(value, (0, right), value=0.0)
        return dataclasses.replace(self, **changes)
