"""rayfed: a Ray-native engine that simulates personalized federated learning at scale.

>>> import rayfed
>>> config = rayfed.RunConfig().override({"algorithm.name": "fedprox", "train.rounds": 5})
>>> result = rayfed.run(config)  # doctest: +SKIP
"""

from rayfed.config import (
    AlgorithmConfig,
    DataConfig,
    EngineConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    load_config,
)
from rayfed.engine import RunResult, Simulation, run
from rayfed.errors import CheckpointError, ConfigError, DatasetError, RayfedError, ResourceError, WorkerError

__version__ = "0.1.0"

__all__ = [
    "AlgorithmConfig",
    "DataConfig",
    "EngineConfig",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "load_config",
    "run",
    "RunResult",
    "Simulation",
    "RayfedError",
    "ConfigError",
    "DatasetError",
    "CheckpointError",
    "ResourceError",
    "WorkerError",
]
