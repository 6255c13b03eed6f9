"""LG-FedAvg: local representations, a global head.

Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov & Morency, "Think Locally, Act
Globally: Federated Learning with Local and Global Representations", arXiv:2001.01523
(NeurIPS 2019 workshop). See docs/algorithms.md, LG-FedAvg section.

The inverse of FedPer: each client m keeps its own local representation (the body, θ_m^l)
and the server averages only the global layers on top (the head, the last ``head_blocks``
top-level blocks, θ^g) (Algorithm 1):

    θ^g ← Σ_m n_m θ_m^g / Σ_m n_m        (over the clients that uploaded)

Each client trains body and head jointly on its own data. Bodies never leave the clients
(client state store); a client that has not trained yet holds the common initialisation.
Evaluation: the client's own body under the global head.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfed.algorithms.common.body_head import BodyHeadParams, PartialClient, PartialServer
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.util.documented import section

__all__ = ["LgFedAvgParams", "LgFedAvgServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class LgFedAvgParams(BodyHeadParams):
    """Hyper-parameters of LG-FedAvg (``algorithm.params.*``): the global layers.

    ``head_blocks`` counts the *global* layers here (they are averaged); the paper's CNNs share
    the last fully connected layers, PFLlib the output layer (1).
    """


class LgFedAvgServer(PartialServer):
    """Averages the head; bodies stay with their clients."""

    shared_part = "head"
    keep_local = True


register_algorithm(
    "lgfedavg",
    params=LgFedAvgParams,
    server=LgFedAvgServer,
    client=PartialClient,
    summary="LG-FedAvg (Liang et al. 2020): local representations (body) kept per client, global head averaged",
    keeps_client_state=True,
    reporting=Reporting(label="LG-FedAvg"),
)
