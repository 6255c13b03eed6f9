"""FedAvg: the sample-size weighted average of the clients' models.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv:1602.05629.

    θ_g ← Σ_{i∈U} n_i θ_i / Σ_{i∈U} n_i

over the set U of clients that uploaded this round, n_i = their training samples.
Floating-point buffers (BatchNorm running statistics) are averaged with the same weights.

Its server is also FedOpt's (Reddi et al. 2021, Algorithm 2): a subclass that names a central optimiser
(:meth:`FedAvgServer.central_optimizer`, :mod:`rayfed.algorithms.common.central_optimizers`) moves θ_g by it
along the pseudo-gradient Δ = average − θ_g instead (FedAdam).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from rayfed.algorithms.common.central_optimizers import CentralOptimizer
from rayfed.algorithms.common.global_model import GlobalModelClient, GlobalModelServer
from rayfed.algorithms.contributions import WeightedSum
from rayfed.algorithms.hooks import NoParams, RoundContext
from rayfed.algorithms.private_uploads import ModelUpload
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.problem import ProblemSpec

__all__ = ["FedAvgServer"]

P = TypeVar("P")


class FedAvgServer(ModelUpload, GlobalModelServer[P, WeightedSum]):
    """Keeps θ_g; aggregates by the weighted average of the uploaded models, or, where a subclass names a central
    optimiser, by its step along the pseudo-gradient (the optimiser's state saved with θ_g)."""

    def __init__(self, params: P, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.num_params = spec.layouts[self.architecture].size
        self.optimizer = self.central_optimizer(self.num_params)

    def privacy_reference(self) -> np.ndarray:
        """θ_g, the model every client of the round started from (:class:`ModelUpload`)."""
        return self.global_vector

    def central_optimizer(self, size: int) -> CentralOptimizer | None:
        """The server optimiser over the ``size`` parameters of θ_g (FedAdam's ``CentralAdam``); None, FedAvg's
        average, by default."""
        return None

    def aggregate(self, ctx: RoundContext, contribution: WeightedSum) -> dict[str, float]:
        average = contribution.average()
        if self.optimizer is None:
            self.global_vector = average
            return {"clients_aggregated": float(contribution.count)}
        p = self.num_params
        delta = average[:p] - self.global_vector[:p]
        theta = self.optimizer.step(self.global_vector[:p], delta)
        self.global_vector = np.concatenate([theta, average[p:]]).astype(np.float32, copy=False)
        return {
            "clients_aggregated": float(contribution.count),
            f"{self.optimizer.name}_delta_norm": float(np.linalg.norm(delta)),
        }

    def extra_state(self) -> dict[str, np.ndarray]:
        return {} if self.optimizer is None else self.optimizer.state_dict()

    def load_extra_state(self, state: Mapping[str, np.ndarray]) -> None:
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)


register_algorithm(
    "fedavg",
    params=NoParams,
    server=FedAvgServer,
    client=GlobalModelClient,
    summary="FedAvg (McMahan et al. 2017): size-weighted average of full models",
    reporting=Reporting(label="FedAvg", single_model=True),
)
