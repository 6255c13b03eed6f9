"""Federated algorithms, each one module registering a client half and a server half.

Each algorithm module registers itself in :data:`ALGORITHMS` (``register_algorithm`` at its
bottom), and the registry finds the modules itself: adding an algorithm is adding one
module, with no list to edit. A module is imported when its algorithm is first looked up
(the module of that name, e.g. ``fedavg``, or, for a name registered beside another one,
every module), and every module before the first listing; so a process that looks up one
algorithm imports only its module (the server process of FedAvg imports no torch).
"""

from rayfed.algorithms.contributions import ClientVectors, WeightedSum, sum_contributions
from rayfed.algorithms.declarations import SharedBody
from rayfed.algorithms.hooks import ClientHalf, Contribution, NoParams, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import (
    ALGORITHMS,
    Algorithm,
    Capabilities,
    Reporting,
    ResolvedAlgorithm,
    register_algorithm,
)
from rayfed.algorithms.settings import resolve

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientHalf",
    "ClientVectors",
    "Contribution",
    "NoParams",
    "Capabilities",
    "Reporting",
    "ResolvedAlgorithm",
    "RoundContext",
    "ServerHalf",
    "SharedBody",
    "Start",
    "WeightedSum",
    "register_algorithm",
    "resolve",
    "sum_contributions",
]
