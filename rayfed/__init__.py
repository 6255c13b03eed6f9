"""rayfed: a Ray-native engine that simulates personalized federated learning at scale.

>>> import rayfed
>>> config = rayfed.RunConfig().override({"algorithm.name": "fedprox", "train.rounds": 5})
>>> result = rayfed.run(config)  # doctest: +SKIP
>>> print(rayfed.check("fedprox"))  # does it stack, with equal losses? (docs/methods.md)  # doctest: +SKIP

The names below are imported on first use (PEP 562, module ``__getattr__``), so that
``import rayfed`` and the command line (``rayfed --help``, ``rayfed list``) do not import
torch or Ray; ``rayfed.run`` imports them when a run needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfed.util.lazy import lazy_exports
from rayfed.util.version import VERSION

if TYPE_CHECKING:  # the same names for type checkers; at run time __getattr__ imports them
    from rayfed.checking.method_check import check  # noqa: F401
    from rayfed.config import (  # noqa: F401
        AlgorithmConfig,
        DataConfig,
        EngineConfig,
        ModelConfig,
        RunConfig,
        TrainConfig,
        load_config,
    )
    from rayfed.engine.result import RunResult  # noqa: F401
    from rayfed.engine.simulation import Simulation  # noqa: F401
    from rayfed.packs import run_many  # noqa: F401
    from rayfed.results.run_data import load_run  # noqa: F401
    from rayfed.tracking.runs import run  # noqa: F401
    from rayfed.util.errors import (  # noqa: F401
        CheckpointError,
        ConfigError,
        DatasetError,
        RayfedError,
        ResourceError,
        WorkerError,
    )
    from rayfed.util.plugin_check import accept_plugins  # noqa: F401

__version__ = VERSION

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "rayfed.config": (
            "AlgorithmConfig",
            "DataConfig",
            "EngineConfig",
            "ModelConfig",
            "RunConfig",
            "TrainConfig",
            "load_config",
        ),
        "rayfed.checking.method_check": ("check",),
        "rayfed.util.plugin_check": ("accept_plugins",),
        "rayfed.engine.result": ("RunResult",),
        "rayfed.engine.simulation": ("Simulation",),
        "rayfed.packs": ("run_many",),
        "rayfed.results.run_data": ("load_run",),
        "rayfed.tracking.runs": ("run",),
        "rayfed.util.errors": (
            "RayfedError",
            "ConfigError",
            "DatasetError",
            "CheckpointError",
            "ResourceError",
            "WorkerError",
        ),
    },
)
