"""Waiting in a test for what another process does: poll until it holds, and give up only to end a hang.

The limit is no promise about speed (no test asserts how long code takes; the promises in seconds are timed by
``benchmarks/``): it is far above what the wait takes on a loaded box, so that a test that would wait forever
fails naming what never came, rather than running until the suite's own time runs out.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["wait_for_file", "wait_until"]

T = TypeVar("T")


def wait_until(holds: Callable[[], T], what: str, *, limit_s: float = 120.0, every_s: float = 0.05) -> T:
    """Call ``holds()`` every ``every_s`` seconds until it returns something true, and return that; an
    AssertionError naming ``what`` if it has not after ``limit_s`` seconds. ``holds`` may itself fail the test
    at once (a process it waits on has died)."""
    deadline = time.monotonic() + limit_s
    while not (result := holds()):
        assert time.monotonic() < deadline, f"{what}: not after {limit_s:g} s"
        time.sleep(every_s)
    return result


def wait_for_file(path: Path, process: subprocess.Popen[Any], what: str, *, limit_s: float = 120.0) -> None:
    """Wait until ``process`` has written ``path``; fail at once, with what it printed to stderr, if it ends
    first."""

    def written() -> bool:
        if process.poll() is not None:
            printed = process.stderr.read() if process.stderr else ""
            printed = printed.decode() if isinstance(printed, bytes) else printed
            raise AssertionError(f"{what}: the process ended with status {process.returncode} first\n{printed}")
        return path.exists()

    wait_until(written, what, limit_s=limit_s)
