"""A run directory a user can trust: checked before anything is written, continued from what it holds.

Three questions are answered here by reading only, so that a refused run leaves every
file as it was (README.md, "Faults and bad input"):

* can ``run_dir`` be created? (:func:`check_creatable`: a parent that is a file, a
  read-only folder or a special filesystem such as ``/proc`` is named with the reason);
* may a run start or continue in it? (:func:`check_same_run`: a run directory holding a
  checkpoint is never overwritten; one whose run saved no round yet may be started again
  with its own config, with or without ``--resume``; both paths refuse another config with
  the same message);
* where does a resumed run continue? (:func:`read_resume_point`: the newest checkpoint,
  ``rounds.parquet`` and ``clients/round_*.parquet`` are read and checked in full, and a
  damaged file is named with its fix, before the engine writes anything).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayfed.config import RunConfig
from rayfed.engine.checkpoint import Checkpoint, checkpoint_round, load_checkpoint, newest_checkpoint
from rayfed.engine.inputs import RunInputs
from rayfed.util.errors import CheckpointError, ConfigError
from rayfed.util.files import write_json

__all__ = [
    "CONTINUABLE",
    "ResumePoint",
    "check_creatable",
    "check_same_run",
    "make_run_dir",
    "read_resume_point",
    "resume_command",
    "drop_client_tables_from",
    "open_run_dir",
]

CONTINUABLE = ("train.rounds", "engine.", "run_dir")
"""Config paths that may change when a run continues in its directory: they do not change its results."""

_SPECIAL_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs", "bpf", "pstore"}
)
"""Kernel filesystems that hold no user files (Linux ``/proc/self/mounts`` types)."""
_ROUNDS, _CLIENTS = "rounds.parquet", "clients"


def resume_command(run_dir: str | Path) -> str:
    """The exact shell command that continues the run in ``run_dir``."""
    return f"rayfed run --resume {shlex.quote(str(run_dir))}"


# --- can it be created? -------------------------------------------------------------------------
def check_creatable(run_dir: Path) -> None:
    """Raise ConfigError naming ``run_dir`` and the reason if the folder cannot be made (nothing is written)."""
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    what = "it" if existing == run_dir else repr(str(existing))
    if not existing.is_dir():
        _refuse(run_dir, f"{what} is a file, not a folder")
    kind = _filesystem_type(existing)
    if kind in _SPECIAL_FILESYSTEMS:
        _refuse(run_dir, f"{what} is on the {kind} filesystem, which holds no user files")
    if not os.access(existing, os.W_OK | os.X_OK):
        _refuse(run_dir, f"{what} is not writable (read-only folder or filesystem)")


def open_run_dir(run_dir: Path, config: RunConfig, inputs: RunInputs) -> None:
    """Create ``run_dir`` and record the run in it: ``config.json`` and its inputs (partition, held-out
    indices, label counts, vocabulary: :meth:`RunInputs.write`, which keeps the files already there)."""
    make_run_dir(run_dir)
    write_json(run_dir / "config.json", config.to_dict())
    inputs.write(run_dir)


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
def check_same_run(run_dir: Path, config: RunConfig, *, resume: bool) -> bool:
    """Whether ``run_dir`` already holds this run (to be continued); refuses what would overwrite results.

    * no ``config.json``: a new run (``False``), or CheckpointError when resuming;
    * a checkpoint: a plain rerun is refused (ConfigError: resume it instead);
    * otherwise (no checkpoint, ``--resume`` or not) the saved config must be ``config`` up to
      :data:`CONTINUABLE` (ConfigError listing the differences), and the run starts again from round 0.
    """
    saved = run_dir / "config.json"
    if not saved.is_file():
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
    try:
        before = RunConfig.from_dict(json.loads(saved.read_text()))
    except (ValueError, OSError) as error:  # ConfigError is a ValueError
        raise CheckpointError(
            f"{str(saved)!r} is not a readable run config ({error}); restore it, or choose another run_dir"
        ) from error
    changed = before.diff(config, ignore=CONTINUABLE)
    if changed:
        raise ConfigError(
            f"run_dir={str(run_dir)!r} holds a run with another config ({', '.join(changed)}); only train.rounds "
            f"and engine.* may change when it continues ({resume_command(run_dir)}); choose another run_dir "
            "for the new config"
        )
    return True


# --- where does a resumed run continue? ------------------------------------------------------------
@dataclass(frozen=True)
class ResumePoint:
    """What a run continues from: its newest checkpoint and the rounds recorded up to it."""

    checkpoint: Checkpoint | None
    """None when the run saved no round yet: it starts again from round 0 (with its saved partition)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """The rows of ``rounds.parquet`` up to the checkpoint's round."""

    @property
    def next_round(self) -> int:
        return 0 if self.checkpoint is None else self.checkpoint.round + 1


def read_resume_point(run_dir: Path) -> ResumePoint:
    """Read and check everything a resume needs, writing nothing.

    Raises CheckpointError naming the damaged file and its fix: the newest checkpoint (torn,
    or of another state format), ``rounds.parquet`` (unreadable, or without a row of every round
    up to the checkpoint's) or a ``clients/round_*.parquet`` of those rounds.
    """
    newest = newest_checkpoint(run_dir)
    if newest is None:
        return ResumePoint(None)
    checkpoint_round(newest)  # refuses another state format before the arrays are read
    checkpoint = load_checkpoint(newest)  # every array: a torn file is found now
    restart = (
        f"restore it from a copy, or start the run again from round 0 by deleting {str(run_dir / 'checkpoints')!r} "
        f"and running {resume_command(run_dir)}"
    )
    history = _table(run_dir / _ROUNDS, restart)
    rounds = {row.get("round") for row in history}
    missing = sorted(set(range(checkpoint.round + 1)) - rounds)
    if missing:
        raise CheckpointError(
            f"{str(run_dir / _ROUNDS)!r} has no row of round {_listed(missing)}, which the checkpoint "
            f"{str(newest)!r} follows; {restart}"
        )
    for path in sorted((run_dir / _CLIENTS).glob("round_*.parquet")):
        if _round_of(path) <= checkpoint.round:
            _table(path, "delete it to resume without that round's per-client table (rounds.parquet keeps the "
                   "round's summary)")
    return ResumePoint(checkpoint, [row for row in history if row["round"] <= checkpoint.round])


def drop_client_tables_from(run_dir: Path, next_round: int) -> None:
    """Delete the per-client tables of the rounds a continued run will write again (from ``next_round`` on)."""
    for path in (run_dir / _CLIENTS).glob("round_*.parquet"):
        if _round_of(path) >= next_round:
            path.unlink()


def _table(path: Path, fix: str) -> list[dict[str, Any]]:
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} is missing; {fix}")
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as error:
        raise CheckpointError(f"{str(path)!r} is truncated or corrupted ({error}); {fix}") from error


def _round_of(path: Path) -> int:
    tail = path.stem.removeprefix("round_")
    return int(tail) if tail.isdigit() else -1


def _listed(numbers: list[int], shown: int = 5) -> str:
    return ", ".join(map(str, numbers[:shown])) + (", ..." if len(numbers) > shown else "")
