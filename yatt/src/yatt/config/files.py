"""Configs as files: YAML presets (`configs/<name>.yaml` or a path), dotted `section.key=value`
overrides, and the resolved config written beside a run's outputs and checkpoints."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from yatt.config.schema import Config, _coerce, _field_types
from yatt.errors import ConfigError

__all__ = [
    "PRESET_DIR",
    "SAVED_CONFIG_HEADER",
    "apply_overrides",
    "config_from_dict",
    "load_config",
    "preset_names",
    "read_saved_config",
    "save_config",
    "to_dict",
]

PRESET_DIR = Path(__file__).parent.parent / "configs"


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    """Instantiate dataclass `cls` from a nested dict, strictly (an empty section = defaults)."""
    if values is None and prefix:  # `train:` with nothing under it
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"'{prefix or 'config'}' expects a mapping, got {values!r}")
    hints = _field_types(cls)
    unknown = sorted(set(values) - set(hints), key=str)  # (a YAML key may be a number)
    if unknown:
        where = f"in '{prefix}'" if prefix else "at top level"
        raise ConfigError(f"unknown config key '{unknown[0]}' {where}; valid: {sorted(hints)}")
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else name
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = _build(annotation, value, key)
        else:  # (checked here for the key's name in errors; the section checks it again)
            kwargs[name] = _coerce(key, value, annotation)
    return cls(**kwargs)


def to_dict(config: Any) -> dict[str, Any]:
    """The config tree as plain YAML-able data (tuples become lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(config))


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# ---------------------------------------------------------------- presets and overrides


def preset_names() -> list[str]:
    """Names of the built-in presets (`configs/*.yaml` without the suffix)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


_YAML_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(Exception):
    """A mapping in a config file names a key twice (YAML would silently keep the last)."""


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a mapping naming the same key twice.

    Checked where PyYAML flattens merges (`<<: *anchor`), once per mapping and before its
    merged keys join it: a key a merge brings in may be overridden, by design."""

    def flatten_mapping(self, node):
        checked = self.__dict__.setdefault("_checked", set())
        if id(node) not in checked:
            checked.add(id(node))
            seen: set[str] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _YAML_MERGE:
                    continue  # config keys are names
                if key_node.value in seen:
                    line = key_node.start_mark.line + 1
                    raise _DuplicateKey(
                        f"key {key_node.value!r} appears twice in one section (line {line})"
                    )
                seen.add(key_node.value)
        super().flatten_mapping(node)


# YAML 1.1 reads 010 as 8, 0x10 as 16 and 1:30 as 90: a config is read with decimal ints and
# floats only, so those stay strings and a number setting refuses them by name.
_YAML_INT, _YAML_FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_YAML_INT, _YAML_FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _YAML_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789")
)
_StrictLoader.add_implicit_resolver(
    _YAML_FLOAT,
    re.compile(
        r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _read_preset(preset: str) -> dict[str, Any]:
    path = Path(preset)
    named = PRESET_DIR / f"{preset}.yaml"
    if (not path.suffix and named.is_file()) or not path.is_file():
        path = named  # a preset's name wins over a file of that name without a suffix
    if not path.is_file():
        raise ConfigError(
            f"config '{preset}' is neither a YAML file nor a preset; presets: {preset_names()}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:  # (no read permission ...)
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"config file {path} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} on line {line})"
        ) from None
    try:
        loaded = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader
    except _DuplicateKey as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", -1) + 1
        raise ConfigError(f"config file {path} is not valid YAML (line {line})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(loaded).__name__}")
    return loaded or {}


def _sets_nothing(values: dict[str, Any]) -> bool:
    """Whether a config file's content sets no key (empty, only comments, empty sections)."""
    return all(value is None or value == {} for value in values.values())


def _override_value(cls: type, dotted: str, raw: str) -> Any:
    """Parse the text of one override by the target field's type (strings stay verbatim)."""
    hints = _field_types(cls)
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if part not in hints:
            where = ".".join(parts[:depth]) or "top level"
            raise ConfigError(
                f"unknown config key '{dotted}' (no '{part}' in {where}); valid: {sorted(hints)}"
            )
        annotation = hints[part]
        if depth < len(parts) - 1:
            if not dataclasses.is_dataclass(annotation):
                raise ConfigError(f"unknown config key '{dotted}': '{part}' has no sub-keys")
            hints = _field_types(annotation)
        elif dataclasses.is_dataclass(annotation):
            keys = sorted(_field_types(annotation))
            raise ConfigError(f"'{dotted}' is a section; set one of its keys: {keys}")
    if annotation is str:
        return raw
    if annotation is float:
        try:  # YAML 1.1 reads '1e-5' (no dot) as a string
            return float(raw)
        except ValueError:
            pass
    try:
        return yaml.load(raw, Loader=_StrictLoader) if raw != "" else ""  # a SafeLoader
    except _DuplicateKey as exc:
        raise ConfigError(f"value {raw!r} for '{dotted}': {exc}") from None
    except yaml.YAMLError:
        raise ConfigError(f"cannot parse value {raw!r} for '{dotted}'") from None


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` strings to a nested dict (validated against Config)."""
    result = dict(values)
    for item in overrides:
        dotted, equals, raw = item.partition("=")
        if not equals or not dotted.strip():
            raise ConfigError(f"override {item!r} must look like section.key=value")
        value = _override_value(Config, dotted.strip(), raw.strip())
        nested: Any = value
        for part in reversed(dotted.strip().split(".")):
            nested = {part: nested}
        result = _merge(result, nested)
    return result


def load_config(
    preset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    defaults_for: tuple[str, ...] = (),
) -> Config:
    """Defaults, then `preset` (a name in configs/ or a YAML path), then dotted overrides.
    `defaults_for`: sections whose preset values are left out (their defaults stand, before
    the overrides): `yatt eval` runs no controllers, so a run's `control` section is not its.

    Raises:
        ConfigError: unknown preset/key, unparsable YAML, wrong type or out-of-range value, a
            config file that sets nothing given with no overrides.
    """
    values = _read_preset(preset) if preset else {}
    if preset and not overrides and _sets_nothing(values):
        # (a run of every default: 100 steps into runs/default; an empty file is a slip)
        raise ConfigError(
            f"config file {preset} sets nothing (it is empty, or holds only comments or empty "
            f"sections): give it settings, or start from a preset: {preset_names()}"
        )
    values = {key: value for key, value in values.items() if key not in defaults_for}
    values = apply_overrides(values, list(overrides))
    return _build(Config, values, "")


def config_from_dict(values: dict[str, Any]) -> Config:
    """Rebuild a Config from `to_dict` output (e.g. the copy stored in a checkpoint)."""
    return _build(Config, values, "")


SAVED_CONFIG_HEADER = "# Written by yatt: the resolved config of the run it sits beside.\n"


def save_config(config: Config, path: Path) -> Path:
    """Write the resolved config as YAML (`path` is a file or a folder -> folder/config.yaml),
    under `SAVED_CONFIG_HEADER` (so a run folder tells its own config from a user's file)."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        path = path / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SAVED_CONFIG_HEADER + yaml.safe_dump(to_dict(config), sort_keys=False))
    return path


def read_saved_config(path: Path) -> dict[str, Any] | None:
    """The mapping a saved config.yaml holds, as written (not built into a Config, which would
    import its reward modules); None when it is missing, unreadable or not a mapping."""
    try:
        values = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return values if isinstance(values, dict) else None
