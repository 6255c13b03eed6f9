"""Checkpoints of a run: the server state, the client states and the round, in one pickle-free ``.npz``.

A checkpoint ``<run_dir>/checkpoints/round_XXXXXX.npz`` holds the arrays
``server/<name>``, ``client/<id>/<name>`` and ``meta``: JSON bytes with the round it was
written after, :data:`CHECKPOINT_FORMAT`, the identity of the run that wrote it
(:mod:`rayfed.engine.run_identity`) and a SHA-256 checksum of its other arrays and of those three
fields. The engine
writes one every ``engine.checkpoint_every`` rounds and resumes from the newest; ``rayfed
plot`` reads the newest one's server state. Only the two newest are kept.

A resume trusts a checkpoint only when it proves where it came from
(:func:`verified_checkpoint`): its run's identity, the round its file is named after, arrays and
metadata that match their checksum (none changed or cut short) and finite values.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rayfed.train.job import ClientState
from rayfed.util.errors import CheckpointError, CheckpointFormatError
from rayfed.util.files import digest_of, load_arrays, save_arrays

__all__ = [
    "CHECKPOINT_FORMAT",
    "Checkpoint",
    "save_checkpoint",
    "checkpoints_of",
    "newest_checkpoint",
    "checkpoint_round",
    "checkpoint_identity",
    "load_checkpoint",
    "verified_checkpoint",
]

CHECKPOINT_FORMAT = 2
"""The layout of the state vectors inside checkpoints; a run resumes only from its own format."""
_FORMATS = {
    1: "convolution kernels stored (O, I, H, W)",
    2: "convolution kernels stored channels-last, (O, H, W, I), as rayfed.train.flat lays them out",
}
_CHECKPOINTS_KEPT = 2
_DIRECTORY = "checkpoints"
_SERVER, _CLIENT, _META = "server/", "client/", "meta"


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds, split back into its parts."""

    round: int
    """The round (0-based) after which it was written."""
    server: dict[str, np.ndarray]
    clients: dict[int, ClientState]
    path: Path
    """The file it was read from."""


def save_checkpoint(
    run_dir: str | Path,
    round_index: int,
    server: Mapping[str, np.ndarray],
    clients: Iterable[tuple[int, ClientState]],
    identity: str,
) -> Path:
    """Write the checkpoint after ``round_index`` of the run ``identity`` atomically, then drop all but the
    newest two; returns its path."""
    arrays: dict[str, np.ndarray] = {f"{_SERVER}{k}": np.asarray(v) for k, v in server.items()}
    for cid, state in clients:
        for name, value in state.items():
            arrays[f"{_CLIENT}{cid}/{name}"] = np.asarray(value)
    meta: dict[str, Any] = {"round": round_index, "format": CHECKPOINT_FORMAT, "identity": identity, "sealed": True}
    meta["checksum"] = _checksum(arrays, meta)
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    directory = Path(run_dir) / _DIRECTORY
    path = directory / f"round_{round_index:06d}.npz"
    save_arrays(path, arrays)
    for old in checkpoints_of(run_dir)[:-_CHECKPOINTS_KEPT]:
        old.unlink()
    return path


def checkpoints_of(run_dir: str | Path) -> list[Path]:
    """The run's checkpoint files, oldest first."""
    return sorted((Path(run_dir) / _DIRECTORY).glob("round_*.npz"))


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's newest checkpoint file, or None if it has none."""
    checkpoints = checkpoints_of(run_dir)
    return checkpoints[-1] if checkpoints else None


