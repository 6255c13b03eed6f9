"""glibc's allocator, set per process role (Linux only; elsewhere these do nothing and return False).

A ClientWorker allocates and frees the same MB-sized buffers thousands of times a round, so it keeps
freed buffers for reuse (:func:`keep_freed_memory`). The driver does the opposite: its large
allocations happen while it loads the data and builds the run, after which it holds little, so before
each round it gives the freed pages back (:func:`return_freed_memory`). benchmarks/README.md has the
measurements.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

__all__ = ["keep_freed_memory", "return_freed_memory"]

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
