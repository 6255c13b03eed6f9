"""The run's configuration: one typed, validated object (:mod:`~rayfed.config.run_config`), read from
files and ``field.path=value`` overrides (:mod:`~rayfed.util.config_tree`), the papers' presets
(:mod:`~rayfed.config.presets`), the command line's config arguments (:mod:`~rayfed.config.args`)
and the catalogue ``rayfed list`` prints (:mod:`~rayfed.config.catalogue`).

Each section type lives beside the code that reads it (``rayfed.data.settings``, ``rayfed.train.settings``,
``rayfed.algorithms.settings``, ``rayfed.system.settings``; the model and engine sections here, read by nothing below),
so no module below the config imports it, not even for type checking; the config gathers them into one
:class:`RunConfig` and checks the names that refer to registries of the layers below.
"""

from rayfed.config.run_config import (
    AlgorithmConfig,
    DataConfig,
    EngineConfig,
    ModelConfig,
    RunConfig,
    SystemConfig,
    TrainConfig,
    field_reference,
    is_field_path,
    load_config,
    parse_override,
    read_table_file,
)
from rayfed.config.saved import read_run_config, read_saved_config, saved_differences
from rayfed.config.trackers import TRACKERS, check_installed

__all__ = [
    "TRACKERS",
    "AlgorithmConfig",
    "DataConfig",
    "EngineConfig",
    "ModelConfig",
    "RunConfig",
    "SystemConfig",
    "TrainConfig",
    "saved_differences",
    "field_reference",
    "is_field_path",
    "load_config",
    "parse_override",
    "read_run_config",
    "read_saved_config",
    "read_table_file",
    "check_installed",
]
