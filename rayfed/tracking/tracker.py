"""What each tracker does with a run, whatever the tool: :class:`Tracker`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfed.tracking.state import Logged

if TYPE_CHECKING:  # pragma: no cover
    from rayfed.engine.callbacks import RunView
    from rayfed.tracking.study_link import StudyLink

__all__ = ["Tracker", "RoundPoint"]

RoundPoint = tuple[int, Mapping[str, float], Mapping[str, np.ndarray]]
"""(step, metrics, per-client distributions) of one recorded round."""


class Tracker(ABC):
    """One tool's logged run of one rayfed run. The :class:`~rayfed.tracking.callback.Tracking` callback
    decides once, for every tool, what is sent and at which step, and records a step as sent only once the
    tool confirmed holding it (:meth:`confirm`); a tracker only hands things to its library and asks it."""

    name: str
    """The tracker's name in ``engine.loggers``."""
    folder: str | None = None
    """The folder of the run directory the tool writes its files to, if any (checked before the run starts)."""
    keeps = True
    """Whether the tool keeps what it takes (W&B's ``disabled`` mode keeps nothing, so nothing counts as sent and
    a resume with W&B enabled sends every round)."""

    @abstractmethod
    def __init__(self, run: RunView, saved: Logged, study: StudyLink | None) -> None:
        """Open the run's logged run: the one ``saved`` names (a resume), else a new one (filed under ``study``)."""

    @classmethod
    def store(cls, folder: Path) -> str:
        """Where the tool keeps a run directory's logged runs, as a refusal names it: its folder there."""
        return repr(str(folder / cls.folder)) if cls.folder else "the tool's own store"

    @classmethod
    def check(cls, folder: Path) -> None:
        """Before anything is written: ConfigError naming what of the tool's setting (its environment variables,
        its store under ``folder``) cannot take a run, and the fix. Nothing to check by default."""

    @classmethod
    @abstractmethod
    def recorded(cls, run: RunView, study: StudyLink | None) -> Logged | None:
        """This run's logged run as the tool's own records show it (its ids, its last step, its config), for a
        run whose ``tracking.json`` lost its entry; None when the tool holds none."""

    @abstractmethod
    def ids(self) -> dict[str, str]:
        """What ``tracking.json`` keeps so that a resumed run reopens this logged run."""

    @abstractmethod
    def log_config(self, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> None:
        """The run's config as hyper-parameters (``flat``: dotted path -> value), once per logged run."""

    @abstractmethod
    def log_rounds(self, points: Sequence[RoundPoint]) -> None:
        """Rounds' metrics (and distributions, if the tool keeps them), in step order."""

    @abstractmethod
    def confirm(self, step: int | None) -> None:
        """Return once the tool holds everything handed to it so far (``step``: the last round step handed,
        None: the config only), its writes flushed and checked; raise if it cannot say so."""

    @abstractmethod
    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        """The finished run's figures (PNG files); ``step``: the last round's."""

    @abstractmethod
    def close(self, finished: bool) -> None:
        """End this process's part of the logged run (``finished``: the run ran all its rounds or stopped early)."""
