"""One owner per run directory: an exclusive lock held for the whole life of a run.

A run takes ``<run_dir>/rayfed.lock`` before it writes anything else there and keeps it
until it ends. The file names its owner (host, pid, the process's start time and the
wall-clock time the run started); the lock itself is an advisory ``flock`` on that file,
which the operating system drops when the owner dies, however it dies.

* A second run or resume of the same directory is refused, naming the owner
  (:func:`check_unlocked` before anything is written, :meth:`RunLock.acquire` once more
  when the directory is opened, in case two runs started at the same moment).
* A lock file left by a run that no longer runs (killed, out of memory) is stale: it is
  taken over with a warning that names the dead owner. One left by a process on another
  host cannot be checked from here, so it is refused with the file to delete if that run
  has ended.
* A run that ends in any way (finished, interrupted, failed) removes its lock file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import weakref
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rayfed.util.bounded import read_json
from rayfed.util.errors import ConfigError
from rayfed.util.processes import ProcessId, is_running

logger = logging.getLogger(__name__)

__all__ = ["LOCK_FILE", "LockOwner", "RunLock", "check_unlocked"]

LOCK_FILE = "rayfed.lock"


@dataclass(frozen=True)
class LockOwner:
    """Who holds (or held) a run directory's lock."""

    process: ProcessId
    started: str
    """When the run started, local ISO time."""

    def describe(self) -> str:
        return f"pid {self.process.pid} on host {self.process.host}, started {self.started}"

    def to_json(self) -> str:
        return json.dumps({"process": str(self.process), "started": self.started})

    @classmethod
    def read(cls, path: Path) -> LockOwner | None:
        """The owner a lock file names; None if it names none (being written, or not a lock file)."""
        try:
            data = read_json(path)
            process = ProcessId.parse(data["process"])
            return None if process is None else cls(process, str(data["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def check_unlocked(run_dir: Path) -> None:
    """Refuse ``run_dir`` if a running process, or one on another host, holds its lock (reads only)."""
    path = run_dir / LOCK_FILE
    if not path.is_file():
        return
    owner = LockOwner.read(path)
    if owner is None and not _held(path):
        return  # a lock file its run died before naming itself in: taken over when the run opens the directory
    if owner is not None and is_running(owner.process) is False:
        return  # stale: taken over, with a warning, when the run opens the directory
    _refuse(run_dir, owner)


def _held(path: Path) -> bool:
    """Whether a process holds the lock on ``path`` (a shared lock is refused while it does)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the shared lock


def _refuse(run_dir: Path, owner: LockOwner | None) -> None:
    path = run_dir / LOCK_FILE
    if owner is None:
        who = "another run (its lock file names no owner yet)"
    else:
        who = f"another run ({owner.describe()})"
    if owner is not None and is_running(owner.process) is None:
        fix = (
            f"this host cannot tell whether that run still runs: if it has ended, delete {str(path)!r} and "
            "start again; otherwise choose another run_dir"
        )
    else:
        fix = "wait for it to end, or choose another run_dir"
    raise ConfigError(f"run_dir={str(run_dir)!r} is in use by {who}, which holds {str(path)!r}; {fix}")


class RunLock:
    """The held lock of one run directory; :meth:`release` (or the lock's garbage collection) lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._release = weakref.finalize(self, _release, path, fd)

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take ``run_dir``'s lock, which must exist as a folder; refuse (ConfigError) one that is held."""
        path = run_dir / LOCK_FILE
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                _refuse(run_dir, LockOwner.read(path))
            if _same_file(fd, path):
                break
            os.close(fd)  # its owner removed it as we opened it: take the new one
        previous = LockOwner.read(path)
        if previous is not None and is_running(previous.process) is None:
            os.close(fd)  # another host's process: this host cannot tell that it ended
            _refuse(run_dir, previous)
        if previous is not None:
            logger.warning(
                "run_dir=%r: taking over the lock left by a run that no longer runs (%s)",
                str(run_dir),
                previous.describe(),
            )
        owner = LockOwner(ProcessId.current(), datetime.now().isoformat(timespec="seconds"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.to_json().encode(), 0)
        os.fsync(fd)
        return cls(path, fd)

    def release(self) -> None:
        """Remove the lock file and let the lock go (once; later calls do nothing)."""
        self._release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _release(path: Path, fd: int) -> None:
    """Unlink the lock file while still holding the lock, so no other run ever holds a file that is not on disk."""
    try:
        if _same_file(fd, path):
            path.unlink()
    finally:
        os.close(fd)
