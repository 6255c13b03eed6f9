"""What code a continued run may run: the files its marker was sealed with, found from here and compared.

A run's marker records, sealed, each file of its code outside rayfed (:mod:`rayfed.util.plugin_sources`): a module
that registered its method, a ``plugins`` file, its script. :func:`marker_sources` reads that record, and
:func:`resume_sources` finds the files a resume imports (those the user names, else where the sealed ones resolve
from here) and compares them with it (:func:`rayfed.util.plugin_check.check_sources`, which also accepts a change
by digest). ``rayfed run --resume`` imports only what passed: the config a run directory holds is data until then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rayfed.provenance.run_identity import RunMarker
from rayfed.util.errors import PluginError
from rayfed.util.plugin_check import check_sources, recorded_sources
from rayfed.util.plugin_sources import PluginSource, file_digest, locate

__all__ = [
    "marker_sources",
    "marker_note",
    "resume_sources",
]


def resume_sources(
    run_dir: Path, marker: RunMarker, saved: Mapping[str, Any], entries: Sequence[str] | None
) -> list[PluginSource]:
    """The files a resume of ``run_dir`` imports, found without importing them and checked against its seal
    (:func:`check_sources`): the ``entries`` the user names (``plugins=[...]``), else those the run was sealed with
    (a module name or relative path where it resolves from here, else the sealed file: a resume started from
    another folder finds them), else, for a marker from before markers were sealed, the ``plugins`` of its
    config ``saved``."""
    sealed_with = marker_sources(run_dir, marker)
    if entries is None and marker.sealed:
        current = [_resolved(sealed) for sealed in sealed_with]
        sources = [source for source in current if source is not None]
    else:
        named = entries if entries is not None else saved.get("plugins") or ()
        sources = [locate(entry, f"plugins[{i}]={entry!r}") for i, entry in enumerate(named)]
    check_sources(f"run_dir={str(run_dir)!r}", sealed_with, sources, note=marker_note(marker))
    return sources


def marker_sources(run_dir: Path, marker: RunMarker) -> list[PluginSource]:
    """The files of code outside rayfed that ``marker`` was sealed with."""
    return recorded_sources(marker.plugins, f"run_dir={str(run_dir)!r}")


def marker_note(marker: RunMarker) -> str:
    """What :func:`check_sources` adds about a marker that records no files (written before markers were sealed)."""
    return "" if marker.sealed else ": its marker predates sealed markers, which record them"


def _resolved(sealed: PluginSource) -> PluginSource | None:
    """Where a sealed source's entry resolves from here: as written (a module name on the path or in the
    working directory, a path from the working directory), else its sealed file; None if neither is there."""
    relative = sealed.kind == "file" and not Path(sealed.entry).is_absolute()
    if sealed.kind == "name" or (relative and Path(sealed.entry).expanduser().is_file()):
        try:
            return locate(sealed.entry)
        except PluginError:
            pass
    if not Path(sealed.file).is_file():
        return None
    kind = "file" if sealed.kind == "script" else sealed.kind
    module = locate(sealed.file).module if sealed.kind == "script" else sealed.module
    return PluginSource(sealed.entry, module, sealed.file, file_digest(sealed.file), kind)
