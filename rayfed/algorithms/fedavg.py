"""FedAvg: the sample-size weighted average of the clients' models.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv:1602.05629.

    θ_g ← Σ_{i∈U} n_i θ_i / Σ_{i∈U} n_i

over the set U of clients that uploaded this round, n_i = their training samples.
Floating-point buffers (BatchNorm running statistics) are averaged with the same weights.
"""

from __future__ import annotations

from rayfed.algorithms.common.global_model import GlobalModelClient, GlobalModelServer
from rayfed.algorithms.contributions import WeightedSum
from rayfed.algorithms.hooks import NoParams, RoundContext
from rayfed.algorithms.registry import Reporting, register_algorithm

__all__ = ["FedAvgServer"]


class FedAvgServer(GlobalModelServer[object, WeightedSum]):
    """Keeps θ_g; aggregates by the weighted average of the uploaded models."""

    def aggregate(self, ctx: RoundContext, contribution: WeightedSum) -> dict[str, float]:
        self.global_vector = contribution.average()
        return {"clients_aggregated": float(contribution.count)}


register_algorithm(
    "fedavg",
    params=NoParams,
    server=FedAvgServer,
    client=GlobalModelClient,
    summary="FedAvg (McMahan et al. 2017): size-weighted average of full models",
    reporting=Reporting(label="FedAvg", single_model=True),
)
