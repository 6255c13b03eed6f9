"""Each name ``engine.loggers`` takes, to its :class:`~rayfed.tracking.tracker.Tracker`, imported when a run
uses it (``import mlflow`` alone takes seconds); and the checks that refuse a run its trackers cannot take,
before anything is written."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rayfed.config.trackers import TRACKER_PACKAGES
from rayfed.tracking.tracker import Tracker
from rayfed.util.errors import ConfigError

__all__ = ["tracker_class", "check_services", "check_folders", "FIGURES"]

FIGURES = "figures"
"""The folder of the run directory the trackers draw the finished run's figures into."""


def tracker_class(name: str) -> type[Tracker]:
    """The tracker ``engine.loggers`` calls ``name`` (one of :data:`rayfed.config.TRACKERS`). A library that is
    installed but fails to import (a protobuf clash in ``import mlflow``) is a ConfigError in one line naming
    the tracker and the fix: every check that refuses a run before anything is written starts here."""
    try:
        return _imported(name)
    except Exception as error:  # the library's own import error, whatever its type
        module, extra = TRACKER_PACKAGES[name]
        why = " ".join(f"{type(error).__name__}: {error}".split())  # one line: such messages span several
        raise ConfigError(
            f"engine.loggers names {name!r}, but its package {module!r} fails to import ({why}); fix that "
            f"installation (the package the error names, or pip install --force-reinstall 'rayfed[{extra}]'), or "
            f"leave {name!r} out of engine.loggers"
        ) from error


def _imported(name: str) -> type[Tracker]:
    if name == "tensorboard":
        from rayfed.tracking.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker
    if name == "mlflow":
        from rayfed.tracking.mlflow_tracker import MlflowTracker

        return MlflowTracker
    from rayfed.tracking.wandb_tracker import WandbTracker

    return WandbTracker


def check_services(loggers: Sequence[str], folder: Path) -> None:
    """Each tracker's own settings (its environment variables, its store; ``folder``: where the default store
    lies, the run's or the study's directory): ConfigError naming the variable and the fix."""
    for name in loggers:
        tracker_class(name).check(folder)


def check_folders(loggers: Sequence[str], run_dir: Path) -> None:
    """ConfigError when a folder the trackers write into is a file in ``run_dir``."""
    folders = [(tracker_class(name).folder, f"{name} writes the run's files", [name]) for name in loggers]
    for folder, use, users in [*folders, (FIGURES, "the trackers draw the finished run's figures", list(loggers))]:
        path = run_dir / folder if folder else None
        if path is not None and path.exists() and not path.is_dir():
            left = [name for name in loggers if name not in users]
            raise ConfigError(
                f"{str(path)!r} is a file, but it is the folder where {use}; move it aside, or leave "
                f"{' and '.join(users)} out of engine.loggers (engine.loggers={left!r})"
            )
