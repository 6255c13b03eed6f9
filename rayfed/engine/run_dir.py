"""A run directory a user can trust: owned by one run, checked before anything is written, continued
from what it holds, and never a place where rayfed overwrites what it did not write.

Four questions are answered here by reading only, so that a refused run leaves every
file as it was (README.md, "Faults and bad input"):

* can ``run_dir`` be created? (:func:`check_creatable`: a parent that is a file, a
  read-only folder, a special filesystem such as ``/proc`` or a name longer than the
  filesystem allows is named with the reason);
* is it rayfed's to write in? (:func:`check_run_dir`: an empty or new folder, or a run directory
  rayfed made, proven by its run marker (:mod:`rayfed.engine.run_identity`) and not in use by
  another run (:mod:`rayfed.engine.run_lock`); anything else is refused, naming what it holds);
* may this run start or continue in it? (:func:`check_run_dir`: a run directory holding a
  checkpoint is never overwritten; one whose run saved no round yet may be started again
  with its own config, with or without ``--resume``; both paths refuse another config with
  the same message);
* where does a resumed run continue? (:func:`read_resume_point`: the newest checkpoint, proven
  to be this run's, whole and finite, then ``rounds.parquet`` and ``clients/round_*.parquet``
  are read and checked in full, and a damaged file is named with its fix, before the engine
  writes anything; ``train.rounds`` may not fall below the rounds the run holds).

:func:`open_run_dir` then takes the directory's lock and writes the run marker, ``config.json``
and the inputs.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayfed.config import RunConfig, read_run_config
from rayfed.engine.checkpoint import (
    Checkpoint,
    checkpoint_identity,
    checkpoints_of,
    newest_checkpoint,
    verified_checkpoint,
)
from rayfed.engine.inputs import RunInputs
from rayfed.engine.run_identity import CONTINUABLE, MARKER_FILE, RunMarker
from rayfed.engine.run_lock import LOCK_FILE, RunLock, check_unlocked
from rayfed.util.errors import CheckpointError, CheckpointFormatError, ConfigError
from rayfed.util.files import write_json

logger = logging.getLogger(__name__)

__all__ = [
    "RUN_FILES",
    "ResumePoint",
    "check_creatable",
    "check_run_dir",
    "make_run_dir",
    "read_resume_point",
    "resume_command",
    "drop_client_tables_from",
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
_ROUNDS, _CLIENTS = "rounds.parquet", "clients"


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

    * not in use by another run (:func:`~rayfed.engine.run_lock.check_unlocked`: ConfigError naming it);
    * new or empty (but for a stale lock): a new run (``False``), or CheckpointError when resuming;
    * not empty and without a run marker (anything rayfed did not make, or made before it wrote markers):
      ConfigError naming what the folder holds and what a run would overwrite;
    * a marker and no ``config.json``: a run never started (nothing else there: a new run) or one whose
      config was deleted (ConfigError naming its files);
    * a checkpoint: a plain rerun is refused (ConfigError: resume it instead);
    * otherwise (no checkpoint, ``--resume`` or not) the saved config must be ``config`` up to
      :data:`~rayfed.engine.run_identity.CONTINUABLE` (ConfigError listing the differences), and the
      run starts again from round 0.
    """
    check_unlocked(run_dir)
    held = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE) if run_dir.is_dir() else []
    if held and MARKER_FILE not in held:
        clash = [name for name in held if name in RUN_FILES]
        raise ConfigError(
            f"run_dir={str(run_dir)!r} is not empty and is not a rayfed run directory (it has no {MARKER_FILE}; "
            f"it holds {_listed(held)}); a run would write {', '.join(RUN_FILES[2:])} there"
            + (f", overwriting {_listed(clash)}" if clash else "")
            + ". rayfed writes only into an empty folder or a run directory it made: choose a new run_dir "
            "(a run directory of a rayfed without run markers continues with that version)"
        )
    saved = run_dir / "config.json"
    if not saved.is_file():
        others = [name for name in held if name != MARKER_FILE]
        if others:
            raise ConfigError(
                f"run_dir={str(run_dir)!r} holds a run whose config.json is missing ({_listed(others)} are there); "
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
    changed = read_run_config(saved).diff(config, ignore=CONTINUABLE)
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
    """Where a run starts: its run marker, and what it continues from (its newest checkpoint and the rounds
    recorded up to it)."""

    marker: RunMarker
    """The run marker to write: a new run's, or the saved one with any change of ``train.rounds`` recorded."""
    checkpoint: Checkpoint | None = None
    """None for a new run, and when the run saved no round yet: it starts again from round 0 (with its
    saved partition)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """The rows of ``rounds.parquet`` up to the checkpoint's round."""

    @property
    def next_round(self) -> int:
        return 0 if self.checkpoint is None else self.checkpoint.round + 1


def read_resume_point(run_dir: Path, config: RunConfig, identity: str, may_hold_nan: Collection[str]) -> ResumePoint:
    """Read and check everything a continued run needs, writing nothing.

    Raises CheckpointError naming the damaged file and its fix: the run marker, whose identity must be
    ``identity`` (the run's config and partition as they are now); the newest checkpoint
    (:func:`~rayfed.engine.checkpoint.verified_checkpoint`: torn, of another format or run, changed,
    not finite; the fix offers the previous checkpoint if it passes the same checks);
    ``rounds.parquet`` (unreadable, or without a row of every round up to the checkpoint's) or a
    ``clients/round_*.parquet`` of those rounds (one that is missing is said in the log: the run goes on
    without it). ConfigError if ``config.train.rounds`` is fewer than
    the rounds the checkpoint holds.
    """
    recorded = RunMarker.read(run_dir)
    checkpoints = checkpoints_of(run_dir)
    if recorded.identity != identity:
        if checkpoints and checkpoint_identity(checkpoints[-1]) == identity:
            raise CheckpointError(
                f"run_dir={str(run_dir)!r}: its {MARKER_FILE} records run identity {recorded.identity[:12]}..., but "
                f"its config.json, partition.parquet and checkpoint {checkpoints[-1].name!r} agree on "
                f"{identity[:12]}...: the marker was changed; restore {MARKER_FILE} from a copy, or choose another "
                "run_dir"
            )
        raise CheckpointError(
            f"run_dir={str(run_dir)!r}: its config.json and partition.parquet are not those its run started with "
            f"(run identity {identity[:12]}..., its {MARKER_FILE} records {recorded.identity[:12]}...); restore "
            "them from a copy, or choose another run_dir"
        )
    if not checkpoints:
        return ResumePoint(_rounds_changed(run_dir, recorded, config, 0))
    restart = (
        f"start the run again from round 0 by deleting {str(run_dir / 'checkpoints')!r} and running "
        f"{resume_command(run_dir)}"
    )
    checkpoint = _verified(checkpoints, identity, may_hold_nan, restart)
    held = checkpoint.round + 1
    if config.train.rounds < held:
        raise ConfigError(
            f"train.rounds={config.train.rounds} is fewer than the {held} rounds the run in {str(run_dir)!r} holds "
            f"(its checkpoint is of round {checkpoint.round}); give train.rounds={held} or more "
            f"(rounds.parquet keeps every round's results)"
        )
    restart = f"restore it from a copy, or {restart}"
    history = _table(run_dir / _ROUNDS, restart)
    rounds = {row.get("round") for row in history}
    missing = sorted(set(range(held)) - rounds)
    if missing:
        raise CheckpointError(
            f"{str(run_dir / _ROUNDS)!r} has no row of round {_listed(missing)}, which the checkpoint "
            f"of round {checkpoint.round} follows; {restart}"
        )
    tables = {_round_of(path): path for path in (run_dir / _CLIENTS).glob("round_*.parquet")}
    lost = [r for r in range(held) if r not in tables]
    if lost:
        logger.warning(
            "%s has no per-client table of round %s: the run continues without %s (rounds.parquet keeps the "
            "rounds' summaries)",
            run_dir / _CLIENTS,
            _listed(lost),
            "it" if len(lost) == 1 else "them",
        )
    for round_index in sorted(set(tables) & set(range(held))):
        _table(
            tables[round_index],
            "delete it to resume without that round's per-client table (rounds.parquet keeps the round's summary)",
        )
    marker = _rounds_changed(run_dir, recorded, config, held)
    return ResumePoint(marker, checkpoint, [row for row in history if row["round"] <= checkpoint.round])


def _rounds_changed(run_dir: Path, marker: RunMarker, config: RunConfig, from_round: int) -> RunMarker:
    """``marker`` with the continuation's ``train.rounds`` recorded (and said) if it changed."""
    changed = marker.with_rounds(config.train.rounds, from_round)
    if changed is not marker:
        logger.info("%s: train.rounds %s (recorded in %s)", run_dir, changed.train_rounds[-1]["change"], MARKER_FILE)
    return changed


def _verified(checkpoints: list[Path], identity: str, may_hold_nan: Collection[str], restart: str) -> Checkpoint:
    """The newest checkpoint, verified; the error of one that fails offers the previous one if it passes."""
    try:
        return verified_checkpoint(checkpoints[-1], identity, may_hold_nan)
    except CheckpointFormatError:
        raise  # its message says how to resume it
    except CheckpointError as error:
        fix = restart
        if len(checkpoints) > 1:
            try:
                previous = verified_checkpoint(checkpoints[-2], identity, may_hold_nan)
                fix = (
                    f"delete it to resume from the previous checkpoint, of round {previous.round}: "
                    f"rm {shlex.quote(str(checkpoints[-1]))}; {resume_command(checkpoints[-1].parent.parent)}"
                )
            except CheckpointError:
                pass  # no sound previous checkpoint to offer
        raise CheckpointError(f"{error}; {fix}") from error


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


def _listed(items: Sequence[object], shown: int = 5) -> str:
    return ", ".join(map(str, items[:shown])) + (f", ... ({len(items)} in all)" if len(items) > shown else "")
