"""FedRep: a shared representation learned by alternating head and body updates.

Collins, Hassani, Mokhtari & Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021, arXiv:2102.07078. See docs/algorithms.md,
FedRep section.

The model is a representation φ (the body) and a head h_i (the last ``head_blocks``
top-level blocks). Round t, client i (Algorithm 1):

    h_i ← τ_h epochs of SGD on the head, body frozen at the server's φ^t        (Alg. 1, line 6)
    φ_i ← τ_b epochs of SGD on the body, head frozen at the new h_i             (Alg. 1, line 7)
    server:  φ^{t+1} ← Σ_i n_i φ_i / Σ_i n_i                                    (Alg. 1, line 10)

The paper averages φ_i with equal weights over the sampled clients; here they are weighted
by n_i, as FedAvg and PFLlib's FedRep do (equal when clients hold equal data). The head
never leaves the client (client state store); a client that has not trained yet holds the
common initialisation. Evaluation: φ with the client's own head.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfed.algorithms.common.body_head import (
    BodyHeadParams,
    PartialClient,
    PartialModels,
    PartialServer,
    part_phase,
    split_body_head,
)
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.phase import Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_int, fail

__all__ = ["FedRepParams", "FedRepClient", "FedRepServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class FedRepParams(BodyHeadParams):
    """Hyper-parameters of FedRep (``algorithm.params.*``)."""

    head_epochs: int = documented(
        10, "τ_h: local epochs on the head per round, body frozen (10 in the paper's experiments)."
    )
    body_epochs: int = documented(
        1, "τ_b: local epochs on the body per round, head frozen (1 in the paper's experiments)."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("algorithm.params.head_epochs", self.head_epochs, low=0)
        check_int("algorithm.params.body_epochs", self.body_epochs, low=0)
        if self.head_epochs + self.body_epochs == 0:
            fail("algorithm.params.body_epochs", 0, ">= 1 while head_epochs=0: the clients would train nothing")


class FedRepClient(PartialClient):
    """τ_h epochs on the head, then τ_b epochs on the body (train.local_epochs is not used); a part with 0 epochs
    is left out. With the head the output layer, the loop trains it on the body's features computed once (the
    same steps up to float rounding: FedRep's 10 head epochs cost about one forward of the body)."""

    params: FedRepParams

    def __init__(self, params: FedRepParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.splits = {arch: split_body_head(spec, arch, params.head_blocks) for arch in spec.layouts}

    def phases(self, message: PartialModels, job: ClientJob) -> list[Phase]:
        split = self.splits[job.architecture]
        parts = ((split.head_params, self.params.head_epochs), (split.body_params, self.params.body_epochs))
        return [part_phase(part, epochs) for part, epochs in parts if epochs]


class FedRepServer(PartialServer):
    """Averages the body (the representation); heads stay with their clients."""

    shared_part = "body"
    keep_local = True


register_algorithm(
    "fedrep",
    params=FedRepParams,
    server=FedRepServer,
    client=FedRepClient,
    summary="FedRep (Collins et al. 2021): head trained tau_h epochs, then body tau_b epochs; body averaged",
    keeps_client_state=True,
    reporting=Reporting(label="FedRep"),
)
