"""Progress: bars on a terminal, lines in a log.

:func:`progress_bar` is for long set-up steps (dataset generation, partitioning) and a round's
batches: a bar that appears after :data:`DELAY_S` seconds, so a quick step prints nothing, and not
at all inside :func:`progress_shown` with ``False`` (the engine runs its set-up there with
``engine.progress``). The switch is a context variable, so the data modules need no extra
parameter and a thread that does not update a bar costs nothing.

Where stderr is not a terminal (a log file, ``ray job logs``), a bar's redraws pile up as text (20
rounds of the main job's nested bars wrote 84 KB). There the set-up and batch bars stay silent and
:func:`steps`, the progress over a run's rounds or a plan's calibrations, prints one line per step.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType

from tqdm.auto import tqdm

__all__ = ["DELAY_S", "StepLines", "on_terminal", "progress_bar", "progress_shown", "steps"]

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

    Counts show as integers (``3/8 batch``); only totals of thousands are scaled (``12.0k/70.0k sample``). Off
    the terminal (:func:`on_terminal`) the bar is silent.
    """
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=total >= 1000,
        delay=DELAY_S,
        leave=False,
        disable=not _SHOWN.get() or not on_terminal(),
        dynamic_ncols=True,
    )


def on_terminal() -> bool:
    """Whether stderr, where progress goes, is a terminal (not a file, a pipe or a job's log)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def steps(total: int, desc: str, unit: str, *, initial: int = 0, lines: bool = False) -> tqdm | StepLines:
    """Progress over ``total`` steps (rounds, calibrations): a bar on a terminal, one line per step in a log (and
    on a terminal too with ``lines``)."""
    if on_terminal() and not lines:
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True)
    return StepLines(total, desc, unit, initial=initial)


class StepLines:
    """The calls of a tqdm bar that :func:`steps` makes, written as one line per step on stderr:
    ``desc: 3/20 round (acc=0.9127, s=9.81)``."""

    def __init__(self, total: int, desc: str, unit: str, *, initial: int = 0) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.postfix = ""

    def set_description_str(self, desc: str) -> None:
        self.desc = desc

    def set_postfix(self, values: Mapping[str, object]) -> None:
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        tail = f" ({self.postfix})" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}{tail}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Nothing to clear: every line is already written."""

    def __enter__(self) -> StepLines:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
