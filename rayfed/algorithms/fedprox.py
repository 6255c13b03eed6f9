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

from rayfed.algorithms.base import ClientHalf, register_algorithm
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.errors import ConfigError
from rayfed.training import ClientJob

__all__ = ["FedProxParams", "FedProxClient", "proximal_term"]


@dataclass(frozen=True)
class FedProxParams:
    mu: float = 0.001
    """μ of the proximal term; 0.001 as in the cwFedAvg and FedAWA papers' baselines."""

    def __post_init__(self) -> None:
        if not self.mu >= 0:
            raise ConfigError(f"algorithm.params.mu must be >= 0, but got algorithm.params.mu={self.mu!r}")


def proximal_term(params: list[torch.Tensor], anchors: list[torch.Tensor], mu: float) -> torch.Tensor:
    """(μ/2) Σ_l ‖w_l − a_l‖² over parameter tensors (FedProx Eq. 2)."""
    return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(params, anchors))  # type: ignore[return-value]


class FedProxClient(ClientHalf[FedProxParams]):
    """Adds (μ/2)‖w − w_g‖² to each mini-batch's loss, w_g = the model the client started from."""

    def begin(self, job: ClientJob) -> None:
        anchor = job.flat.vector.detach().clone()
        job.scratch["prox_anchor"] = [anchor[s].view(p.shape) for s, p in zip(_slices(job), job.flat.params)]

    def extra_loss(self, job: ClientJob, logits: torch.Tensor) -> torch.Tensor | None:
        if self.params.mu == 0:
            return None
        return proximal_term(job.flat.params, job.scratch["prox_anchor"], self.params.mu)  # type: ignore[arg-type]


def _slices(job: ClientJob) -> list[slice]:
    offsets = job.flat.layout.offsets
    return [slice(a, b) for a, b in zip(offsets[:-1], offsets[1:])]


register_algorithm(
    "fedprox",
    params=FedProxParams,
    server=FedAvgServer,
    client=FedProxClient,
    summary="FedProx (Li et al. 2020): FedAvg + client proximal term (mu/2)||w - w_g||^2",
)
