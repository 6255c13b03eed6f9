"""Atomic, pickle-free file writing and reading for run directories.

Every file rayfed writes goes to a temporary file in the same directory first and is
then renamed over the target (``os.replace`` is atomic on POSIX), so a run killed at
any moment leaves either the old file or the new one, never a torn one. Arrays are
stored as ``.npz`` and tables as Parquet; nothing is ever unpickled on load.

A full disk is one line (:class:`~rayfed.util.errors.DiskFullError`: the file, the bytes it needs and
the bytes free), and the file it would have replaced is kept.

Files are created with the user's umask (mode ``0o666 & ~umask``, e.g. 0644), as any
other program's outputs, so a team can share run directories: the temporary file is
opened with :func:`create_temp_file`, not ``tempfile.mkstemp``, whose files are 0600.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import shutil
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayfed.util.bounded import npz_members
from rayfed.util.errors import CheckpointError, DiskFullError

__all__ = [
    "atomic_write",
    "create_temp_file",
    "write_json",
    "write_parquet",
    "save_arrays",
    "load_arrays",
    "digest_of",
    "format_bytes",
]


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


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object], size: int | None = None) -> None:
    """Call ``write(tmp_path)`` and rename the temporary file onto ``path``.

    A full disk (or quota) raises :class:`DiskFullError` naming ``path``, about ``size`` bytes the file
    needs (when the caller knows) and the bytes free; the old file, if any, is kept.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = create_temp_file(path)
        os.close(fd)
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            raise _disk_full(path, size) from error
        raise


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(path: Path, size: int | None) -> DiskFullError:
    try:
        free = f"{format_bytes(shutil.disk_usage(path.parent).free)} free"
    except OSError:
        free = "no free space"
    needs = f"it needs about {format_bytes(size)}, " if size is not None else ""
    return DiskFullError(f"cannot write {str(path)!r}: the disk holding it is full ({needs}{free})")


def format_bytes(count: float) -> str:
    """Bytes in the largest binary unit below the value, e.g. ``format_bytes(3 * 2**30) == "3.0 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024:
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} TiB"


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    text = json.dumps(data, indent=2, sort_keys=True, default=float)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text), len(text))


def write_parquet(path: str | os.PathLike[str], table: pa.Table) -> None:
    atomic_write(path, lambda tmp: pq.write_table(table, tmp), table.nbytes)


def save_arrays(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> None:
    """Write named arrays to ``path`` (.npz, uncompressed) atomically."""

    arrays = {k: np.asarray(v) for k, v in arrays.items()}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]

    atomic_write(path, write, sum(int(v.nbytes) for v in arrays.values()))


def digest_of(parts: Iterable[np.ndarray | bytes], key: bytes | None = None) -> str:
    """SHA-256 over ``parts`` in order, each array with its dtype and shape: equal arrays, equal digests
    (what defines a partition); with ``key``, their HMAC-SHA256 under it (what seals a checkpoint)."""
    digest = hmac.new(key, digestmod=hashlib.sha256) if key is not None else hashlib.sha256()
    for part in parts:
        if isinstance(part, np.ndarray):
            digest.update(f"{part.dtype.str}{part.shape}".encode())
            digest.update(np.ascontiguousarray(part).data)
        else:
            digest.update(part)
    return digest.hexdigest()


def load_arrays(
    path: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    *,
    fix: str = "delete it to resume from the previous checkpoint",
) -> dict[str, np.ndarray]:
    """Read an ``.npz`` written by :func:`save_arrays` (``allow_pickle=False``): every
    array, or only those in ``names`` (the others are not read).

    A missing, truncated or corrupted file, or one whose arrays claim more than it holds
    (:func:`rayfed.util.bounded.npz_members`, checked before any array is read), raises :class:`CheckpointError`
    naming it and ``fix`` (if any).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} does not exist")
    try:
        names = None if names is None else list(names)
        npz_members(path, names)
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in (data.files if names is None else names)}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is truncated or corrupted ({type(e).__name__}: {e})"
            + (f"; {fix}" if fix else "")
        ) from e
