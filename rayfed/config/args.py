"""The config a command line names: an optional config file plus ``field.path=value`` overrides.

Shared by ``rayfed run`` (:mod:`rayfed.cli`) and ``rayfed tune`` (:mod:`rayfed.tuning.cli`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayfed.config import RunConfig, is_field_path, load_config, parse_override
from rayfed.util.config_tree import TABLE_SUFFIXES, coerce, read_table_file
from rayfed.util.errors import ConfigError

__all__ = ["config_from_args", "resume_overrides", "named_plugins"]


def config_from_args(args: Sequence[str], preset: str | None = None) -> RunConfig:
    """A config file (an argument without ``=`` that names a file) plus dotted overrides.

    With ``preset`` (:mod:`rayfed.config.presets`) the base is that paper protocol instead of a
    config file; the overrides still apply on top of it. Any other argument without ``=`` is a mistake (a
    forgotten ``=``, a misspelt file name) and raises ConfigError saying so. (``rayfed run --resume`` starts from
    a run directory's config instead: :func:`resume_overrides`, :mod:`rayfed.provenance.resume_config`.)

    >>> config_from_args(["train.rounds=7", "train.lr=0.02"]).train.rounds
    7
    >>> config_from_args(["train.rounds=7"], preset="cwfedavg-mnist").train.batch_size
    10
    >>> config_from_args(["train.rounds", "7"])
    Traceback (most recent call last):
    ...
    rayfed.util.errors.ConfigError: 'train.rounds' is neither a config file nor a field.path=value override
    """
    files, overrides = _split(args)
    if preset is not None:
        from rayfed.config.presets import preset_overrides

        if files:
            raise ConfigError(f"--preset {preset!r} cannot be combined with the config file {files[0]!r}: give one")
        base = preset_overrides(preset)
        if overrides.get("algorithm.name", base.get("algorithm.name")) != base.get("algorithm.name"):
            base = {k: v for k, v in base.items() if not k.startswith("algorithm.")}  # the preset algorithm's own
        return RunConfig().override({**base, **overrides})
    if files:
        return load_config(files[0], overrides)
    return RunConfig().override(overrides) if overrides else RunConfig()


def resume_overrides(args: Sequence[str], resume: str) -> dict[str, Any]:
    """The ``field.path=value`` overrides of ``rayfed run --resume RUN_DIR``, which takes no config file and no
    other ``run_dir``; ConfigError naming the argument otherwise."""
    files, overrides = _split(args)
    if files:
        raise ConfigError(
            f"--resume takes field.path=value overrides only, but got the config file {files[0]!r}: "
            f"a resumed run keeps the config saved in {str(Path(resume) / 'config.json')!r}"
        )
    if "run_dir" in overrides and Path(str(overrides["run_dir"])) != Path(resume):
        raise ConfigError(
            f"--resume {resume!r} continues the run in that folder, but run_dir={overrides['run_dir']!r} names "
            "another; drop run_dir=..., or start a new run there without --resume"
        )
    return overrides


def named_plugins(args: Sequence[str]) -> tuple[str, ...]:
    """The ``plugins`` entries that :func:`config_from_args` would import for ``args`` (its config file's, then
    those of a ``plugins=...`` override), read as data, importing nothing: for a check that must come first."""
    files, overrides = _split(args)
    table = read_table_file(files[0]) if files else {}
    named = [table.get("plugins") if isinstance(table, dict) else None, overrides.get("plugins")]
    return tuple(
        dict.fromkeys(e for value in named if value is not None for e in coerce(tuple[str, ...], value, "plugins"))
    )


def _split(args: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """(config files, overrides) of the command line's arguments, each checked (at most one file)."""
    files = [a for a in args if "=" not in a]
    for arg in files:
        if Path(arg).is_file():
            continue
        if Path(arg).is_dir():
            inside = sorted(p.name for p in Path(arg).iterdir() if p.suffix.lower() in TABLE_SUFFIXES)
            held = f"it holds {', '.join(inside[:5])}" if inside else "it holds no config file"
            raise ConfigError(f"{arg!r} is a folder, not a config file ({held}); give the path of one config file")
        if Path(arg).suffix.lower() in TABLE_SUFFIXES or "/" in arg:
            raise ConfigError(f"config file {arg!r} not found (looked in {str(Path.cwd())!r}); check its path")
        raise ConfigError(f"{arg!r} is neither a config file nor a field.path=value override")
    for arg in (a for a in args if "=" in a):
        _check_override(arg)
    if len(files) > 1:
        raise ConfigError(f"give at most one config file, but got {files}")
    return files, dict(parse_override(a) for a in args if "=" in a)


def _check_override(arg: str) -> None:
    """Refuse an argument with ``=`` that was meant as a config file: a file of that name, or ``path=value``
    whose value is a config file's name and whose path is no config field."""
    path, value = arg.split("=", 1)
    if Path(arg).is_file():
        raise ConfigError(
            f"{arg!r} is a file, but an argument with '=' is read as a field.path=value override; rename the file "
            "without '='"
        )
    if Path(value).suffix.lower() in TABLE_SUFFIXES and not is_field_path(path.strip()):
        raise ConfigError(
            f"{arg!r} reads as the override {path.strip()}={value}, but {path.strip()!r} is no config field; to run "
            f"a config file, give its path alone: rayfed run {value}"
        )
