"""Reference rollout backend: Hugging Face `model.generate` behind the RolloutEngine interface.

Used to check yatt's engine (greedy outputs must match token for token) and as a baseline in
`bench/rollout.py`. HF samples a batch from one global generator, so seeds here make a whole
batch reproducible, not each row on its own.
"""

import logging
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from yatt.errors import ConfigError
from yatt.rollout.engine import (
    Completion,
    EngineBase,
    _append_token,
    _check_request,
    _completes_stop,
    _pad_token_id,
    _Row,
    eos_token_ids,
)
from yatt.rollout.sampling import SamplingParams, non_finite_logits

__all__ = ["HFGenerateEngine"]

logger = logging.getLogger(__name__)


class HFGenerateEngine(EngineBase):
    """Wraps `model.generate` (left padding, KV cache, HF logits warpers and stop strings)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str | torch.device | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else model.device
        self._pad_id = _pad_token_id(tokenizer)

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Completion]:
        """Sample one completion per prompt with `model.generate`; see RolloutEngine.generate.

        Raises:
            ConfigError: a malformed request (see `_check_request`: prompts as lists of token ids
                in the vocabulary, one int seed each in [-2**63, 2**64)).
            SamplingError: the policy's logits held a NaN or an infinity.
        """
        _check_request(prompt_ids, seeds, params.max_new_tokens, self.model)
        if params.ignore_eos:
            raise ConfigError("ignore_eos needs the yatt or vllm rollout backend, not hf")
        input_ids, attention_mask = self._left_pad(prompt_ids)
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        was_training = self.model.training
        self.model.eval()
        # HF fills every setting a call leaves unset from the model's generation_config: a
        # checkpoint's repetition_penalty, min_p, no_repeat_ngram_size ... would reshape the
        # distribution the trainer never sees. The call's settings alone apply.
        shipped, self.model.generation_config = self.model.generation_config, GenerationConfig()
        if seeds is None:  # drawn here: the fork below undoes every draw made inside it
            seeds = torch.randint(0, 2**62, (len(prompt_ids),)).tolist()
        try:
            with torch.inference_mode(), torch.random.fork_rng(devices=self._rng_devices()):
                torch.manual_seed(hash(tuple(seeds)) % 2**63)
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    **self._generate_kwargs(params, sorted(eos_ids), input_ids.shape[1]),
                )
        except RuntimeError as exc:  # torch.multinomial on NaN/inf probabilities
            if "probability tensor contains" not in str(exc):
                raise
            raise non_finite_logits(None) from exc
        finally:
            self.model.generation_config = shipped
            self.model.train(was_training)
        generated = out.sequences[:, input_ids.shape[1] :]  # (B, n <= N)
        # scores[t] (B, V) holds the processed logits of step t: the sampling distribution.
        token_logps = torch.stack(
            [
                scores.float().log_softmax(-1).gather(-1, generated[:, t, None]).squeeze(-1)
                for t, scores in enumerate(out.scores)
            ],
            dim=1,
        ).tolist()  # (B, n)
        new_tokens = generated.tolist()
        return [
            self._completion(p, toks, lps, params, eos_ids)
            for p, toks, lps in zip(prompt_ids, new_tokens, token_logps)
        ]

    def _generate_kwargs(self, params: SamplingParams, eos_ids: list[int], width: int) -> dict:
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=0,
            eos_token_id=eos_ids,
            pad_token_id=self._pad_id,
            return_dict_in_generate=True,
            output_scores=True,
            use_cache=True,
        )
        if params.stop:  # RolloutEngine's rule: HF's stop_strings also match across the prompt
            stops = _GeneratedStops(self.tokenizer, tuple(params.stop), width)
            kwargs.update(stopping_criteria=StoppingCriteriaList([stops]))
        if params.is_greedy:
            return kwargs | dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kwargs | dict(
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
        )

    def _completion(
        self,
        prompt: list[int],
        tokens: list[int],
        logps: list[float],
        params: SamplingParams,
        eos_ids: set[int],
    ) -> Completion:
        # Replay the same stop rules as RolloutEngine: HF pads finished rows, and the padding
        # may be the EOS id itself, so the first stop decides where the completion ends.
        row = _Row(prompt_ids=list(prompt))
        for token, logp in zip(tokens, logps):
            _append_token(row, token, logp, params, eos_ids, self.tokenizer)
            if row.finish_reason is not None:
                break
        assert row.finish_reason is not None, f"HF generate ended a row early: {row.token_ids}"
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        return Completion(row.prompt_ids, row.token_ids, text, row.finish_reason, row.logprobs)

    def _left_pad(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, ids in enumerate(prompt_ids):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _rng_devices(self) -> list:
        return [self.device] if self.device.type == "cuda" else []


class _GeneratedStops(StoppingCriteria):
    """Ends a row once its newest generated token completes a stop string, judged on the
    generated tokens alone (`_completes_stop`, as RolloutEngine does): a stop string that only
    appears with the prompt's last tokens does not end the row."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...], width: int) -> None:
        self.tokenizer, self.stops, self.width = tokenizer, stops, width

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        done = [
            _completes_stop(self.tokenizer, row[self.width :], self.stops)
            for row in input_ids.tolist()
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
