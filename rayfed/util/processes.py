"""Which process is this, and is another one still running: a pid alone cannot tell, as pids are reused.

A process is named by its host, its pid and its start time (clock ticks since boot, Linux
``/proc/<pid>/stat``): a run directory's lock names its owner this way, and so does an
Optuna trial its driver. :func:`is_running` checks such a name on this host; another
host's processes cannot be checked from here (None).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessId", "process_start_time", "is_running", "children"]


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, ...); None if gone or a
    zombie (Linux; None elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return None if fields[0] == "Z" else fields


def process_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``); None if gone, a zombie or unknown."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


@dataclass(frozen=True)
class ProcessId:
    """A process, named so that a reused pid is not mistaken for it."""

    host: str
    pid: int
    start: str
    """:func:`process_start_time`, or ``"-"`` where it cannot be read (not Linux)."""

    @classmethod
    def current(cls) -> ProcessId:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_start_time(pid) or "-")

    def __str__(self) -> str:
        """``host:pid:start``: the form an Optuna trial records its driver in."""
        return f"{self.host}:{self.pid}:{self.start}"

    @classmethod
    def parse(cls, text: object) -> ProcessId | None:
        """The :class:`ProcessId` that ``str`` gave, or None for anything else."""
        if not isinstance(text, str) or text.count(":") < 2:
            return None
        host, pid, start = text.rsplit(":", 2)
        return cls(host, int(pid), start) if pid.isdigit() else None


def is_running(process: ProcessId) -> bool | None:
    """Whether ``process`` still runs: None for another host's (it cannot be checked from here)."""
    if process.host != socket.gethostname():
        return None
    if process.start != "-":
        return process_start_time(process.pid) == process.start
    try:
        os.kill(process.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


def children(pids: set[int] | frozenset[int]) -> dict[int, str]:
    """Every process whose parent is one of ``pids``, with its start time (Linux ``/proc``; empty elsewhere)."""
    found: dict[int, str] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and int(fields[1]) in pids:
            found[int(entry)] = fields[19]
    return found
