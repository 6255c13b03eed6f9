"""Where a continued run resumes, read and checked before anything is written: :func:`read_resume_point`.

The newest checkpoint, proven to be this run's, whole and finite
(:func:`~rayfed.engine.checkpoint.verified_checkpoint`; one that fails offers the previous one where that one
is sound), then ``rounds.parquet`` and ``clients/round_*.parquet`` are read and checked in full, and a damaged
file is named with its fix; ``train.rounds`` may not fall below the rounds the run holds.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayfed.config import RunConfig
from rayfed.engine.checkpoint import Checkpoint, checkpoint_identity, checkpoints_of, verified_checkpoint
from rayfed.engine.metrics import read_rounds_file
from rayfed.provenance.run_dir import listed, resume_command
from rayfed.provenance.run_identity import MARKER_FILE, RunMarker
from rayfed.util.bounded import read_parquet
from rayfed.util.errors import CheckpointError, CheckpointFormatError, ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ResumePoint", "read_resume_point", "previous_checkpoint_fix", "drop_client_tables_from"]

_ROUNDS, _CLIENTS = "rounds.parquet", "clients"


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


def read_resume_point(
    run_dir: Path, config: RunConfig, identity: str, may_hold_nan: Collection[str], recorded: RunMarker
) -> ResumePoint:
    """Read and check everything a continued run needs, writing nothing.

    Raises CheckpointError naming the damaged file and its fix: the run marker ``recorded`` (read, its seal
    checked, by the plan), whose identity must be
    ``identity`` (the run's config and partition as they are now); the newest checkpoint
    (:func:`~rayfed.engine.checkpoint.verified_checkpoint`: torn, of another format or run, changed,
    not finite; the fix offers the previous checkpoint if it passes the same checks);
    ``rounds.parquet`` (unreadable, or without a row of every round up to the checkpoint's) or a
    ``clients/round_*.parquet`` of those rounds (one that is missing is said in the log: the run goes on
    without it). ConfigError if ``config.train.rounds`` is fewer than
    the rounds the checkpoint holds.
    """
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
    history = _table(run_dir / _ROUNDS, restart, read_rounds_file)
    rounds = {row.get("round") for row in history}
    missing = sorted(set(range(held)) - rounds)
    if missing:
        raise CheckpointError(
            f"{str(run_dir / _ROUNDS)!r} has no row of round {listed(missing)}, which the checkpoint "
            f"of round {checkpoint.round} follows; {restart}"
        )
    tables = {_round_of(path): path for path in (run_dir / _CLIENTS).glob("round_*.parquet")}
    lost = [r for r in range(held) if r not in tables]
    if lost:
        logger.warning(
            "%s has no per-client table of round %s: the run continues without %s (rounds.parquet keeps the "
            "rounds' summaries)",
            run_dir / _CLIENTS,
            listed(lost),
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
    """The newest checkpoint, verified; the error of one that fails offers the previous one if it passes (one of
    another format or key says its own fix where there is none)."""
    try:
        return verified_checkpoint(checkpoints[-1], identity, may_hold_nan)
    except CheckpointError as error:
        fix = previous_checkpoint_fix(checkpoints, identity, may_hold_nan)
        if fix is None and isinstance(error, CheckpointFormatError):
            raise
        raise type(error)(f"{error}; {fix or restart}") from error


def previous_checkpoint_fix(
    checkpoints: list[Path],
    identity: str,
    may_hold_nan: Collection[str],
    fits: Callable[[Checkpoint], bool] = lambda checkpoint: True,
) -> str | None:
    """How to resume from the checkpoint before the newest, if it is sound (and ``fits``); else None."""
    try:
        previous = verified_checkpoint(checkpoints[-2], identity, may_hold_nan) if len(checkpoints) > 1 else None
    except CheckpointError:
        return None
    if previous is None or not fits(previous):
        return None
    newest = checkpoints[-1]
    return (
        f"delete it to resume from the previous checkpoint, of round {previous.round}: rm {shlex.quote(str(newest))}; "
        f"{resume_command(newest.parent.parent)}"
    )


def _rows(path: Path) -> list[dict[str, Any]]:
    return read_parquet(path).to_pylist()


def drop_client_tables_from(run_dir: Path, next_round: int) -> None:
    """Delete the per-client tables of the rounds a continued run will write again (from ``next_round`` on)."""
    for path in (run_dir / _CLIENTS).glob("round_*.parquet"):
        if _round_of(path) >= next_round:
            path.unlink()


def _table(path: Path, fix: str, read: Callable[[Path], list[dict[str, Any]]] = _rows) -> list[dict[str, Any]]:
    """The rows of the table ``path``, read by ``read`` (bounded: :mod:`rayfed.util.bounded`); CheckpointError
    naming it, what is wrong and ``fix``."""
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} is missing; {fix}")
    try:
        return read(path)
    except ValueError as error:
        raise CheckpointError(f"{str(path)!r} is truncated or corrupted: {error}; {fix}") from None


def _round_of(path: Path) -> int:
    tail = path.stem.removeprefix("round_")
    return int(tail) if tail.isdigit() else -1
