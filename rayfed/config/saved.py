"""A config rayfed saved (a run's ``config.json``, a study's base config), read as data.

Reading runs none of a run's code: its ``plugins`` are not imported (:meth:`RunConfig.from_saved`), so a run
directory or a study can be read, compared and drawn whoever wrote it (README.md, "What a run directory may do").
A config whose method only a plugin registers is then compared as the saved tree stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rayfed.config.retired import without_retired
from rayfed.config.run_config import RunConfig
from rayfed.util.bounded import read_json
from rayfed.util.config_tree import tree_differences
from rayfed.util.errors import CheckpointError, ConfigError

__all__ = ["read_saved_config", "read_run_config", "saved_differences"]


def read_saved_config(path: str | Path) -> dict[str, Any]:
    """A run's ``config.json`` as data (JSON, nothing built or imported); CheckpointError naming the file if it
    cannot be read or holds no table."""
    try:
        saved = read_json(path)
        if not isinstance(saved, dict):
            raise ValueError(f"it holds a {type(saved).__name__}, not a table")
        return saved
    except (ValueError, OSError) as error:
        raise CheckpointError(
            f"{str(path)!r} is not a readable run config ({error}); restore it from a copy, or choose another run_dir"
        ) from error


def read_run_config(path: str | Path) -> RunConfig:
    """The config a run saved (its ``config.json``), read as data (:meth:`RunConfig.from_saved`: its plugins are
    not imported); CheckpointError naming the file if it cannot be read, or names what this process does not
    hold."""
    try:
        return RunConfig.from_saved(read_saved_config(path))
    except ConfigError as error:
        raise CheckpointError(
            f"{str(path)!r} is not a readable run config ({error}); restore it from a copy, or choose another run_dir"
        ) from error


def saved_differences(saved: Mapping[str, Any], config: RunConfig, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """How ``config`` differs from a config rayfed saved, read as data: field by field as :meth:`RunConfig.diff`
    compares them, or, where the saved one names what this process does not hold (another plugin's method), as
    the saved tree stands."""
    try:
        return RunConfig.from_saved(saved).diff(config, ignore=ignore)
    except ConfigError:
        return tree_differences(without_retired(saved), config.to_dict(), ignore=ignore)
