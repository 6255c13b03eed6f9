"""Progress bars for long set-up steps (dataset generation, partitioning), shown only when they are slow.

A bar appears after :data:`DELAY_S` seconds, so a quick step prints nothing, and not
at all inside :func:`progress_shown` with ``False`` (the engine runs its set-up there
with ``engine.progress``). The switch is a context variable, so the data modules need no
extra parameter and a thread that does not update a bar costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tqdm.auto import tqdm

__all__ = ["DELAY_S", "progress_bar", "progress_shown"]

DELAY_S = 2.0
"""Seconds a step runs before its bar appears."""

_SHOWN: ContextVar[bool] = ContextVar("rayfed_progress_shown", default=True)


@contextmanager
def progress_shown(shown: bool) -> Iterator[None]:
    """Show (or hide) the set-up bars opened in this context."""
    token = _SHOWN.set(shown)
    try:
        yield
    finally:
        _SHOWN.reset(token)


def progress_bar(total: int, desc: str, unit: str) -> tqdm:
    """A bar over ``total`` ``unit`` that appears only after :data:`DELAY_S` seconds and is removed when done.

    Counts show as integers (``3/8 batch``); only totals of thousands are scaled (``12.0k/70.0k sample``).

    >>> progress_bar(8, "training", "batch").unit_scale, progress_bar(70_000, "generating", "sample").unit_scale
    (False, True)
    """
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=total >= 1000,
        delay=DELAY_S,
        leave=False,
        disable=not _SHOWN.get(),
        dynamic_ncols=True,
    )
