"""Checkpoints of a run: the server state, the client states and the round, in one pickle-free ``.npz``.

A checkpoint ``<run_dir>/checkpoints/round_XXXXXX.npz`` holds the arrays
``server/<name>``, ``client/<id>/<name>`` and ``meta`` (JSON bytes: the round it was
written after and :data:`CHECKPOINT_FORMAT`). The engine writes one every
``engine.checkpoint_every`` rounds and resumes from the newest; ``rayfed plot`` reads
the newest one's server state. Only the two newest are kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayfed.train.job import ClientState
from rayfed.util.errors import CheckpointError, CheckpointFormatError
from rayfed.util.files import load_arrays, save_arrays

__all__ = [
    "CHECKPOINT_FORMAT",
    "Checkpoint",
    "save_checkpoint",
    "newest_checkpoint",
    "checkpoint_round",
    "load_checkpoint",
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


def save_checkpoint(
    run_dir: str | Path,
    round_index: int,
    server: Mapping[str, np.ndarray],
    clients: Iterable[tuple[int, ClientState]],
) -> Path:
    """Write the checkpoint after ``round_index`` atomically, then drop all but the newest two; returns its path."""
    arrays: dict[str, np.ndarray] = {f"{_SERVER}{k}": v for k, v in server.items()}
    for cid, state in clients:
        for name, value in state.items():
            arrays[f"{_CLIENT}{cid}/{name}"] = value
    meta = {"round": round_index, "format": CHECKPOINT_FORMAT}
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    directory = Path(run_dir) / _DIRECTORY
    path = directory / f"round_{round_index:06d}.npz"
    save_arrays(path, arrays)
    for old in sorted(directory.glob("round_*.npz"))[:-_CHECKPOINTS_KEPT]:
        old.unlink()
    return path


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's newest checkpoint file, or None if it has none."""
    checkpoints = sorted((Path(run_dir) / _DIRECTORY).glob("round_*.npz"))
    return checkpoints[-1] if checkpoints else None


def _read_meta(path: Path, arrays: Mapping[str, np.ndarray]) -> tuple[int, int]:
    try:
        meta = json.loads(arrays[_META].tobytes())
        return int(meta["round"]), int(meta["format"])
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} has no valid metadata") from e


def checkpoint_round(path: str | Path) -> int:
    """The round a checkpoint was written after; refuses one of another state format (reads only ``meta``)."""
    path = Path(path)
    round_index, written_as = _read_meta(path, load_arrays(path, names=(_META,)))
    if written_as != CHECKPOINT_FORMAT:
        raise CheckpointFormatError(
            f"checkpoint {str(path)!r} has state format {written_as}, this rayfed reads format "
            f"{CHECKPOINT_FORMAT} ({_FORMATS.get(CHECKPOINT_FORMAT)}; format {written_as}: "
            f"{_FORMATS.get(written_as, 'unknown')}); resume it with the rayfed version that wrote it, or start a "
            "new run in another run_dir. Nothing in this run directory was changed"
        )
    return round_index


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Every array of a checkpoint, split into server state and client states (its format is not checked)."""
    path = Path(path)
    arrays = load_arrays(path)
    round_index, _ = _read_meta(path, arrays)
    server = {k[len(_SERVER):]: v for k, v in arrays.items() if k.startswith(_SERVER)}
    clients: dict[int, ClientState] = {}
    for key, value in arrays.items():
        if key.startswith(_CLIENT):
            client, name = key[len(_CLIENT):].split("/", 1)
            clients.setdefault(int(client), {})[name] = value
    return Checkpoint(round_index, server, clients)
