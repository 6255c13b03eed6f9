"""FedBABU: only the body is trained and averaged; the head is fine-tuned at evaluation.

Oh, Kim & Yun, "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022, arXiv:2106.06042. See docs/algorithms.md, FedBABU section.

The head (the last ``head_blocks`` top-level blocks) keeps the common random
initialisation h_0 for the whole federated training; clients update only the body
(Algorithm 1, "BodyUpdate"):

    client:  θ_body ← train.local_epochs epochs of SGD on the body, head frozen at h_0
    server:  θ_body ← Σ_i n_i θ_body,i / Σ_i n_i       (FedAvg on the body; the head is never sent)

Personalisation happens at evaluation only (§4, "fine-tuning"): each client starts from
the global body and h_0, fine-tunes the *whole* model for τ_f epochs on its own training
split, and is evaluated on its test split. The fine-tuned model is thrown away (the
client keeps no state), so every evaluation starts again from the global model, as the
paper evaluates personalisation. The global model (body + h_0, without fine-tuning) is
reported beside it (``global_model``), as the paper reports both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayfed.algorithms.common.body_head import (
    BodyHeadParams,
    PartialClient,
    PartialModels,
    PartialServer,
    part_phase,
    split_body_head,
)
from rayfed.algorithms.declarations import EvaluationReadsTrain, SharedBody
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.phase import Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_int

__all__ = ["FedBabuParams", "FedBabuClient", "FedBabuServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class FedBabuParams(BodyHeadParams):
    """Hyper-parameters of FedBABU (``algorithm.params.*``)."""

    finetune_epochs: int = documented(
        5,
        "τ_f: epochs of whole-model fine-tuning on the client's training split before each evaluation "
        "(5 in the paper's personalisation tables; PFLlib's default is 10); 0 evaluates the global model as is.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("algorithm.params.finetune_epochs", self.finetune_epochs, low=0)


class FedBabuClient(PartialClient, EvaluationReadsTrain):
    """Local SGD on the body only; the head stays exactly at h_0 (no step, no weight decay). Evaluated after
    fine-tuning the whole model on its training split, which evaluation jobs carry."""

    def __init__(self, params: FedBabuParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.splits = {arch: split_body_head(spec, arch, params.head_blocks) for arch in spec.layouts}

    def phases(self, message: PartialModels, job: ClientJob) -> list[Phase]:
        return [part_phase(self.splits[job.architecture].body_params, job.train.local_epochs)]

    def fine_tuning(self, message: PartialModels, job: ClientJob) -> list[Phase]:
        """τ_f epochs of SGD on the whole model (global body + h_0) over the client's training split.

        The evaluation job's batches come from its own generator (run seed, client id, the evaluation round), so
        the same global model gives the same personalised model on any worker and at every call; the client's
        state is not touched.
        """
        epochs = self.params.finetune_epochs
        return [Phase(epochs=epochs)] if epochs else []

    def global_model(self, message: PartialModels, job: ClientJob) -> np.ndarray:
        """The federated model itself: the global body with the initial head, not fine-tuned."""
        return message.model_state(message.initial_local)

    def shared_body(self, message: PartialModels, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """Each client fine-tunes the whole model, so no two evaluation models share a body."""
        if self.params.finetune_epochs:
            return None
        return super().shared_body(message, jobs)


class FedBabuServer(PartialServer):
    """Averages the body; keeps h_0, which every client receives with the body."""

    shared_part = "body"
    keep_local = False


register_algorithm(
    "fedbabu",
    params=FedBabuParams,
    server=FedBabuServer,
    client=FedBabuClient,
    summary="FedBABU (Oh et al. 2022): body trained and averaged, head fixed at init; whole model fine-tuned "
    "at evaluation",
    reporting=Reporting(label="FedBABU"),
)
