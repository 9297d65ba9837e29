"""Sampling parameters and the next-token sampler shared by the rollout backends.

Randomness is counter-free: each request's uniforms are drawn up front from its own
`torch.Generator(seed)`, one per decode step, and a token is chosen by inverting the CDF of the
(temperature, top-k, top-p) distribution. A row's sample therefore depends only on its seed and
its logits, never on the batch around it, and the decode loop holds no generator state (which
keeps it open for CUDA graphs).

Logits with a NaN or an infinity (a diverged policy) leave no distribution to sample from. The
sampler does not stop for them on the device (no host sync, nothing a CUDA graph cannot hold):
such a row gets an in-range token with a non-finite log-prob, and the engines raise
`SamplingError` (`check_logprob`) when they read the step back on the host.
"""

import math
from dataclasses import dataclass

import torch

from yatt.errors import ConfigError, SamplingError

__all__ = [
    "SamplingError",
    "SamplingParams",
    "check_logprob",
    "draw_uniforms",
    "flat_at_zeros",
    "non_finite_logits",
    "sample_next",
]


def check_logprob(logp: float, step: int) -> None:
    """Raise SamplingError (one line naming `step`, 1-based within the completion) unless
    `logp`, a sampled token's log-prob from `sample_next`, is finite.

    A token `sample_next` draws from finite logits always has a finite log-prob (it never picks
    a token of zero probability), so a non-finite one means the logits were not finite.
    """
    if not math.isfinite(logp):
        raise non_finite_logits(step)


def non_finite_logits(step: int | None) -> SamplingError:
    """The one-line SamplingError for logits with a NaN or an infinity at decode `step`
    (1-based; None where the backend does not say which)."""
    where = f"at decode step {step}" if step is not None else "while decoding"
    return SamplingError(
        f"the policy produced NaN or infinite logits {where}, so no token can be sampled: "
        "its weights have likely diverged (lower optim.lr, keep optim.grad_clip > 0), or "
        "rollout.temperature is too small to divide by"
    )


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion per prompt.

    `greedy` (or `temperature == 0`) takes the arg-max token. Otherwise logits are divided by
    `temperature`, restricted to the `top_k` most likely tokens (0 = all) and to the smallest set
    whose probability reaches `top_p`, and sampled. Generation stops at EOS, at any of the `stop`
    strings (kept in the text, as HF `generate` does) or after `max_new_tokens` tokens.
    `ignore_eos` (as vLLM's) keeps sampling past EOS tokens, which stay in the completion, so a
    row stops only at a stop string or its budget: for benchmarks that need fixed lengths.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    greedy: bool = False
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ConfigError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.stop, str):
            raise ConfigError(f"stop must be a tuple of strings, got the string {self.stop!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop strings must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0


def draw_uniforms(seeds: list[int], n_steps: int, device: torch.device) -> torch.Tensor:
    """Per-request uniforms in [0, 1): row i comes from `torch.Generator().manual_seed(seeds[i])`.

    Returns a float64 tensor (len(seeds), n_steps) on `device`. torch's CPU generator keys its
    stream on the seed's low 32 bits: seeds equal modulo 2**32 draw the same row (yatt's own
    per-row seeds differ in their low bits; a caller packing e.g. `step << 32 | row` should not).
    """
    rows = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(int(seed))
        rows.append(torch.rand(n_steps, generator=generator, dtype=torch.float64))
    return torch.stack(rows).to(device)


def filtered_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probs of the sampling distribution: temperature, then top-k, then top-p.

    logits: (B, V) float. Returns (B, V) float32; filtered-out tokens are -inf.
    """
    scaled = logits.float() / params.temperature  # (B, V)
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    logp = torch.log_softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)  # (B, V)
        mass_before = torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()
        # Keep a token while the mass strictly before it is below top_p: the top token always
        # survives, and the kept set is the smallest one reaching top_p.
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, -math.inf), dim=-1)
    return logp


def sample_next(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the next token of each row.

    Args:
        logits: (B, V) next-token logits.
        params: sampling parameters.
        uniforms: (B,) float64 in [0, 1), this step's uniform per row (ignored when greedy).
    Returns:
        tokens (B,) int64 and their log-probs (B,) float32 under the sampling distribution
        (for greedy: under the temperature-1 distribution). Every token is in [0, V). A row
        whose logits hold a NaN or an infinity gets a non-finite log-prob (and an arbitrary
        token) instead of an error here; callers check it on the host (`check_logprob`).
    """
    if params.is_greedy:
        logp = torch.log_softmax(logits.float(), dim=-1)
        # bf16 -> fp32 is exact, and torch's bf16 argmax is ~10x slower than its fp32 one.
        tokens = torch.argmax(logits.float(), dim=-1)
    else:
        logp = filtered_logprobs(logits, params)
        probs = logp.exp()
        cdf = torch.cumsum(probs, dim=-1)  # (B, V)
        if cdf.is_cuda:  # a parallel scan: its sums may round up at a filtered-out token
            cdf = flat_at_zeros(cdf, probs)
        total = cdf[:, -1:]  # (B, 1), 1 up to rounding
        # The target stays strictly below the CDF's own total, so the first entry above it is
        # a token of positive probability (never past the end, never a filtered-out token).
        targets = torch.minimum(uniforms.unsqueeze(-1).to(cdf.dtype) * total, _below(total))
        tokens = torch.searchsorted(cdf, targets, right=True).squeeze(-1)  # (B,)
        # A NaN CDF (non-finite logits) puts the target past the end: keep the index in range,
        # so the gather below and the next forward's embedding lookup stay valid (an index
        # error on the CPU, a device-side assert on CUDA); its NaN log-prob reports the row.
        tokens = tokens.clamp_(max=cdf.shape[-1] - 1)
    token_logp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, token_logp


def flat_at_zeros(cdf: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """`cdf` made flat at every token of zero probability, and non-decreasing.

    A sequential cumulative sum adds exactly 0 there, so the CPU's needs nothing. CUDA's scan
    sums in tree order: the total before and at a filtered-out token can differ by a rounding
    step, and `searchsorted` could then land on that token (log-prob -inf, a false
    SamplingError). Here such a token repeats the largest sum before it (-inf before the first
    kept token), so it is never the first entry above a target. NaN rows stay NaN.
    """
    masked = cdf.masked_fill(probs == 0, float("-inf"))
    return torch.cummax(masked, dim=-1).values


def _below(values: torch.Tensor) -> torch.Tensor:
    """The largest representable number below each value."""
    return torch.nextafter(values, torch.zeros_like(values))
