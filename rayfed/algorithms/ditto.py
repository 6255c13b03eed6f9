"""Ditto: FedAvg for the global model, plus a personal model per client pulled towards it.

Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, arXiv:2012.04221. See docs/algorithms.md, Ditto section.

Global objective (Eq. 1, "Global Obj"): FedAvg's, min_w G(F_1(w), ..., F_K(w)).
Personal objective of device k (Eq. 1, "Local Obj"):

    min_{v_k} h_k(v_k; w*) := F_k(v_k) + (λ/2) ‖v_k − w*‖²                        (Eq. 1)

Round t, client k (Algorithm 1):

    v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w^t))     for s local iterations (personal_epochs)
    w_k ← local SGD on F_k from w^t                (train.local_epochs), sent to the server
    server:  w^{t+1} ← Σ_k n_k w_k / Σ_k n_k      (FedAvg over the clients that uploaded)

The proximal anchor is the round's global model w^t, the one the client received. v_k
never leaves the client (client state store, a model the personal phase trains); it starts from the
common initialisation, as in PFLlib. Evaluation: each client's v_k; the global model w^t is evaluated
beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelClient
from rayfed.algorithms.common.own_models import MODEL_KEY, saved_model
from rayfed.algorithms.common.proximal import proximal_term
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.algorithms.hooks import HELD_BY_CLIENTS
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Kept, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_int, check_real

__all__ = ["DittoParams", "DittoModels", "DittoClient", "DittoServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class DittoParams:
    """Hyper-parameters of Ditto (``algorithm.params.*``)."""

    lam: float = documented(
        0.1,
        "λ of the personal objective (Eq. 1): 0 = purely local personal models, large = close to the global "
        "model. The paper tunes λ from {0.05, 0.1, 0.2, 0.5, 1, 2} per dataset.",
    )
    personal_epochs: int = documented(
        1, "s: epochs of SGD on the personal model per round (PFLlib's plocal_epochs, default 1)."
    )

    def __post_init__(self) -> None:
        check_real("algorithm.params.lam", self.lam, low=0)
        check_int("algorithm.params.personal_epochs", self.personal_epochs, low=0)


@dataclass(frozen=True)
class DittoModels(GlobalModel):
    """The global model w^t, and the common initialisation for personal models not yet trained."""

    initial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), metadata=HELD_BY_CLIENTS)


class DittoClient(GlobalModelClient[DittoParams, GlobalModel]):
    """Per round: s epochs on v_k with (λ/2)‖v_k − w^t‖², then FedAvg's local update of w^t.

    v_k is a model the client keeps in its state (``MODEL_KEY``); the round's model (uploaded) is the locally
    updated global model w_k, whose loss and steps are the ones reported, as FedAvg's. Evaluated with v_k; w^t
    is the run's global model.
    """

    def phases(self, message: GlobalModel, job: ClientJob) -> list[Phase]:
        # v_k starts from the common initialisation; lent to another server half (algorithm.client="ditto"), a
        # client without a personal model starts it from the model it received.
        initial = message.initial if isinstance(message, DittoModels) else None
        personal = Phase(
            epochs=self.params.personal_epochs,
            loss=self.proximal if self.params.lam else None,
            model=Kept(MODEL_KEY, initial),
            reports=False,
        )
        own = [personal] if self.params.personal_epochs else []
        return [*own, Phase(epochs=job.train.local_epochs)]

    def proximal(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """(λ/2)‖v_k − w^t‖² (Eq. 1), w^t = the round's starting model."""
        return proximal_term(list(params), constants["start"], self.params.lam)

    def evaluation(self, message: GlobalModel, job: ClientJob) -> np.ndarray:
        """The client's personal model v_k."""
        assert isinstance(message, DittoModels)
        return saved_model(job, message.initial)

    def global_model(self, message: GlobalModel, job: ClientJob) -> np.ndarray:
        """The global model w^t."""
        return message.vector


class DittoServer(FedAvgServer[DittoParams]):
    """FedAvg's server; its broadcast also carries the initialisation for new personal models."""

    def __init__(self, params: DittoParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.initial = self.global_vector.copy()

    def broadcast(self) -> DittoModels:
        return DittoModels(self.global_vector, self.initial)


register_algorithm(
    "ditto",
    params=DittoParams,
    server=DittoServer,
    client=DittoClient,
    summary="Ditto (Li et al. 2021): FedAvg global model plus a personal model per client, "
    "regularised by (lambda/2)||v - w_g||^2",
    keeps_client_state=True,
    reporting=Reporting(label="Ditto"),
)
