"""Checkpoints of a run: the server state, the client states and the round, in one pickle-free ``.npz``.

A checkpoint ``<run_dir>/checkpoints/round_XXXXXX.npz`` holds the arrays
``server/<name>``, ``client/<id>/<name>``, with a system model ``system/<name>`` (the rounds' virtual time, or
an asynchronous schedule's state: :meth:`rayfed.scheduling.sync_rounds.Rounds.state`), and ``meta``: JSON bytes with the
round it was written after, :data:`CHECKPOINT_FORMAT`, the identity of the run that wrote it
(:mod:`rayfed.provenance.run_identity`), the id of the key that sealed it and its seal: an HMAC-SHA256,
under this machine's checkpoint key (:mod:`rayfed.provenance.checkpoint_key`), of its other arrays and of
those four fields. The engine writes one every ``engine.checkpoint_every`` rounds and resumes from the
newest; ``rayfed plot`` reads the newest one's server state. Only the two newest are kept.

A resume trusts a checkpoint only when it proves where it came from
(:func:`verified_checkpoint`): its run's identity, the round its file is named after, arrays and
metadata that match their seal (none changed or cut short; checked streamed from the file, each array's header
bounded first, before any array is loaded) and finite values. The seal is keyed, so
that a checkpoint edited and sealed again without the key, such as another run's whose identity was
changed, or one whose round was, is refused: it protects against anyone who can write a run directory
(a shared or synced folder, a copy received) but cannot read the key file outside it. It does not
protect against anyone who can read the key (the user, root), hides nothing (checkpoints are not
encrypted), and vouches for the checkpoints alone, not for the run's other files, which a resume checks
for damage (:func:`rayfed.provenance.resume_point.read_resume_point`). A checkpoint sealed with another
machine's key is refused naming both keys' ids and the fix (that machine's key file); one written
before checkpoints were keyed carries a plain SHA-256 that anyone can recompute, and is refused unless
the user vouches for it (:data:`TRUST_UNKEYED_VARIABLE`).
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import os
import zipfile
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rayfed.provenance.checkpoint_key import KEY_FILE_VARIABLE, checkpoint_key, key_id, key_path
from rayfed.train.job import ClientState
from rayfed.util.bounded import npz_members, npz_parts, parse_json
from rayfed.util.errors import CheckpointError, CheckpointFormatError, CheckpointKeyError
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
    "TRUST_UNKEYED_VARIABLE",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 2
"""The layout of the state vectors inside checkpoints; a run resumes only from its own format."""
_FORMATS = {
    1: "convolution kernels stored (O, I, H, W)",
    2: "convolution kernels stored channels-last, (O, H, W, I), as rayfed.train.flat lays them out",
}
TRUST_UNKEYED_VARIABLE = "RAYFED_TRUST_UNKEYED_CHECKPOINTS"
"""Set to 1 to resume from checkpoints written before they were keyed, whose plain SHA-256 is still checked."""
_SEALED = ("round", "format", "identity", "key_id")
"""The metadata a checkpoint's seal covers beside its arrays."""
_CHECKPOINTS_KEPT = 2
_DIRECTORY = "checkpoints"
_SERVER, _CLIENT, _SYSTEM, _META = "server/", "client/", "system/", "meta"


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds, split back into its parts."""

    round: int
    """The round (0-based) after which it was written."""
    server: dict[str, np.ndarray]
    clients: dict[int, ClientState]
    path: Path
    """The file it was read from."""
    system: dict[str, np.ndarray] = field(default_factory=dict)
    """What the run's system model saved of its rounds (none without one)."""


