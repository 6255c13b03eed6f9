"""A run with its trackers: what ``rayfed.run`` and ``rayfed run`` call.

The engine runs a config with the callbacks it is given and knows no tracker; this entry adds the
:class:`~rayfed.tracking.callback.Tracking` callback of the trackers ``engine.loggers`` names, unless the caller
gave one of its own (an Optuna trial's, filed under its study).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.engine.result import RunResult
from rayfed.tracking.callback import Tracking

__all__ = ["run", "with_trackers"]


def with_trackers(config: RunConfig, callbacks: Sequence[Callback] = ()) -> list[Callback]:
    """``callbacks`` with the run's :class:`Tracking` first, if ``engine.loggers`` names trackers and none of
    ``callbacks`` tracks the run already."""
    if config.engine.loggers and not any(isinstance(callback, Tracking) for callback in callbacks):
        return [Tracking(config.engine.loggers), *callbacks]
    return list(callbacks)


def run(
    config: RunConfig | Mapping[str, Any], *, callbacks: Sequence[Callback] = (), resume: bool = False
) -> RunResult:
    """Run ``config`` (or resume it from ``config.run_dir``) as :func:`rayfed.engine.simulation.run` does, sent
    to the experiment trackers ``engine.loggers`` names (:mod:`rayfed.tracking`); returns its results.

    ``config`` is a :class:`RunConfig` or a mapping of dotted field paths to values
    (``{"train.lr": 0.01}``), as :meth:`RunConfig.override` takes. With ``engine.backend="ray"``
    this joins the Ray cluster named by ``engine.ray_address`` / ``RAY_ADDRESS``, or starts a
    local one for the run.
    """
    from rayfed.engine.simulation import run as run_engine

    config = RunConfig.of(config)
    return run_engine(config, callbacks=with_trackers(config, callbacks), resume=resume)
