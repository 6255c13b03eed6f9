"""The config ``rayfed run --resume RUN_DIR [field=value ...]`` runs: the run directory's, opened as its seal allows.

A run directory's ``config.json`` is data until its seal is checked: the marker's seal under this machine's key
(:func:`rayfed.engine.run_seal.check_seal`), ``config.json`` against the sealed config
(:func:`rayfed.engine.run_seal.check_config_file`) and the files of its code against their sealed digests
(:func:`rayfed.engine.plugin_seal.resume_sources`); only then are those files imported and the config built, and
the overrides applied. Anything else is refused in one line, before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rayfed.config import RunConfig, read_run_config, read_saved_config
from rayfed.config.args import resume_overrides
from rayfed.engine.plugin_seal import resume_sources
from rayfed.engine.run_identity import MARKER_FILE, RunMarker
from rayfed.engine.run_seal import check_config_file
from rayfed.util.config_tree import coerce
from rayfed.util.errors import CheckpointError
from rayfed.util.plugin_sources import load_source

__all__ = ["resumed_config"]


def resumed_config(resume: str, args: Sequence[str]) -> RunConfig:
    """The config of the run in ``resume``, its code imported once its seal holds, with the ``field=value``
    overrides of ``args`` (``train.rounds``, ``engine.*``, ``plugins``: what may change when a run continues)."""
    overrides = resume_overrides(args, resume)
    run_dir = Path(resume)
    path = run_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"cannot resume: {resume!r} holds no run (no config.json)")
    saved = read_saved_config(path)
    if (run_dir / MARKER_FILE).is_file():  # without one, the plan refuses the folder as no run of rayfed's
        marker = RunMarker.read(run_dir)
        if marker.config is not None:
            check_config_file(run_dir, marker.config)
        named = overrides.get("plugins")
        entries = None if named is None else coerce(tuple[str, ...], named, "plugins")
        for source in resume_sources(run_dir, marker, saved, entries):
            load_source(source, f"plugins entry {source.entry!r}")
    return read_run_config(path).override({**overrides, "run_dir": str(resume)})
