"""Federated algorithms, each one module registering a client half and a server half.

Importing this package registers every built-in algorithm in :data:`ALGORITHMS`.
"""

from rayfed.algorithms import (  # noqa: F401  (registration)
    cwfedavg,
    fedavg,
    fedawa,
    fedclassavg,
    fedprox,
    local,
    sgdm,
)
from rayfed.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    Broadcast,
    ClientHalf,
    Contribution,
    NoParams,
    ResolvedAlgorithm,
    RoundContext,
    ServerHalf,
    SharedBody,
    register_algorithm,
    resolve,
)
from rayfed.algorithms.contributions import WeightedSum, sum_contributions

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Broadcast",
    "ClientHalf",
    "Contribution",
    "NoParams",
    "ResolvedAlgorithm",
    "RoundContext",
    "ServerHalf",
    "SharedBody",
    "WeightedSum",
    "register_algorithm",
    "resolve",
    "sum_contributions",
]
