"""FedAsync: asynchronous federated optimisation, one update per server step.

Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", OPT 2020, arXiv:1903.03934 (Algorithm 1). See
docs/system.md, "Asynchronous aggregation".

C clients train at once (the concurrency), each from the model version τ of its launch; every update y that
arrives makes a new version at once, mixed in with a weight that shrinks with its staleness t − τ:

    α_t = α · s(t − τ)                              s: constant, polynomial or hinge (Sec. 5.2)
    θ_t = (1 − α_t) θ_{t−1} + α_t y                 (Algorithm 1, the server's update)

Floating-point buffers (BatchNorm statistics) are mixed alike. The schedule is simulated in virtual time by the
engine (:mod:`rayfed.scheduling.async_rounds`), and the server keeps each update until its step
(:mod:`rayfed.algorithms.common.asynchronous`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.algorithms.common.asynchronous import AsynchronousParams, KeptUpdatesServer
from rayfed.algorithms.common.global_model import WholeModelsClient
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_real

__all__ = ["FedAsyncParams", "FedAsyncServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class FedAsyncParams(AsynchronousParams):
    """Hyper-parameters of FedAsync (``algorithm.params.*``)."""

    alpha: float = documented(0.6, "α in (0, 1], the mixing weight of a fresh update (the paper's experiments: 0.6).")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_real("algorithm.params.alpha", self.alpha, low=0, high=1, low_open=True)


class FedAsyncServer(KeptUpdatesServer[FedAsyncParams]):
    """Keeps θ_g and, for each version to make, the one update that makes it, weighted by α_t."""

    def update_of(self, models: np.ndarray) -> np.ndarray:
        """The trained model y itself."""
        return models

    def weights(self, staleness: np.ndarray) -> np.ndarray:
        """α_t = α · s(t − τ)."""
        return self.params.alpha * self.params.weight(staleness)

    def apply(self, total: np.ndarray, weight: float, count: int) -> dict[str, float]:
        """θ_t = (1 − α_t) θ_{t−1} + α_t y (``total`` = α_t y, ``weight`` = α_t)."""
        self.global_vector = (np.float32(1.0 - weight) * self.global_vector + total).astype(np.float32)
        return {"fedasync_alpha": weight}


register_algorithm(
    "fedasync",
    params=FedAsyncParams,
    server=FedAsyncServer,
    client=WholeModelsClient,
    summary="FedAsync (Xie et al. 2019): asynchronous clients, each update mixed in with weight alpha*s(staleness)",
    reporting=Reporting(label="FedAsync", single_model=True),
)
