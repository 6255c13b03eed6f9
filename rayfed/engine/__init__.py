"""A run from start to end: the plan checked before anything is written, the round loop
(:mod:`~rayfed.engine.simulation`), its checkpoints, client state store, metrics files and callbacks. Its run
directory's provenance is :mod:`rayfed.provenance`'s, the system model's wiring :mod:`rayfed.scheduling`'s.

``run``, ``Simulation`` and ``RunResult`` are imported on first use, so that reading one of the
light modules here (checkpoints, run directories) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfed.util.lazy import lazy_exports

if TYPE_CHECKING:
    from rayfed.engine.result import RunResult  # noqa: F401
    from rayfed.engine.simulation import Simulation, run  # noqa: F401

__all__, __getattr__, __dir__ = lazy_exports(
    __name__, {"rayfed.engine.result": ("RunResult",), "rayfed.engine.simulation": ("run", "Simulation")}
)
