"""Static-shape decode loop of the rollout engine (the CUDA path; runs eagerly on CPU too).

The batch never shrinks and attention always reads the whole cache under a mask, so one decode
step (sample, record, forward) has fixed shapes and addresses: on CUDA it is captured once as a
CUDA graph and replayed. All step state lives in device tensors; the host reads the sampled
tokens only every `sync_every` steps to apply stop rules and leave early when every row is done.
"""

import logging
from collections.abc import Callable

import torch

from yatt.rollout.decoder import LlamaDecoder, StaticCache
from yatt.rollout.kv import PromptLayout
from yatt.rollout.sampling import SamplingParams, sample_next

__all__ = ["decode_static"]

logger = logging.getLogger(__name__)


class _StaticStep:
    """One decode step over fixed device buffers: sample from `logits`, record, run forward."""

    def __init__(
        self,
        decoder: LlamaDecoder,
        layout: PromptLayout,
        cache: StaticCache,
        logits: torch.Tensor,
        uniforms: torch.Tensor,
        params: SamplingParams,
    ) -> None:
        batch_size, n_steps = uniforms.shape
        assert logits.shape[0] == batch_size == cache.batch_size, (logits.shape, cache.batch_size)
        assert layout.length + n_steps <= cache.capacity, (layout.length, n_steps, cache.capacity)
        device = logits.device
        self.decoder, self.cache, self.params, self.uniforms = decoder, cache, params, uniforms
        self.key_mask = layout.key_mask  # (B, capacity) bool
        self.slot_index = torch.arange(cache.capacity, device=device)  # (capacity,)
        self.logits = logits.clone()  # (B, V) next-token logits
        self.positions = layout.positions.clone()  # (B, 1) rotary position of the next token
        self.slot = torch.full((1,), layout.length, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # decode step index
        self.tokens = torch.zeros((batch_size, n_steps), dtype=torch.long, device=device)
        self.logps = torch.zeros((batch_size, n_steps), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        uniforms = self.uniforms.index_select(1, self.column).squeeze(1)  # (B,)
        tokens, logps = sample_next(self.logits, self.params, uniforms)
        self.tokens.index_copy_(1, self.column, tokens[:, None])
        self.logps.index_copy_(1, self.column, logps[:, None].float())
        visible = self.key_mask & (self.slot_index <= self.slot)  # (B, capacity)
        logits = self.decoder.forward(
            tokens[:, None],
            self.positions,
            visible[:, None, None, :],
            self.cache,
            self.slot,
            self.cache.capacity,
        )
        self.logits.copy_(logits)
        self.positions += 1
        self.slot += 1
        self.column += 1


def decode_static(
    decoder: LlamaDecoder,
    layout: PromptLayout,
    cache: StaticCache,
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    rows: list,
    stop_rule,
    sync_every: int,
    cuda_graphs: bool,
) -> None:
    """Decode up to uniforms.shape[1] tokens for every row, appending them to `rows`.

    Args:
        decoder: the fused model forward, weights and rotary table prepared.
        layout: the batch's prompt layout, prefilled (layout.length == its width).
        cache: the prefilled cache, one row per request.
        logits: (B, V) next-token logits after the prompt.
        uniforms: (B, N) float64 per-request uniforms, one per step.
        rows: host-side rows in batch order; `stop_rule.feed(rows, tokens, logps)` appends.
        stop_rule: decides when a row is finished (EOS, stop strings, length).
        sync_every: steps between host reads of the sampled tokens.
        cuda_graphs: capture the step as a CUDA graph after one eager warm-up step.
    """
    step = _StaticStep(decoder, layout, cache, logits, uniforms, stop_rule.params)
    run: Callable[[], None] = step
    n_steps = uniforms.shape[1]
    for start in range(0, n_steps, sync_every):
        end = min(n_steps, start + sync_every)
        for column in range(start, end):
            if cuda_graphs and column == 0:
                run = _warm_up_and_capture(step)  # runs step 0 eagerly
            else:
                run()
        stop_rule.feed(rows, step.tokens[:, start:end], step.logps[:, start:end])
        if all(row.finish_reason is not None for row in rows):
            return


def _warm_up_and_capture(step: _StaticStep) -> Callable[[], None]:
    """Run `step` once eagerly on a side stream, then capture it as a CUDA graph.

    The eager run is a real decode step (it advances the state) and also the warm-up that CUDA
    graph capture needs (kernel choices, library workspaces). Returns the graph's replay.
    """
    side = torch.cuda.Stream()  # on the current device (the engine makes it the model's)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # captured on that stream: torch.cuda.graph's default capture stream is made once per
    # process, on whichever device first captured, and would miss a model on another GPU
    with torch.cuda.graph(graph, stream=side):
        step()  # recorded, not run: the state does not advance here
    logger.debug("captured a decode step for batch %d", step.cache.batch_size)
    return graph.replay
