"""Federated algorithms, each one module registering a client half and a server half.

Importing this package imports every module in it, and each algorithm module registers
itself in :data:`ALGORITHMS` (``register_algorithm`` at its bottom): adding an algorithm
is adding one module, with no list to edit.
"""

import importlib
import pkgutil

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
from rayfed.algorithms.contributions import ClientVectors, WeightedSum, sum_contributions

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):  # registration
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Broadcast",
    "ClientHalf",
    "ClientVectors",
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
