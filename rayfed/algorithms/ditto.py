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

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfed.algorithms.common.global_model import GlobalModel
from rayfed.algorithms.common.own_models import MODEL_KEY, saved_model
from rayfed.algorithms.common.proximal import proximal_term
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.algorithms.hooks import ClientHalf
from rayfed.algorithms.registry import register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.train.scratch import ScratchKey
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_int, check_real

__all__ = ["DittoParams", "DittoModels", "DittoClient", "DittoServer"]

_PERSONAL = ScratchKey[np.ndarray]("ditto.personal")
"""``job.scratch`` key: the personal model v_k the broadcast hands to the client half."""


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

    initial: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))

    def personalise(self, job: ClientJob) -> None:
        """w^t into the model (the start of the global update); v_k to the client half via scratch."""
        job.flat.load_state(self.vector)
        job.scratch[_PERSONAL] = saved_model(job, self.initial)

    def personalise_stacked(self, jobs: Sequence[ClientJob]) -> Any:
        """w^t for every client at once; each client's v_k to the client half via scratch."""
        for job in jobs:
            job.scratch[_PERSONAL] = saved_model(job, self.initial)
        return super().personalise_stacked(jobs)

    def prepare_eval(self, job: ClientJob) -> None:
        """The client's personal model v_k."""
        job.flat.load_state(saved_model(job, self.initial))

    def prepare_global_eval(self, job: ClientJob) -> bool:
        """The global model w^t."""
        job.flat.load_state(self.vector)
        return True

    def shared_body(self, jobs: Sequence[ClientJob]) -> None:
        """Every client is evaluated with its own personal model: one forward each."""
        return None


class DittoClient(ClientHalf[DittoParams]):
    """Per round: s epochs on v_k with (λ/2)‖v_k − w^t‖², then FedAvg's local update of w^t.

    v_k is a model the client keeps in its state (``MODEL_KEY``); the round's model (uploaded) is the
    locally updated global model w_k, whose loss and steps are the ones reported, as FedAvg's.
    """

    def phases(self, job: ClientJob) -> list[Phase]:
        # v_k from the broadcast; with another server half (algorithm.client="ditto"): its own or w^t.
        personal = Phase(
            epochs=self.params.personal_epochs,
            loss=self.proximal if self.params.lam else None,
            needs_start=bool(self.params.lam),
            model=MODEL_KEY,
            start=job.scratch.get(_PERSONAL),
            reports=False,
        )
        return [personal, Phase(epochs=job.train.local_epochs)]

    def proximal(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """(λ/2)‖v_k − w^t‖² (Eq. 1), w^t = the round's starting model."""
        return proximal_term(list(params), constants["start"], self.params.lam)


class DittoServer(FedAvgServer):
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
    label="Ditto",
)
