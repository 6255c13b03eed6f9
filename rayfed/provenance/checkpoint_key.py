"""The key that seals a run's checkpoints, kept outside every run directory: :func:`checkpoint_key`.

A checkpoint carries an HMAC-SHA256 of its arrays and its metadata under this key
(:mod:`rayfed.engine.checkpoint`), so that only someone who can read the key can write a checkpoint a resume
accepts. The key is 32 random bytes, hex in one file, made on first use with permissions 0600 in a folder
with 0700: ``$RAYFED_CHECKPOINT_KEY_FILE`` if set, else ``$XDG_CONFIG_HOME/rayfed/checkpoint.key`` (by default
``~/.config/rayfed/checkpoint.key``). A run moved to another machine resumes there with the same key: copy the
file to the same place, or point ``RAYFED_CHECKPOINT_KEY_FILE`` at a copy (on a Ray cluster, at one file every
node that runs drivers reads, outside the run directories).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from functools import cache
from pathlib import Path

from rayfed.util.errors import CheckpointError

__all__ = ["KEY_FILE_VARIABLE", "key_path", "checkpoint_key", "key_id"]

logger = logging.getLogger(__name__)

KEY_FILE_VARIABLE = "RAYFED_CHECKPOINT_KEY_FILE"
_KEY_BYTES = 32


def key_path() -> Path:
    """Where this machine's checkpoint key lies (module docstring)."""
    if os.environ.get(KEY_FILE_VARIABLE):
        return Path(os.environ[KEY_FILE_VARIABLE]).expanduser()
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config_home / "rayfed" / "checkpoint.key"


def key_id(key: bytes) -> str:
    """A short name of ``key`` that a checkpoint records, so that a refusal can tell another key from damage;
    it says nothing of the key (a hash of it, under a label of its own)."""
    return hashlib.sha256(b"rayfed checkpoint key id\0" + key).hexdigest()[:16]


def checkpoint_key(*, create: bool) -> bytes | None:
    """The key at :func:`key_path`; with ``create``, made there first if there is none (None without it).
    CheckpointError naming the file and the fix when it cannot be read or made."""
    return _read_key(key_path(), create)


@cache
def _cached(path: Path, stat: tuple[int, int]) -> bytes:
    text = path.read_text(encoding="ascii").strip()
    key = bytes.fromhex(text)
    if len(key) != _KEY_BYTES:
        raise ValueError(f"{len(key)} bytes, not {_KEY_BYTES}")
    if stat[0] & 0o077:
        logger.warning(
            "%s, the key that seals this machine's checkpoints, can be read by other users, who could forge "
            "checkpoints a resume accepts; make it yours alone: chmod 600 %s",
            path,
            path,
        )
    return key


def _read_key(path: Path, create: bool) -> bytes | None:
    try:
        if not path.exists():
            if not create:
                return None
            _make(path)
        stat = path.stat()
        return _cached(path, (stat.st_mode, stat.st_mtime_ns))
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"the checkpoint key {str(path)!r} cannot be {'made' if create and not path.exists() else 'read'} "
            f"({error}); restore it from a copy, or point {KEY_FILE_VARIABLE} at a key file (a new key cannot "
            "resume checkpoints sealed with the old one)"
        ) from None


def _make(path: Path) -> None:
    """Write a new key to ``path`` atomically, readable by its owner alone; a key another process made first
    is kept."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as file:
            file.write(secrets.token_hex(_KEY_BYTES) + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(staged, path)  # fails if another process made the key first: theirs is kept
        except FileExistsError:
            pass
    finally:
        staged.unlink(missing_ok=True)
