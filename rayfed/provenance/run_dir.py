"""A run directory a user can trust: owned by one run, checked before anything is written, continued
from what it holds, and never a place where rayfed overwrites what it did not write.

Four questions are answered by reading only, so that a refused run leaves every
file as it was (README.md, "Faults and bad input"):

* can ``run_dir`` be created? (:func:`check_creatable`: a parent that is a file, a
  read-only folder, a special filesystem such as ``/proc`` or a name longer than the
  filesystem allows is named with the reason);
* is it rayfed's to write in? (:func:`check_run_dir`: an empty or new folder, or a run directory
  rayfed made, proven by its run marker (:mod:`rayfed.provenance.run_identity`) and not in use by
  another run (:mod:`rayfed.provenance.run_lock`); anything else is refused, naming what it holds);
* may this run start or continue in it? (:func:`check_run_dir`: a run directory holding a
  checkpoint is never overwritten; one whose run saved no round yet may be started again
  with its own config, with or without ``--resume``; both paths refuse another config with
  the same message);
* where does a resumed run continue? (:func:`rayfed.provenance.resume_point.read_resume_point`).

:func:`open_run_dir` then takes the directory's lock and writes the run marker, ``config.json``
and the inputs.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from rayfed.config import RunConfig, read_saved_config, saved_differences
from rayfed.engine.checkpoint import (
    newest_checkpoint,
)
from rayfed.engine.inputs import RunInputs
from rayfed.provenance.run_identity import CONTINUABLE, MARKER_FILE, RunMarker
from rayfed.provenance.run_lock import LOCK_FILE, RunLock, check_unlocked
from rayfed.util.errors import CheckpointError, ConfigError
from rayfed.util.files import write_json

logger = logging.getLogger(__name__)

__all__ = [
    "RUN_FILES",
    "check_creatable",
    "check_run_dir",
    "make_run_dir",
    "resume_command",
    "listed",
    "open_run_dir",
]

RUN_FILES = (
    MARKER_FILE,
    LOCK_FILE,
    "config.json",
    "partition.parquet",
    "label_counts.parquet",
    "held_out.parquet",
    "vocabulary.txt",
    "rounds.parquet",
    "summary.json",
    "clients",
    "checkpoints",
    "client_state",
)
"""What a run writes in its directory (the engine's module docstring describes each)."""

_SPECIAL_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs", "bpf", "pstore"}
)
"""Kernel filesystems that hold no user files (Linux ``/proc/self/mounts`` types)."""


def resume_command(run_dir: str | Path) -> str:
    """The exact shell command that continues the run in ``run_dir``."""
    return f"rayfed run --resume {shlex.quote(str(run_dir))}"


# --- can it be created? -------------------------------------------------------------------------
def check_creatable(run_dir: Path) -> None:
    """Raise ConfigError naming ``run_dir`` and the reason if the folder cannot be made (nothing is written)."""
    existing = run_dir
    while existing != existing.parent:
        exists, link = _found(existing)
        if exists:
            break
        if link:  # exists() follows links: this one points nowhere
            what = "it" if existing == run_dir else repr(str(existing))
            _refuse(
                run_dir,
                f"{what} is a symbolic link to {os.readlink(existing)!r}, which does not exist (a dangling link); "
                "remove the link, or make the folder it points to",
            )
        existing = existing.parent
    what = "it" if existing == run_dir else repr(str(existing))
    if not existing.is_dir():
        _refuse(run_dir, f"{what} is a file, not a folder")
    kind = _filesystem_type(existing)
    if kind in _SPECIAL_FILESYSTEMS:
        _refuse(run_dir, f"{what} is on the {kind} filesystem, which holds no user files")
    if not os.access(existing, os.W_OK | os.X_OK):
        _refuse(run_dir, f"{what} is not writable (read-only folder or filesystem)")
    _check_name_lengths(run_dir, existing)


def _found(path: Path) -> tuple[bool, bool]:
    """(``path.exists()``, ``path.is_symlink()``), both False for a name too long to exist (which they raise for)."""
    try:
        return path.exists(), path.is_symlink()
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            return False, False
        raise


def _check_name_lengths(run_dir: Path, existing: Path) -> None:
    """Refuse a folder still to be made whose name, or whole path, the filesystem of ``existing`` cannot hold."""
    limit = _path_limit(existing, "PC_NAME_MAX", 255)
    for part in run_dir.absolute().relative_to(existing.absolute()).parts:
        if len(os.fsencode(part)) > limit:
            shown = part if len(part) <= 40 else f"{part[:20]}...{part[-12:]}"
            _refuse(
                run_dir,
                f"the name {shown!r} is {len(os.fsencode(part))} bytes long and the filesystem holds "
                f"names of at most {limit} bytes",
            )
    longest = len(os.fsencode(str(run_dir.absolute()))) + len("/checkpoints/.round_000000.npz.0123456789ab.tmp")
    limit = _path_limit(existing, "PC_PATH_MAX", 4096)
    if longest > limit:
        _refuse(
            run_dir,
            f"its files' paths would be up to {longest} bytes long and the filesystem holds paths of "
            f"at most {limit} bytes",
        )


