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
reported beside it (``prepare_global_eval``), as the paper reports both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rayfed.algorithms.common.body_head import BodyHeadParams, PartialModels, PartialServer, part_phase, split_body_head
from rayfed.algorithms.hooks import Broadcast, ClientHalf, SharedBody
from rayfed.algorithms.registry import register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.phase import Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_int

__all__ = ["FedBabuParams", "FedBabuClient", "FedBabuModels", "FedBabuServer"]


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


@dataclass(frozen=True)
class FedBabuModels(PartialModels):
    """The global body and the fixed initial head h_0; evaluation fine-tunes a copy per client."""

    finetune_epochs: int = 5

    eval_needs_train = True  # the evaluation job carries the client's training split, for the fine-tuning

    def prepare_global_eval(self, job: ClientJob) -> bool:
        """The federated model itself: the global body with the initial head, not fine-tuned."""
        job.flat.load_state(self.model_state(self.initial_local))
        return True

    def shared_body(self, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """Each client fine-tunes the whole model, so no two evaluation models share a body."""
        if self.finetune_epochs:
            return None
        return super().shared_body(jobs)


class FedBabuClient(ClientHalf[FedBabuParams]):
    """Local SGD on the body only; the head stays exactly at h_0 (no step, no weight decay)."""

    def __init__(self, params: FedBabuParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.splits = {arch: split_body_head(spec, arch, params.head_blocks) for arch in spec.layouts}

    def phases(self, job: ClientJob) -> list[Phase]:
        return [part_phase(self.splits[job.architecture].body_params, job.train.local_epochs)]

    def prepare_eval(self, message: Broadcast, job: ClientJob) -> list[Phase]:
        """Global body + h_0, then τ_f epochs of SGD on the whole model over the client's training split.

        The evaluation job's batches come from its own generator (run seed, client id, the evaluation
        round), so the same global model gives the same personalised model on any worker and at every call;
        the client's state is not touched.
        """
        message.prepare_eval(job)
        return [Phase(epochs=self.params.finetune_epochs)] if self.params.finetune_epochs else []


class FedBabuServer(PartialServer):
    """Averages the body; keeps h_0, which every client receives with the body."""

    shared_part = "body"
    keep_local = False

    def broadcast(self) -> FedBabuModels:
        return FedBabuModels(
            self.shared,
            self.initial_local,
            self.split,
            self.shared_part,
            self.keep_local,
            finetune_epochs=self.params.finetune_epochs,
        )


register_algorithm(
    "fedbabu",
    params=FedBabuParams,
    server=FedBabuServer,
    client=FedBabuClient,
    summary="FedBABU (Oh et al. 2022): body trained and averaged, head fixed at init; whole model fine-tuned "
    "at evaluation",
    label="FedBABU",
)
