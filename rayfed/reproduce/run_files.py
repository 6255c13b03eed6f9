"""What ``rayfed reproduce`` reads of a cell's run directory, and a damaged one moved aside, never deleted.

A table reads each cell's ``rounds.parquet`` (its rounds so far, their scores and wall times) and
``summary.json`` (the rounds of a finished run). A run directory whose files cannot be read (a file torn by a
kill, a disk error, an edit) is *damaged*: :func:`damage` says why. ``--plan`` and ``--report-only`` treat it as
the run the plain command makes of it, one with no rounds yet, and name it (the command exits 1); the plain
command moves it aside, to ``RUN.damaged-<time>`` beside it (:func:`move_aside`), says where, and runs the cell
again. Nothing under a run directory is ever deleted: the files are the user's record, and a damaged one may
still be restored from a copy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayfed.engine.metrics import read_rounds_file
from rayfed.provenance.plugin_seal import marker_sources
from rayfed.provenance.run_identity import MARKER_FILE, RunMarker
from rayfed.util.bounded import read_json
from rayfed.util.errors import CheckpointError
from rayfed.util.plugin_check import check_named
from rayfed.util.plugin_sources import locate

__all__ = [
    "ROUNDS_FILE",
    "SUMMARY_FILE",
    "check_named_code",
    "damage",
    "read_rounds",
    "rounds_done",
    "move_aside",
    "damaged_note",
]

ROUNDS_FILE, SUMMARY_FILE = "rounds.parquet", "summary.json"
"""How pyarrow's message starts, naming the file again."""


def check_named_code(out: Path, entries: Sequence[str]) -> None:
    """Before ``rayfed reproduce`` imports the ``plugins`` its ``--set`` names (``entries``): refuse a file that a
    cell's run under ``out/runs`` was sealed with and that now holds other bytes, unless its digest is accepted
    (:func:`rayfed.util.plugin_check.check_named`), so that its top level never runs. A marker this machine's key
    cannot open is left to its cell, which treats it as a resume does."""
    if not entries:
        return
    named = [locate(entry, f"--set plugins[{i}]={entry!r}") for i, entry in enumerate(entries)]
    for run_dir in sorted(path for path in (out / "runs").glob("*") if (path / MARKER_FILE).is_file()):
        try:
            marker = RunMarker.read(run_dir)
        except CheckpointError:
            continue
        check_named(f"run_dir={str(run_dir)!r}", marker_sources(run_dir, marker), named)


def damage(directory: Path | None) -> str | None:
    """Why the run in ``directory`` cannot be read (its ``rounds.parquet`` or ``summary.json`` unreadable), or None
    when it can (or holds no run yet)."""
    if directory is None:
        return None
    rounds, summary = directory / ROUNDS_FILE, directory / SUMMARY_FILE
    if rounds.is_file():
        try:
            read_rounds_file(rounds)
        except ValueError as error:
            return f"its {ROUNDS_FILE} cannot be read: {error}"
    if summary.is_file():
        try:
            int(read_json(summary)["rounds_run"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"its {SUMMARY_FILE} cannot be read ({type(error).__name__}: {_first_line(error)})"
    return None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def read_rounds(directory: Path | None, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a run's ``rounds.parquet`` (``columns`` of them); none for a run without one, and none for a
    damaged run, which the plain command runs again (:func:`damage` names it)."""
    path = None if directory is None else directory / ROUNDS_FILE
    if path is None or not path.is_file():
        return []
    try:
        return read_rounds_file(path, columns)
    except ValueError:
        return []


def rounds_done(directory: Path) -> int:
    """Rounds of a finished run (its ``summary.json``), else 0 (a damaged summary included)."""
    summary = directory / SUMMARY_FILE
    if not summary.is_file():
        return 0
    try:
        return int(read_json(summary)["rounds_run"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def move_aside(directory: Path) -> Path:
    """Rename a damaged run directory to ``<name>.damaged-<time>`` beside it (a free name); returns where it went."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = directory.with_name(f"{directory.name}.damaged-{stamp}")
    suffix = 1
    while target.exists():
        suffix += 1
        target = directory.with_name(f"{directory.name}.damaged-{stamp}-{suffix}")
    directory.rename(target)
    return target


def damaged_note(directory: Path, reason: str, command: str) -> str:
    """The line that names a damaged run and what to do, for ``--plan`` and ``--report-only``."""
    return (
        f"run directory {str(directory)!r} is damaged: {reason}; restore it from a copy, or run {command} without "
        f"--plan and --report-only, which moves it aside to {directory.name}.damaged-<time> and runs that cell again"
    )
