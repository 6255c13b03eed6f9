"""Helpers shared by the benchmark scripts: a private Ray for the run, and per-round wall-clock timing.

Not part of the ``rayfed`` package; the scripts in this folder import it as a sibling module.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rayfed.callbacks import Callback

__all__ = ["RoundTimer", "private_ray", "median_after_warmup"]


class RoundTimer(Callback):
    """Wall-clock seconds of every round, callbacks (metrics files) included.

    Round t lasts from the end of round t-1 (or the start of the run) to the end of
    round t, so the sum of the durations is the whole loop. A subclass may read another
    clock (``clock = staticmethod(time.process_time)``).
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._last = 0.0

    def on_run_start(self, sim) -> None:
        self._last = self.clock()

    def after_round(self, sim, record, clients) -> bool:
        now = self.clock()
        self.seconds.append(now - self._last)
        self._last = now
        return False


def median_after_warmup(seconds: list[float], warmup: int = 1) -> float:
    """Median of the round times after the first ``warmup`` rounds (workers start, models are built)."""
    measured = seconds[warmup:] or seconds
    return statistics.median(measured)


@contextmanager
def private_ray(num_cpus: int | None = None) -> Iterator[None]:
    """A fresh local Ray for the benchmark (never a stale cluster's address), shut down afterwards."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()
