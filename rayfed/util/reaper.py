"""A watchdog that ends the processes a driver started once the driver is gone, however it went.

A driver that starts a private Ray starts its processes (the GCS, the raylet, the dashboard)
and they start theirs (agents, workers). Killed with SIGKILL, or out of memory, the driver
cannot shut them down, and Ray's agents outlive their raylet by a minute or more. So the
driver starts this module as a separate process (:class:`Reaper`) and tells it, over a pipe
it keeps open, the processes to watch. The reaper follows them and their descendants (each
by pid and start time, so a reused pid is never taken for one of them) and, when the pipe
closes (the driver ended them itself, or died), looks for their descendants once more, sends
what is left SIGTERM, then SIGKILL after :data:`GRACE_S`, and exits. Looking for descendants
reads every process's ``/proc/<pid>/stat`` (milliseconds on a busy machine), so it does so
every :data:`POLL_S` while new processes appear and ever less often, down to every
:data:`QUIET_POLL_S`, while none do (a running Ray's processes rarely change); it notices the
pipe closing at once whatever the interval.

    python -m rayfed.util.reaper      # reads pids, one per line, from stdin until it closes
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

from rayfed.util.processes import children, process_start_time

__all__ = ["Reaper", "GRACE_S", "POLL_S", "QUIET_POLL_S"]

GRACE_S = 3.0
"""Seconds between SIGTERM and SIGKILL for the processes left when the driver is gone."""
POLL_S = 0.5
"""How often the watched processes' descendants are looked for while new ones appear."""
QUIET_POLL_S = 8.0
"""How often at the least: the interval doubles from :data:`POLL_S` up to this while no new process appears."""


class Reaper:
    """The driver's side: a reaper process watching the pids it is given until :meth:`stop` (or the driver's death)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches the driver, not it
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def watch(self, pids: Iterable[int]) -> None:
        """Add ``pids`` (and, from now on, their descendants) to what the reaper ends when the driver is gone."""
        assert self._process.stdin is not None
        self._process.stdin.write("".join(f"{pid}\n" for pid in pids).encode())
        self._process.stdin.flush()

    def stop(self) -> None:
        """Close the pipe: the reaper ends whatever the driver's own shutdown left, then exits."""
        assert self._process.stdin is not None
        self._process.stdin.close()


def _reap(watched: dict[int, str]) -> None:
    """SIGTERM, then SIGKILL after :data:`GRACE_S`, every process of ``watched`` that still runs."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = {pid: start for pid, start in watched.items() if process_start_time(pid) == start}
        for pid in alive:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + GRACE_S
        while alive and sig == signal.SIGTERM and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = {pid: start for pid, start in alive.items() if process_start_time(pid) == start}
        if not alive:
            return


def main() -> None:
    """Read pids from stdin; follow them and their descendants; reap them all when stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watched: dict[int, str] = {}
    stdin, pending, interval = sys.stdin.fileno(), b"", POLL_S
    while True:
        ready, _, _ = select.select([stdin], [], [], interval)
        chunk = os.read(stdin, 4096) if ready else None
        if chunk is not None:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                start = process_start_time(int(line)) if line.strip().isdigit() else None
                if start is not None:
                    watched[int(line)] = start
        # forget the processes that ended (their pids may be reused), then add the children of the others
        watched = {pid: start for pid, start in watched.items() if process_start_time(pid) == start}
        new = {pid: start for pid, start in children(frozenset(watched)).items() if pid not in watched}
        watched.update(new)
        interval = POLL_S if new or chunk else min(QUIET_POLL_S, 2 * interval)
        if chunk == b"":  # the driver closed the pipe, or is gone
            _reap(watched)
            return


if __name__ == "__main__":
    main()
