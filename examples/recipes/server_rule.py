"""Recipe 3, a server rule: FedAvg's server with momentum, by naming a central optimiser.

FedAvgM (Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", arXiv:1909.06335): the server keeps a velocity of the pseudo-gradient Δ (the clients' weighted
average minus the global model) and moves the global model by it,

    v ← β·v + Δ,   θ ← θ + η·v,

one of FedOpt's server optimisers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021). The server names
the optimiser; FedAvg's server applies it to the parameters (buffers take the clients' average) and saves its
velocity with the global model, so a resumed run continues it. FedAdam is the same with ``CentralAdam``.

    python examples/recipes/server_rule.py          # rayfed check: stacks? equal losses? sizes?

docs/methods.md, "Recipe 3: a server rule".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import rayfed
from rayfed.algorithms import register_algorithm
from rayfed.algorithms.common.central_optimizers import CentralOptimizer, CentralSGD
from rayfed.algorithms.common.global_model import GlobalModelClient
from rayfed.algorithms.fedavg import FedAvgServer


@dataclass(frozen=True)
class FedAvgMParams:
    """``algorithm.params`` of FedAvgM: the server learning rate η and momentum β."""

    server_lr: float = 1.0
    momentum: float = 0.9


class FedAvgMServer(FedAvgServer[FedAvgMParams]):
    """FedAvg's server, stepping the global model with SGD and momentum."""

    def central_optimizer(self, size: int) -> CentralOptimizer:
        return CentralSGD(size, lr=self.params.server_lr, momentum=self.params.momentum)


register_algorithm(
    "fedavgm",
    params=FedAvgMParams,
    server=FedAvgMServer,
    client=GlobalModelClient,  # FedAvg's client: it starts from the global model and sends its trained model
    summary="FedAvgM (Hsu et al. 2019): FedAvg with server momentum on the pseudo-gradient",
)


if __name__ == "__main__":
    report = rayfed.check("fedavgm")
    print(report)
    sys.exit(0 if report.ok else 1)