def save_checkpoint(
    run_dir: str | Path,
    round_index: int,
    server: Mapping[str, np.ndarray],
    clients: Iterable[tuple[int, ClientState]],
    identity: str,
    system: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write the checkpoint after ``round_index`` of the run ``identity`` atomically, then drop all but the
    newest two; returns its path."""
    arrays: dict[str, np.ndarray] = {f"{_SERVER}{k}": np.asarray(v) for k, v in server.items()}
    arrays.update({f"{_SYSTEM}{k}": np.asarray(v) for k, v in (system or {}).items()})
    for cid, state in clients:
        for name, value in state.items():
            arrays[f"{_CLIENT}{cid}/{name}"] = np.asarray(value)
    key = checkpoint_key(create=True)
    assert key is not None  # made if missing
    meta: dict[str, Any] = {
        "round": round_index,
        "format": CHECKPOINT_FORMAT,
        "identity": identity,
        "key_id": key_id(key),
    }
    meta["mac"] = _seal(_array_parts(arrays), meta, key)
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


def _seal(parts: Iterable[np.ndarray | bytes], meta: Mapping[str, Any], key: bytes | None) -> str:
    """HMAC-SHA256 under ``key`` over the ``parts`` of every array but ``meta`` (:func:`_array_parts`) and over
    the :data:`_SEALED` fields; with ``key`` None, the plain SHA-256 of a checkpoint written before they were
    keyed (its ``sealed`` fields)."""
    fields = _SEALED if key is not None else ("round", "format", "identity", "sealed") if meta.get("sealed") else ()
    covered = [json.dumps({field: meta.get(field) for field in fields}, sort_keys=True).encode()] if fields else []
    return digest_of(itertools.chain(parts, covered), key)


def _array_parts(arrays: Mapping[str, np.ndarray]) -> list[np.ndarray | bytes]:
    """What a seal covers of ``arrays``: each but ``meta``, by name, its name then its values."""
    return [part for name in sorted(arrays) if name != _META for part in (name.encode(), arrays[name])]


def _read_meta(path: Path, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    try:
        meta = parse_json(arrays[_META].tobytes())
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
    _check_seal(path, meta)  # streamed from the file: no array is loaded before the seal holds
    arrays = load_arrays(path, fix="")
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


def _file_parts(path: Path) -> Iterator[bytes]:
    """:func:`_array_parts` of the checkpoint at ``path``, streamed from its file (each array's claims bounded
    first: :func:`rayfed.util.bounded.npz_members`), without loading its arrays."""
    members = {name: member for name, member in npz_members(path).items() if name != _META}
    return npz_parts(path, members)


def _check_seal(path: Path, meta: Mapping[str, Any]) -> None:
    """CheckpointError unless the arrays of ``path`` and ``meta`` match the seal written with them, under this
    machine's key (CheckpointKeyError: sealed with another key, or by a rayfed that did not key its checkpoints),
    checked before any array is loaded."""
    try:
        _check_file_seal(path, meta)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"checkpoint {str(path)!r} is truncated or corrupted: {error}") from error


def _check_file_seal(path: Path, meta: Mapping[str, Any]) -> None:
    """:func:`_check_seal`, the file's damage left to it to name."""
    if "mac" not in meta:
        trusted = os.environ.get(TRUST_UNKEYED_VARIABLE) == "1"
        if not trusted:
            raise CheckpointKeyError(
                f"checkpoint {str(path)!r} carries a plain SHA-256 checksum (rayfed before checkpoints were keyed), "
                f"which anyone can recompute, so it cannot prove this run wrote it; if you trust this run directory, "
                f"resume once with {TRUST_UNKEYED_VARIABLE}=1 (its checksum is still checked, and later checkpoints "
                "are keyed). Nothing in this run directory was changed"
            )
        if meta.get("checksum") == _seal(_file_parts(path), meta, None):
            logger.warning("%s: unkeyed checkpoint accepted (%s=1)", path, TRUST_UNKEYED_VARIABLE)
            return
    else:
        key = checkpoint_key(create=False)
        if key is None or key_id(key) != meta.get("key_id"):
            here = (
                f"this machine's key {str(key_path())!r} is {key_id(key)}" if key else f"{str(key_path())!r} holds none"
            )
            raise CheckpointKeyError(
                f"checkpoint {str(path)!r} was sealed with the checkpoint key {meta.get('key_id')}, but {here}: "
                f"copy the key file of the machine that wrote it to {str(key_path())!r}, or point "
                f"{KEY_FILE_VARIABLE} at it. Nothing in this run directory was changed"
            )
        if hmac.compare_digest(str(meta.get("mac")), _seal(_file_parts(path), meta, key)):
            return
    raise CheckpointError(
        f"checkpoint {str(path)!r} is damaged or was changed: its arrays or its metadata do not match the seal "
        "written with them (an array or its round was changed, resized or cut short)"
    )


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Every array of a checkpoint, split into server state and client states (neither its format nor its
    origin is checked: :func:`verified_checkpoint` does that for a resume)."""
    path = Path(path)
    return _split(path, load_arrays(path))


def _split(path: Path, arrays: Mapping[str, np.ndarray]) -> Checkpoint:
    round_index = int(_read_meta(path, arrays)["round"])
    server = {k[len(_SERVER) :]: v for k, v in arrays.items() if k.startswith(_SERVER)}
    system = {k[len(_SYSTEM) :]: v for k, v in arrays.items() if k.startswith(_SYSTEM)}
    clients: dict[int, ClientState] = {}
    for key, value in arrays.items():
        if key.startswith(_CLIENT):
            client, name = key[len(_CLIENT) :].split("/", 1)
            clients.setdefault(int(client), {})[name] = value
    return Checkpoint(round_index, server, clients, path, system)
