"""FedProx: FedAvg whose clients add a proximal term towards the round's global model.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, arXiv:1812.06127.
Client objective (Definition 2 / Eq. 2):

    h_i(w) = L_i(w) + (μ/2) ‖w − w_g‖²

The server half is FedAvg's. The client half can be combined with any server half,
e.g. ``algorithm.name="fedawa", algorithm.client="fedprox"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelClient
from rayfed.algorithms.common.proximal import proximal_term
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_real

__all__ = ["FedProxParams", "FedProxClient"]


@section("algorithm.params")
@dataclass(frozen=True)
class FedProxParams:
    """Hyper-parameters of FedProx (``algorithm.params.*``)."""

    mu: float = documented(
        0.001, "μ of the proximal term (Eq. 2); 0.001 as in the cwFedAvg and FedAWA papers' baselines."
    )

    def __post_init__(self) -> None:
        check_real("algorithm.params.mu", self.mu, low=0)


class FedProxClient(GlobalModelClient[FedProxParams, GlobalModel]):
    """FedAvg's client that adds (μ/2)‖w − w_g‖² to each mini-batch's loss, w_g = the model it started from (so
    it reads nothing of the message, and lends its phases to any server half: ``algorithm.client="fedprox"``)."""

    def phases(self, message: GlobalModel, job: ClientJob) -> list[Phase]:
        if self.params.mu == 0:
            return super().phases(message, job)
        return [Phase(epochs=job.train.local_epochs, loss=self.proximal)]

    def proximal(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """(μ/2)‖w − w_g‖² (Eq. 2), w_g = the round's starting model."""
        return proximal_term(params, constants["start"], self.params.mu)


register_algorithm(
    "fedprox",
    params=FedProxParams,
    server=FedAvgServer,
    client=FedProxClient,
    summary="FedProx (Li et al. 2020): FedAvg + client proximal term (mu/2)||w - w_g||^2",
    reporting=Reporting(label="FedProx", single_model=True),
)
