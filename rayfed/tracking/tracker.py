"""What each tracker does with a run, whatever the tool: :class:`Tracker`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Tracker", "RoundPoint"]

RoundPoint = tuple[int, Mapping[str, float], Mapping[str, np.ndarray]]
"""(step, metrics, per-client distributions) of one recorded round."""


class Tracker(ABC):
    """One tool's logged run of one rayfed run. The :class:`~rayfed.tracking.callback.Tracking` callback
    decides once, for every tool, what is sent and at which step; a tracker only hands it to its library."""

    name: str
    """The tracker's name in ``engine.loggers``."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """What :data:`~rayfed.tracking.registry.STATE_FILE` keeps so that a resumed run reopens this logged run."""

    @abstractmethod
    def log_config(self, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> None:
        """The run's config as hyper-parameters (``flat``: dotted path -> value), once per logged run."""

    @abstractmethod
    def log_rounds(self, points: Sequence[RoundPoint]) -> None:
        """Rounds' metrics (and distributions, if the tool keeps them), in step order."""

    @abstractmethod
    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        """The finished run's figures (PNG files)."""

    @abstractmethod
    def close(self, finished: bool) -> None:
        """End this process's part of the logged run (``finished``: the run ran all its rounds or stopped early)."""
