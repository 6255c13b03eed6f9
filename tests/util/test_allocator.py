"""The driver gives its loading's freed pages back, again only once its memory grew; a worker keeps freed buffers
(rayfed.util.allocator).

Each case runs in a fresh interpreter, so the test process's own heap cannot blur the numbers.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from rayfed.util.allocator import _glibc_function

pytestmark = pytest.mark.skipif(_glibc_function("malloc_trim") is None, reason="needs glibc")

# Fill the heap with 64 KiB blocks (below glibc's mmap threshold), each followed by a small block that stays
# alive, free the large ones: their pages are holes below live memory, which glibc keeps until trimmed.
HOLES = """
import os, sys
from rayfed.util.allocator import return_freed_memory

def rss_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

blocks, keepers = [], []
for _ in range(2000):
    block = bytearray(65536)
    block[::4096] = b"\\x01" * 16  # touch every page
    blocks.append(block)
    keepers.append(bytearray(600))
filled = rss_mb()
del blocks
freed = rss_mb()
trimmed_any = return_freed_memory() if sys.argv[1] == "trim" else False
print(filled, freed, rss_mb(), trimmed_any)
"""


def holes(mode: str) -> tuple[float, float, float, bool]:
    out = subprocess.run([sys.executable, "-c", HOLES, mode], capture_output=True, text=True, check=True).stdout
    filled, freed, after, trimmed = out.split()
    return float(filled), float(freed), float(after), trimmed == "True"


def test_return_freed_memory_gives_back_holes_below_live_memory() -> None:
    filled, freed, after, trimmed = holes("trim")
    assert freed > filled - 20, "glibc gave the holes back by itself: the case does not exercise the trim"
    assert trimmed and after < freed - 100, (filled, freed, after)


def test_without_the_trim_the_holes_stay() -> None:
    filled, freed, after, trimmed = holes("none")
    assert not trimmed and after > filled - 20, (filled, freed, after)


def test_keep_freed_memory_sets_both_limits() -> None:
    code = "from rayfed.util.allocator import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


GATED = """
from rayfed.util.allocator import FreedMemory

heap = FreedMemory(slack_bytes=32 << 20)
first, again = heap.give_back(), heap.give_back()
blocks, keepers = [], []
for _ in range(1500):  # about 96 MiB of holes below live memory, as in HOLES
    block = bytearray(65536)
    block[::4096] = b"\\x01" * 16
    blocks.append(block)
    keepers.append(bytearray(600))
del blocks
print(first, again, heap.give_back(), heap.give_back())
"""


def test_freed_memory_trims_first_and_then_only_once_the_resident_memory_grew() -> None:
    out = subprocess.run([sys.executable, "-c", GATED], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", "True", "False"]
