"""The experiment trackers ``engine.loggers`` may name, and whether each one's library is installed.

The names and their packages sit here, beside the field that takes them, so that the run's plan
(:func:`rayfed.engine.plan.plan_run`) and ``rayfed tune`` refuse a tracker whose package is missing before
anything is written, without importing the trackers (:mod:`rayfed.tracking`, which sits above the engine)
nor their libraries (``import mlflow`` alone takes seconds): :func:`check_installed` only looks them up.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from rayfed.util.errors import ConfigError

__all__ = ["TRACKERS", "TRACKER_PACKAGES", "check_installed"]

TRACKER_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}
"""tracker -> (the module it imports, the rayfed extra that installs it)."""

TRACKERS = tuple(TRACKER_PACKAGES)
"""The experiment trackers ``engine.loggers`` may name (:mod:`rayfed.tracking` logs to each)."""


def check_installed(loggers: Sequence[str]) -> None:
    """ConfigError naming the extra to install for the first tracker in ``loggers`` whose package is missing."""
    for name in loggers:
        module, extra = TRACKER_PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"engine.loggers={list(loggers)!r} names {name!r}, but its package {module!r} is not installed; "
                f"install it with: pip install 'rayfed[{extra}]' (or leave {name!r} out of engine.loggers)"
            )