def _checksum(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> str:
    """SHA-256 over every array but ``meta``, by name, and, for a ``sealed`` checkpoint, over its round,
    format and identity (checkpoints written before they were sealed cover their arrays only)."""
    parts = [part for name in sorted(arrays) if name != _META for part in (name.encode(), arrays[name])]
    if meta.get("sealed"):
        fields = {key: meta.get(key) for key in ("round", "format", "identity", "sealed")}
        parts.append(json.dumps(fields, sort_keys=True).encode())
    return digest_of(parts)


def _read_meta(path: Path, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    try:
        meta = json.loads(arrays[_META].tobytes())
        int(meta["round"]), int(meta["format"])
        return dict(meta)
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} has no valid metadata") from e


def checkpoint_round(path: str | Path) -> int:
    """The round a checkpoint was written after; refuses one of another state format (reads only ``meta``)."""
    path = Path(path)
    return int(_checked_meta(path, load_arrays(path, names=(_META,)))["round"])


def checkpoint_identity(path: str | Path) -> str | None:
    """The identity of the run that wrote a checkpoint (reads only ``meta``), or None where it records none or
    cannot be read."""
    try:
        identity = _read_meta(Path(path), load_arrays(Path(path), names=(_META,), fix="")).get("identity")
    except CheckpointError:
        return None
    return None if identity is None else str(identity)


def _checked_meta(path: Path, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The checkpoint's metadata, refusing another state format."""
    meta = _read_meta(path, arrays)
    written_as = int(meta["format"])
    if written_as != CHECKPOINT_FORMAT:
        raise CheckpointFormatError(
            f"checkpoint {str(path)!r} has state format {written_as}, this rayfed reads format "
            f"{CHECKPOINT_FORMAT} ({_FORMATS.get(CHECKPOINT_FORMAT)}; format {written_as}: "
            f"{_FORMATS.get(written_as, 'unknown')}); resume it with the rayfed version that wrote it, or start a "
            "new run in another run_dir. Nothing in this run directory was changed"
        )
    return meta


def verified_checkpoint(path: Path, identity: str, may_hold_nan: Collection[str] = ()) -> Checkpoint:
    """Every array of the checkpoint a run resumes from, once it proved where it came from.

    Raises CheckpointError naming ``path`` and what is wrong, for the caller to add the fix (the
    :class:`CheckpointFormatError` of another state format says its own): a checkpoint that cannot be read
    (torn, truncated), of another state format, of another run (its identity is not ``identity``), with
    arrays that do not match its checksum (changed, cut short, resized), or with a NaN or infinite value
    in a floating-point array, except the server arrays named in ``may_hold_nan``
    (:attr:`~rayfed.algorithms.sizing.StateSizes.may_hold_nan`).
    """
    meta = _checked_meta(path, load_arrays(path, names=(_META,), fix=""))
    written_by = meta.get("identity")
    if written_by != identity:
        origin = (
            "records no run identity"
            if written_by is None
            else (f"was written by another run (identity {str(written_by)[:12]}..., this run's is {identity[:12]}...)")
        )
        raise CheckpointError(f"checkpoint {str(path)!r} {origin}")
    named = path.stem.removeprefix("round_")
    if not named.isdigit() or int(named) != int(meta["round"]):
        raise CheckpointError(
            f"checkpoint {str(path)!r} says it was written after round {meta['round']}, not the round its name says"
        )
    arrays = load_arrays(path, fix="")
    if meta.get("checksum") != _checksum(arrays, meta):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is damaged: its arrays or its metadata do not match the checksum written with "
            "them (an array or its round was changed, resized or cut short)"
        )
    allowed = {f"{_SERVER}{name}" for name in may_hold_nan}
    for name, array in arrays.items():
        if name in allowed or not np.issubdtype(array.dtype, np.floating):
            continue
        bad = array.size - int(np.count_nonzero(np.isfinite(array)))
        if bad:
            raise CheckpointError(
                f"checkpoint {str(path)!r} holds {bad} NaN or infinite value{'s' * (bad > 1)} in {name!r} "
                f"(of {array.size}), which training cannot recover from"
            )
    return _split(path, arrays)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Every array of a checkpoint, split into server state and client states (neither its format nor its
    origin is checked: :func:`verified_checkpoint` does that for a resume)."""
    path = Path(path)
    return _split(path, load_arrays(path))


def _split(path: Path, arrays: Mapping[str, np.ndarray]) -> Checkpoint:
    round_index = int(_read_meta(path, arrays)["round"])
    server = {k[len(_SERVER) :]: v for k, v in arrays.items() if k.startswith(_SERVER)}
    clients: dict[int, ClientState] = {}
    for key, value in arrays.items():
        if key.startswith(_CLIENT):
            client, name = key[len(_CLIENT) :].split("/", 1)
            clients.setdefault(int(client), {})[name] = value
    return Checkpoint(round_index, server, clients, path)
