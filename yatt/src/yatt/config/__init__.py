"""Run configuration: one frozen dataclass per component, YAML presets, dotted CLI overrides.

Resolution order: dataclass defaults, then a preset (`configs/<name>.yaml` or a YAML path, holding
only differences from the defaults), then `section.key=value` overrides. Unknown keys and type
mismatches raise ConfigError naming the key, the value and the valid choices. Each component gets
its own sub-config; `to_dict`/`save_config` write the resolved tree next to outputs and checkpoints.

The sections and their checks live in `yatt.config.schema`, reading and writing them in
`yatt.config.files`; import either from here.
"""

from yatt.config.files import (
    SAVED_CONFIG_HEADER,
    apply_overrides,
    config_from_dict,
    load_config,
    preset_names,
    read_saved_config,
    save_config,
    to_dict,
)
from yatt.config.schema import (
    GROUP_ESTIMATORS,
    LORA_TARGETS,
    AlgoConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    changed_settings,
    check_controller_settings,
    check_section,
    log_level,
)

__all__ = [
    "GROUP_ESTIMATORS",
    "LORA_TARGETS",
    "SAVED_CONFIG_HEADER",
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainConfig",
    "apply_overrides",
    "changed_settings",
    "check_controller_settings",
    "check_section",
    "config_from_dict",
    "load_config",
    "log_level",
    "preset_names",
    "read_saved_config",
    "save_config",
    "to_dict",
]
