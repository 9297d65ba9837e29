"""vLLM as a rollout backend (`rollout.backend: vllm`), for CUDA machines that have it installed.

vLLM is imported lazily, here only: a missing install is a one-line ConfigError, never an
import error at yatt's import. The engine runs its own copy of the weights, loaded from the
model's folder (or a temporary save of it) and then set to the model's weights in memory, and
`load_state_dict` pushes new weights into that copy and drops vLLM's prefix cache (whose keys
and values the old weights computed: vLLM does not invalidate it on a weight change). Weights
travel through `LLM.apply_model`, which vLLM's V1 engine runs in its own process only with
`VLLM_ALLOW_INSECURE_SERIALIZATION=1` (set here unless the user set it). Per-request seeds make
each row reproducible, as in yatt's engine (the streams differ).
"""

import importlib
import logging
import os
import tempfile
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from yatt.errors import ConfigError
from yatt.rollout.engine import (
    Completion,
    EngineBase,
    _check_request,
)
from yatt.rollout.sampling import SamplingParams, check_logprob

__all__ = ["VLLMEngine"]

logger = logging.getLogger(__name__)


def _import_vllm():
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise ConfigError(
            "rollout backend 'vllm' needs the vllm package (pip install vllm, CUDA only); "
            "use backend 'yatt' otherwise"
        ) from exc


class VLLMEngine(EngineBase):
    """Rollouts through `vllm.LLM` on the model's weights (a separate copy on the GPU).

    Log-probs are vLLM's for the sampled tokens (by default under the model's raw distribution,
    before temperature/top-k/top-p; yatt's engine reports them under the sampling distribution).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: torch.dtype | None = None,
        gpu_memory_utilization: float = 0.3,
    ) -> None:
        """Raises ConfigError when vllm is not installed."""
        vllm = _import_vllm()
        self.model = model
        self.tokenizer = tokenizer
        self._vllm = vllm
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._folder = self._model_folder(model, tokenizer)
        dtype = dtype or next(model.parameters()).dtype
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's function
        self._llm = vllm.LLM(
            model=str(self._folder),
            dtype=str(dtype).removeprefix("torch."),
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=True,
        )
        if self._tmp is None:  # the folder's weights, which the model may have left in memory
            self.load_state_dict(model.state_dict())

    def _model_folder(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Path:
        """The model's own folder when it was loaded from one, else a temporary save."""
        source = Path(str(getattr(model, "name_or_path", "") or ""))
        if (source / "config.json").is_file():
            return source
        self._tmp = tempfile.TemporaryDirectory(prefix="yatt_vllm_")
        model.save_pretrained(self._tmp.name)
        tokenizer.save_pretrained(self._tmp.name)
        return Path(self._tmp.name)

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Completion]:
        """Sample one completion per prompt with vLLM; see RolloutEngine.generate.

        Raises:
            ConfigError: a malformed request (see `_check_request`: prompts as lists of token ids
                in the vocabulary, one int seed each in [-2**63, 2**64)).
        """
        _check_request(prompt_ids, seeds, params.max_new_tokens, self.model)
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompt_ids),)).tolist()
        requests = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        sampling = [self._sampling_params(params, seed) for seed in seeds]
        outputs = self._llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        return [self._completion(ids, out.outputs[0]) for ids, out in zip(prompt_ids, outputs)]

    def _sampling_params(self, params: SamplingParams, seed: int):
        return self._vllm.SamplingParams(
            n=1,
            temperature=0.0 if params.is_greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k else -1,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,  # as HF generate and yatt's engine
            ignore_eos=params.ignore_eos,
            seed=int(seed) % 2**63,
            logprobs=0,  # the sampled token's log-prob only
        )

    @staticmethod
    def _completion(prompt: list[int], output) -> Completion:
        token_ids = list(output.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(output.logprobs, token_ids)]
        for position, logprob in enumerate(logprobs, 1):
            check_logprob(logprob, position)  # a diverged policy: one line, not garbage rows
        reason = "length" if output.finish_reason == "length" else "stop"
        return Completion(list(prompt), token_ids, output.text, reason, logprobs)

    def shares_weights(self, module: torch.nn.Module) -> bool:
        """Never: vLLM samples its own copy, which only ``load_state_dict`` updates."""
        return False

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Push new weights (HF names) into vLLM's copy of the model, and into `self.model`
        (the HF module callers score behaviour log-probs with) unless `state` is its own."""
        items = list(state.items())
        self._llm.apply_model(lambda model: model.load_weights(items))
        self._llm.reset_prefix_cache()  # cached prompt keys and values of the old weights
        own = {p.data_ptr() for p in self.model.state_dict().values()}
        if not all(t.data_ptr() in own for t in state.values()):
            self.model.load_state_dict(state)
