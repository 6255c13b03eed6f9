"""The config ``rayfed run --resume RUN_DIR [field=value ...]`` runs: the run directory's, opened as its seal allows.

A run directory's ``config.json`` is data until its seal is checked: the marker's seal under this machine's key
(:func:`rayfed.provenance.run_seal.check_seal`), ``config.json`` against the sealed config
(:func:`rayfed.provenance.run_seal.check_config_file`) and the files of its code against their sealed digests
(:func:`rayfed.provenance.plugin_seal.resume_sources`); only then are those files imported and the config built, and
the overrides applied. Anything else is refused in one line, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rayfed.algorithms import ALGORITHMS
from rayfed.config import RunConfig, read_run_config, read_saved_config
from rayfed.config.args import resume_overrides
from rayfed.provenance.plugin_seal import marker_sources, resume_sources
from rayfed.provenance.run_identity import MARKER_FILE, RunMarker
from rayfed.provenance.run_seal import check_config_file
from rayfed.util.config_tree import coerce, get_path
from rayfed.util.errors import CheckpointError
from rayfed.util.plugin_sources import PluginSource, load_source

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
        _check_method_held(resume, saved, marker_sources(run_dir, marker))
    return read_run_config(path).override({**overrides, "run_dir": str(resume)})


def _check_method_held(resume: str, saved: Mapping[str, Any], sources: Sequence[PluginSource]) -> None:
    """CheckpointError saying that the run's method is not registered here, and where its run registered it (the
    ``sources`` its marker records), rather than blaming its intact ``config.json``."""
    name = get_path(saved, "algorithm.name")
    if not isinstance(name, str) or name in ALGORITHMS:
        return
    scripts = [source.file for source in sources if source.kind == "script"]
    if scripts:
        where = (
            f"its run registered it in the script {scripts[0]!r}, which a resume imports as a module, so a "
            'registration under `if __name__ == "__main__":` does not run: move it to the top of the script, or '
            "continue the run from the script with rayfed.run(config, resume=True)"
        )
    elif sources:
        files = ", ".join(repr(source.file) for source in sources)
        where = f"none of the code its run was sealed with ({files}) registers it now; register it there again"
    else:
        where = "its run recorded no code of its own: give the file that registers it with plugins=[FILE]"
    raise CheckpointError(
        f"cannot resume {resume!r}: its method algorithm.name={name!r} is not registered in this process (its "
        f"config.json is intact); {where}"
    )
