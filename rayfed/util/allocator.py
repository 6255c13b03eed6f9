"""glibc's allocator, set per process role (Linux only; elsewhere these do nothing and return False).

A ClientWorker allocates and frees the same MB-sized buffers thousands of times a round, so it keeps
freed buffers for reuse (:func:`keep_freed_memory`). The driver does the opposite: its large
allocations happen while it loads the data and builds the run, after which it holds little, so before
a round it gives the freed pages back (:func:`return_freed_memory`) whenever its resident memory has grown
since it last did (:class:`FreedMemory`): a trim walks the whole heap, about 20 ms for a fragmented
400 MB one. benchmarks/README.md has the measurements.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

__all__ = ["keep_freed_memory", "return_freed_memory", "resident_bytes", "FreedMemory", "TRIM_SLACK_BYTES"]

TRIM_SLACK_BYTES = 64 << 20
"""How much the resident memory may grow after a trim before :class:`FreedMemory` trims again."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


@functools.cache
def _glibc_function(name: str) -> Any | None:
    """The C library's function ``name``, or None where it has none (not glibc). Looked up once a process:
    ``find_library`` runs ``ldconfig``, about 7 ms, and the driver asks before every round."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Let glibc keep freed buffers of up to 32 MiB in this process's heap.

    By default glibc maps many MB-sized buffers fresh and unmaps them on free, so their pages fault in
    again on every use; with these limits they stay in the heap and are reused. Meant for a process that
    owns its allocator (a ClientWorker); returns whether both limits were set.
    """
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 256 << 20))


def return_freed_memory() -> bool:
    """Give the pages of freed heap memory back to the system (``malloc_trim(0)``), including holes below
    memory still in use, which glibc keeps by default. Returns whether any memory was given back."""
    malloc_trim = _glibc_function("malloc_trim")
    return bool(malloc_trim(0)) if malloc_trim is not None else False


def resident_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class FreedMemory:
    """Gives freed heap pages back (:func:`return_freed_memory`) the first time, and afterwards whenever the
    resident memory has grown by ``slack_bytes`` since it last did: memory freed since then can only be that much,
    and a trim walks the whole heap."""

    def __init__(self, slack_bytes: int = TRIM_SLACK_BYTES) -> None:
        self.slack_bytes = slack_bytes
        self._after: int | None = None
        """The resident memory right after the last trim (None before the first)."""

    def give_back(self) -> bool:
        """Trim if there may be enough to give back; returns whether it trimmed."""
        if self._after is not None and resident_bytes() - self._after < self.slack_bytes:
            return False
        return_freed_memory()
        self._after = resident_bytes()
        return True
