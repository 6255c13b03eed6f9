"""The run's configuration: one typed, validated object (:mod:`~rayfed.config.run_config`), read from
files and ``field.path=value`` overrides (:mod:`~rayfed.config.files`), the papers' presets
(:mod:`~rayfed.config.presets`), the command line's config arguments (:mod:`~rayfed.config.args`)
and the catalogue ``rayfed list`` prints (:mod:`~rayfed.config.catalogue`).

The config sits above the registries it validates names against (algorithms, partitioners,
datasets, models); everything below it reads its sections only for type checking.
"""

from rayfed.config.run_config import (
    AlgorithmConfig,
    DataConfig,
    EngineConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    field_reference,
    load_config,
    parse_override,
    read_run_config,
    read_table_file,
)

__all__ = [
    "AlgorithmConfig",
    "DataConfig",
    "EngineConfig",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "field_reference",
    "load_config",
    "parse_override",
    "read_run_config",
    "read_table_file",
]
