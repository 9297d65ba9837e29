"""LoRA: low-rank adapters trained in place of a causal LM's weights (Hu et al., 2021).

`apply_lora` swaps each targeted projection (`nn.Linear` children named in `model.lora_targets`:
q_proj ... down_proj) for a `LoraLinear`, which keeps the frozen weight W and adds
`scale * B @ A` (A: rank x in, random; B: out x rank, zero; scale = alpha / rank), so the
adapted model starts equal to the base. Every other parameter is frozen: the optimizer, the
gradients and the data-parallel all-reduce cover A and B alone.

What the rest of yatt uses:
  * `trained_state` / `load_trained_state`: the weights training changes, the adapters alone
    for an adapted model (what weight sync pushes to a separate sampler and a re-placement
    moves), else the whole state dict. The base weights are the same everywhere: every process
    builds them from `model.path`.
  * `effective_weight`: W + scale * B @ A, what yatt's fused sampler decodes with (it merges
    once per weight refresh, so sampling costs what the base model costs).
  * `adapters_off`: the base model, for the KL reference, which shares the policy's module
    instead of holding a copy.
  * `merged_state_dict` and `save_adapters` / `load_adapters`: a saved model folder holds the
    merged weights (a plain model any `from_pretrained` loads) and the adapters with their
    settings (`adapter.safetensors`, `adapter.json`), from which a resume continues exactly.
  * `plain_copy`: a deep copy with the adapters merged (a PPO critic's backbone trains whole).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from yatt.errors import ConfigError, ModelError

__all__ = [
    "ADAPTER_FILE",
    "ADAPTER_META",
    "LoraLinear",
    "adapter_settings",
    "adapters_off",
    "apply_lora",
    "check_same_base",
    "effective_weight",
    "has_lora",
    "load_adapters",
    "load_trained_state",
    "merged_state_dict",
    "plain_copy",
    "read_adapter_meta",
    "read_adapters",
    "save_adapters",
    "trained_state",
]

ADAPTER_FILE, ADAPTER_META = "adapter.safetensors", "adapter.json"
_PARAMS = ("lora_a", "lora_b")
_INIT_SEED = 0  # A's init: every process building the model draws the same adapters


class LoraLinear(nn.Linear):
    """`nn.Linear` with a frozen weight plus a trained low-rank update `scale * B @ A`."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a weight to drop
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        weight = base.weight
        bound = 1.0 / math.sqrt(self.in_features)  # nn.Linear's default init range
        a = (torch.rand(rank, self.in_features, generator=generator) * 2 - 1) * bound
        self.lora_a = nn.Parameter(a.to(device=weight.device, dtype=weight.dtype))
        self.lora_b = nn.Parameter(
            torch.zeros(self.out_features, rank, device=weight.device, dtype=weight.dtype)
        )
        self.rank, self.alpha, self.scale = rank, float(alpha), float(alpha) / rank
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if not self.enabled:
            return out
        return out + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale

    def merged_weight(self) -> torch.Tensor:
        """W + scale * B @ A, detached (whatever `enabled` says)."""
        with torch.no_grad():
            return torch.addmm(self.weight, self.lora_b, self.lora_a, alpha=self.scale)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha:g}"


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...]) -> nn.Module:
    """Put adapters on `model`'s `targets` projections in place and freeze everything else;
    returns the model. ConfigError when no linear layer has a targeted name."""
    generator = torch.Generator().manual_seed(_INIT_SEED)
    for param in model.parameters():
        param.requires_grad_(False)
        param.grad = None
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and type(child) is nn.Linear:
                setattr(module, name, LoraLinear(child, rank, alpha, generator))
                swapped += 1
    if not swapped:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ConfigError(
            f"model.lora_targets={list(targets)} matched no linear layer of this {kind} model"
        )
    return model


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoraLinear]]:
    return ((name, m) for name, m in model.named_modules() if isinstance(m, LoraLinear))


def has_lora(model: nn.Module) -> bool:
    return next(lora_layers(model), None) is not None


def effective_weight(linear: nn.Linear) -> torch.Tensor:
    """The weight `linear` multiplies by: merged with its adapters if it has some."""
    return linear.merged_weight() if isinstance(linear, LoraLinear) else linear.weight


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """Run `model` as its base model inside the block (adapters skipped, not changed)."""
    layers = [layer for _, layer in lora_layers(model)]
    were = [layer.enabled for layer in layers]
    for layer in layers:
        layer.enabled = False
    try:
        yield model
    finally:
        for layer, was in zip(layers, were, strict=True):
            layer.enabled = was


def _is_adapter(key: str) -> bool:
    """Whether a state-dict key names an adapter matrix (``...q_proj.lora_a``)."""
    return key.rsplit(".", 1)[-1] in _PARAMS


def trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What training changes: the adapters of an adapted model, else its whole state dict."""
    state = model.state_dict()
    if not has_lora(model):
        return state
    return {key: value for key, value in state.items() if _is_adapter(key)}


def load_trained_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load `trained_state` output (or a whole state dict) into `model` in place."""
    adapters_only = all(_is_adapter(key) for key in state)
    if not has_lora(model) or not adapters_only or not state:  # a whole state dict
        model.load_state_dict(state)
        return
    wanted = set(trained_state(model))
    missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted)
    if missing or unexpected:
        named = [f"lack {len(missing)} tensors, e.g. {missing[0]!r}"] if missing else []
        named += [f"hold {len(unexpected)} unknown, e.g. {unexpected[0]!r}"] if unexpected else []
        raise ModelError(f"the adapter weights do not fit this model: they {' and '.join(named)}")
    model.load_state_dict(state, strict=False)


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict under its base names, each adapted weight merged."""
    state = {k: v for k, v in model.state_dict().items() if not _is_adapter(k)}
    for name, layer in lora_layers(model):
        state[f"{name}.weight"] = layer.merged_weight()
    return state


def plain_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` with every adapter merged into a plain `nn.Linear`."""
    clone = copy.deepcopy(model)
    for module in list(clone.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoraLinear):
                plain = nn.Linear.__new__(nn.Linear)  # its init would allocate a weight
                nn.Module.__init__(plain)
                plain.in_features, plain.out_features = child.in_features, child.out_features
                plain.weight = nn.Parameter(child.merged_weight())
                plain.register_parameter("bias", child.bias)
                setattr(module, name, plain)
    for param in clone.parameters():
        param.requires_grad_(True)
    return clone


def adapter_settings(model: nn.Module) -> dict[str, Any]:
    """Rank, alpha and the targeted projection names of an adapted model."""
    layers = list(lora_layers(model))
    _, first = layers[0]
    targets = sorted({name.rsplit(".", 1)[-1] for name, _ in layers})
    return {"rank": first.rank, "alpha": first.alpha, "targets": targets}


def save_adapters(model: nn.Module, folder: Path) -> None:
    """Write the adapters and their settings into a model folder."""
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu").contiguous() for k, v in trained_state(model).items()}
    save_file(state, str(Path(folder) / ADAPTER_FILE))
    (Path(folder) / ADAPTER_META).write_text(json.dumps(adapter_settings(model), indent=1) + "\n")


def check_same_base(model: nn.Module, folder: Path, base: str) -> None:
    """Refuse adapters loaded onto another base than they trained on: the folder's merged
    weight of the first adapted projection must equal this model's base plus adapters
    (ConfigError naming `base`, the `model.path` the run built). A folder whose weights file
    lacks that tensor (sharded) is not checked."""
    from safetensors import safe_open

    name, layer = next(lora_layers(model))
    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        return
    try:
        with safe_open(str(path), framework="pt") as weights:
            if f"{name}.weight" not in weights.keys():  # noqa: SIM118 (a safe_open handle)
                return
            saved = weights.get_tensor(f"{name}.weight")
    except Exception as error:  # (safetensors' own error types: a truncated or foreign file)
        detail = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        raise ConfigError(f"cannot read {path} to check the adapters' base: {detail}") from None
    merged = layer.merged_weight().to("cpu", saved.dtype)
    if saved.shape != merged.shape or not torch.allclose(saved, merged, rtol=1e-4, atol=1e-5):
        raise ConfigError(
            f"the adapters in {folder} were trained on another base model than "
            f"model.path={base!r} (its merged {name} differs): resume with the model.path the "
            "run trained"
        )


def read_adapter_meta(folder: Path) -> dict[str, Any] | None:
    """The adapter settings saved in a model folder (None: it holds no adapters)."""
    path = Path(folder) / ADAPTER_META
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        return {"rank": int(meta["rank"]), "alpha": float(meta["alpha"]),
                "targets": sorted(meta["targets"])}  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path} is not an adapter description: {exc}") from exc


def load_adapters(model: nn.Module, folder: Path) -> None:
    """Load the adapters a model folder holds into an adapted `model` whose settings match
    (ModelError naming the difference otherwise)."""
    device = next(model.parameters()).device
    state = read_adapters(folder, model)
    load_trained_state(model, {k: v.to(device) for k, v in state.items()})


def read_adapters(folder: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters a model folder holds (on the CPU), for an adapted `model` whose settings
    match (ModelError naming the difference otherwise)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    saved, wanted = read_adapter_meta(folder), adapter_settings(model)
    if saved is None:
        raise ModelError(f"{folder} holds no adapters ({ADAPTER_META})")
    if saved != wanted:
        raise ModelError(
            f"the adapters in {folder} are rank {saved['rank']}, alpha {saved['alpha']:g} on "
            f"{saved['targets']}; this run's model.lora_* ask for rank {wanted['rank']}, alpha "
            f"{wanted['alpha']:g} on {wanted['targets']}"
        )
    try:
        return load_file(str(folder / ADAPTER_FILE))
    except (OSError, SafetensorError) as exc:
        raise ModelError(f"cannot read {folder / ADAPTER_FILE}: {exc}") from exc
