"""Atomic, pickle-free file writing and reading for run directories.

Every file rayfed writes goes to a temporary file in the same directory first and is
then renamed over the target (``os.replace`` is atomic on POSIX), so a run killed at
any moment leaves either the old file or the new one, never a torn one. Arrays are
stored as ``.npz`` and tables as Parquet; nothing is ever unpickled on load.

Files are created with the user's umask (mode ``0o666 & ~umask``, e.g. 0644), as any
other program's outputs, so a team can share run directories: the temporary file is
opened with :func:`create_temp_file`, not ``tempfile.mkstemp``, whose files are 0600.
"""

from __future__ import annotations

import json
import os
import secrets
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayfed.util.errors import CheckpointError

__all__ = ["atomic_write", "create_temp_file", "write_json", "write_parquet", "save_arrays", "load_arrays"]


def create_temp_file(target: Path) -> tuple[int, str]:
    """Open a new hidden file beside ``target`` for writing; returns (fd, path).

    Like ``tempfile.mkstemp`` (exclusive creation, a random name) but with mode 0o666
    filtered by the umask, so the file renamed onto ``target`` has ordinary permissions.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = str(target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` and rename the temporary file onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp_file(path)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    def write(tmp: str) -> None:
        Path(tmp).write_text(json.dumps(data, indent=2, sort_keys=True, default=float))

    atomic_write(path, write)


def write_parquet(path: str | os.PathLike[str], table: pa.Table) -> None:
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def save_arrays(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> None:
    """Write named arrays to ``path`` (.npz, uncompressed) atomically."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]

    atomic_write(path, write)


def load_arrays(path: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Read an ``.npz`` written by :func:`save_arrays` (``allow_pickle=False``): every
    array, or only those in ``names`` (the others are not read).

    A missing, truncated or corrupted file raises :class:`CheckpointError` naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in (data.files if names is None else names)}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is truncated or corrupted ({type(e).__name__}: {e}); "
            "delete it to resume from the previous checkpoint"
        ) from e
