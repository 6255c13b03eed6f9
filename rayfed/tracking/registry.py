"""Which package each tracker needs, and the facts a logged run is filed under.

The trackers' libraries are imported only by the tracker modules, when a run uses them
(``import mlflow`` alone takes seconds); :func:`check_installed` looks them up without importing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rayfed.config import TRACKERS
from rayfed.util.errors import ConfigError

__all__ = ["PACKAGES", "STATE_FILE", "StudyLink", "check_installed"]

PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}
"""tracker -> (the module it imports, the rayfed extra that installs it)."""
assert tuple(PACKAGES) == TRACKERS, "every tracker engine.loggers accepts has its package here"

STATE_FILE = "tracking.json"
"""In the run directory: each tracker's logged run (its id) and the last step it received."""


@dataclass(frozen=True)
class StudyLink:
    """The Optuna study a run is a trial of, so that each tracker files the trial under its study: a run
    nested in the study's run (MLflow), a group (W&B), a folder of the study's (TensorBoard: the trials'
    run directories lie in the study's)."""

    study_name: str
    study_dir: Path
    trial_number: int
    mlflow_parent_run_id: str | None = None
    """The study's own MLflow run (:func:`rayfed.tracking.mlflow_tracker.study_run`), when MLflow is a tracker."""


def check_installed(loggers: Sequence[str]) -> None:
    """ConfigError naming the extra to install for the first tracker in ``loggers`` whose package is missing."""
    for name in loggers:
        module, extra = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"engine.loggers={list(loggers)!r} names {name!r}, but its package {module!r} is not installed; "
                f"install it with: pip install 'rayfed[{extra}]' (or leave {name!r} out of engine.loggers)"
            )