def _path_limit(path: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(path, name))
    except (OSError, ValueError):
        return default


def open_run_dir(run_dir: Path, config: RunConfig, inputs: RunInputs, marker: RunMarker) -> RunLock:
    """Create ``run_dir``, take its lock and record the run in it: the run marker (first), ``config.json``
    and the inputs (partition, held-out indices, label counts, vocabulary: :meth:`RunInputs.write`, which
    keeps the files already there). Returns the lock, which the run holds until it ends."""
    make_run_dir(run_dir)
    lock = RunLock.acquire(run_dir)  # a run that started at the same moment is refused here
    try:
        marker.write(run_dir)
        write_json(run_dir / "config.json", config.to_dict())
        inputs.write(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def make_run_dir(run_dir: Path) -> None:
    """Create ``run_dir``; an OS refusal :func:`check_creatable` could not foresee names the path and the reason."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _refuse(run_dir, error.strerror or str(error))


def _refuse(run_dir: Path, reason: str) -> None:
    raise ConfigError(f"run_dir={str(run_dir)!r} cannot be created: {reason}; choose another run_dir")


def _filesystem_type(path: Path) -> str | None:
    """The filesystem type of the mount holding ``path`` (Linux), or None where it cannot be told."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    target, best, kind = os.path.realpath(path), "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


# --- may a run start or continue here? -------------------------------------------------------------
def check_run_dir(run_dir: Path, config: RunConfig, *, resume: bool) -> bool:
    """Whether ``run_dir`` already holds this run (to be continued); refuses what would overwrite results.

    * not in use by another run (:func:`~rayfed.provenance.run_lock.check_unlocked`: ConfigError naming it);
    * new or empty (but for a stale lock): a new run (``False``), or CheckpointError when resuming;
    * not empty and without a run marker (anything rayfed did not make, or made before it wrote markers):
      ConfigError naming what the folder holds and what a run would overwrite;
    * a marker and no ``config.json``: a run never started (nothing else there: a new run) or one whose
      config was deleted (ConfigError naming its files);
    * a checkpoint: a plain rerun is refused (ConfigError: resume it instead);
    * otherwise (no checkpoint, ``--resume`` or not) the saved config must be ``config`` up to
      :data:`~rayfed.provenance.run_identity.CONTINUABLE` (ConfigError listing the differences), and the
      run starts again from round 0.
    """
    check_unlocked(run_dir)
    held = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE) if run_dir.is_dir() else []
    if held and MARKER_FILE not in held:
        clash = [name for name in held if name in RUN_FILES]
        raise ConfigError(
            f"run_dir={str(run_dir)!r} is not empty and is not a rayfed run directory (it has no {MARKER_FILE}; "
            f"it holds {listed(held)}); a run would write {', '.join(RUN_FILES[2:])} there"
            + (f", overwriting {listed(clash)}" if clash else "")
            + ". rayfed writes only into an empty folder or a run directory it made: choose a new run_dir "
            "(a run directory of a rayfed without run markers continues with that version)"
        )
    saved = run_dir / "config.json"
    if not saved.is_file():
        others = [name for name in held if name != MARKER_FILE]
        if others:
            raise ConfigError(
                f"run_dir={str(run_dir)!r} holds a run whose config.json is missing ({listed(others)} are there); "
                "restore config.json from a copy to continue it, or choose another run_dir"
            )
        if resume:
            raise CheckpointError(
                f"cannot resume: {str(run_dir)!r} holds no run (no config.json); "
                "start a new run instead, or point run_dir at an existing run directory"
            )
        return False
    if not resume and newest_checkpoint(run_dir) is not None:
        raise ConfigError(
            f"run_dir={str(run_dir)!r} already holds a run; resume it ({resume_command(run_dir)}) "
            "or choose another run_dir, so its results are not overwritten"
        )
    changed = saved_differences(read_saved_config(saved), config, ignore=CONTINUABLE)  # as data: nothing is imported
    if changed:
        raise ConfigError(
            f"run_dir={str(run_dir)!r} holds a run with another config ({', '.join(changed)}); only train.rounds "
            f"and engine.* may change when it continues ({resume_command(run_dir)}); choose another run_dir "
            "for the new config"
        )
    return True


def listed(items: Sequence[object], shown: int = 5) -> str:
    """``items`` as a short list for a message: the first ``shown``, and how many in all."""
    return ", ".join(map(str, items[:shown])) + (f", ... ({len(items)} in all)" if len(items) > shown else "")
