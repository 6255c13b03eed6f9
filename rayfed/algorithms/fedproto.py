"""FedProto: clients exchange class prototypes (mean embeddings) instead of models.

Tan, Long, Liu, Zhou, Lu, Jiang and Zhang, "FedProto: Federated Prototype Learning across
Heterogeneous Clients", AAAI 2022, arXiv:2105.00243. See docs/algorithms.md, FedProto section.

Client i keeps its own model (any architecture; only the width d of the features that feed
the output layer must agree). An embedding f_i(x) is that penultimate feature vector.

* Local prototypes: C_i^(j) = mean of f_i(x) over the client's training samples of
  class j, computed with the trained model (eval mode) after local training.
* Global prototypes, over the clients that uploaded class j this round (``aggregation``):
  ``client_mean`` (default, the authors' code ``lib/utils.py::proto_aggregation``):
  C̄^(j) = (1/|N_j|) Σ_{i∈N_j} C_i^(j), every client's class mean counting once;
  ``count``: C̄^(j) = Σ_i |D_i,j| C_i^(j) / Σ_i |D_i,j|, weighted by the class counts.
  A class nobody uploaded keeps its last prototype.
* Local objective: CE(F_i(x), y) + λ · MSE(f_i(x), C̄^(y)), the MSE taken, as in
  the code, as the mean over the batch's B × d entries, with samples whose class has no
  global prototype yet contributing 0 (the first round is plain CE). λ = 1 by default.

Evaluation (``inference``): ``model`` (default) uses the client's own model and classifier;
``prototype`` is the paper's inference, the class of the nearest global prototype,
argmin_j ‖f_i(x) − C̄^(j)‖² = argmax_j (2 C̄^(j)·f_i(x) − ‖C̄^(j)‖²), which is a linear layer,
so it is evaluated by loading W = 2C̄, b = −‖C̄‖² into the output layer. As in the authors'
``test_inference_new_het_lt``, only the classes the client holds (in its training split) and
that have a global prototype are candidates; the others are never predicted. The reported
loss is the cross-entropy of these logits.

Traffic: up, one prototype (d floats) and its count per class the client holds; down, the
global prototypes (d floats per class that has one) and a presence byte per class. Models
stay in the client state store (like local training); each starts from its own random
initialisation drawn from (run seed, client id).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rayfed.algorithms.common.class_counts import class_counts
from rayfed.algorithms.common.own_models import ClientInit, own_model_state, save_model_state
from rayfed.algorithms.declarations import VaryingWork
from rayfed.algorithms.fedproto_private import FEDPROTO_PARTS, private_prototypes, prototype_parts
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.private_uploads import PartwiseClient, PartwiseUpload, PrivateParts
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.evaluate import features_before_output
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.validation import check_choice, check_real

__all__ = [
    "FedProtoParams",
    "ClassSums",
    "class_sums",
    "prototype_loss",
    "FedProtoMessage",
    "FedProtoClient",
    "FedProtoServer",
    "feature_dim",
]

ABSENT_LOGIT = -1e9
"""Bias of a class without a global prototype in prototype inference: never the argmax."""


@section("algorithm.params")
@dataclass(frozen=True)
class FedProtoParams:
    """Hyper-parameters of FedProto (``algorithm.params.*``)."""

    lam: float = documented(1.0, "λ, weight of the prototype MSE in the local loss (1, the usual value).")
    inference: Literal["model", "prototype"] = documented(
        "model", "model: the client's own classifier (default); prototype: nearest global prototype (the paper)."
    )
    aggregation: Literal["client_mean", "count"] = documented(
        "client_mean",
        "client_mean: plain mean of the clients' class means (authors' code); count: weighted by "
        "the clients' class counts.",
    )

    def __post_init__(self) -> None:
        check_real("algorithm.params.lam", self.lam, low=0)
        check_choice("algorithm.params.inference", self.inference, ("model", "prototype"))
        check_choice("algorithm.params.aggregation", self.aggregation, ("client_mean", "count"))


# --- the equations ----------------------------------------------------------------------------


@dataclass
class ClassSums(Contribution):
    """Per class j, over the uploading clients i: the sums Σ_i |D_i,j| C_i^(j) and Σ_i |D_i,j| (for
    ``aggregation=count``) and Σ_i C_i^(j) and |N_j| (for ``client_mean``); one client's upload
    (:meth:`of_client`) derives the last two from its own sums, so the bytes sent do not change."""

    sums: Any
    """(K, d) float32: Σ_i Σ_{x ∈ D_i,j} f_i(x)."""
    counts: Any
    """(K,) float64: Σ_i |D_i,j|."""
    mean_sums: Any
    """(K, d) float32: Σ_i C_i^(j), the sum of the clients' own class means."""
    clients: Any
    """(K,) float64: |N_j|, how many of the clients hold class j."""
    sent: int = 0
    """Class prototypes the clients sent (one per class each holds)."""

    @classmethod
    def of_client(cls, sums: torch.Tensor, counts: torch.Tensor, held: np.ndarray) -> ClassSums:
        """One client's upload from its class sums and counts (:func:`class_sums`, on its device); ``held`` (K,)
        marks the classes of its training split (known on the host)."""
        present = counts > 0
        means = torch.where(present[:, None], sums / torch.where(present, counts, 1.0).float()[:, None], 0.0)
        return cls(sums, counts, means, present.double(), int(np.count_nonzero(held)))

    def __add__(self, other: ClassSums) -> ClassSums:
        return ClassSums(
            self.sums + other.sums,
            self.counts + other.counts,
            self.mean_sums + other.mean_sums,
            self.clients + other.clients,
            self.sent + other.sent,
        )

    def prototypes(self, aggregation: str = "client_mean") -> tuple[np.ndarray, np.ndarray]:
        """(C̄ (K, d), present (K,)): each seen class's mean of the clients' class means (``client_mean``)
        or its count-weighted mean embedding (``count``)."""
        present = self.counts > 0
        protos = np.zeros_like(self.sums)
        if aggregation == "count":
            protos[present] = self.sums[present] / self.counts[present, None].astype(np.float32)
        else:
            protos[present] = self.mean_sums[present] / self.clients[present, None].astype(np.float32)
        return protos, present

    @property
    def nbytes(self) -> int:
        """A prototype (d floats) and its count per class sent, and a presence byte per class."""
        return self.sent * (self.sums.shape[1] * 4 + 8) + self.counts.shape[0]


def class_sums(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ f(x) per class (K, d) and the class counts (K,, float64) of a set of embeddings (a local prototype before
    dividing), on their device."""
    sums = torch.zeros(num_classes, features.shape[1], dtype=torch.float32, device=features.device)
    sums.index_add_(0, labels, features.float())
    counts = class_counts(labels, num_classes)
    return sums, counts


def prototype_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    present: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """MSE(f(x), C̄^(y)) over the batch's B × d entries (of its samples of weight 1, when ``weight`` marks
    padding); a sample whose class has no prototype adds 0."""
    mask = present[labels].to(features.dtype).unsqueeze(1)
    if weight is None:
        return ((features - prototypes[labels]) ** 2 * mask).sum() / features.numel()
    entries = weight.sum().clamp_min(1.0) * features.shape[1]
    return ((features - prototypes[labels]) ** 2 * (mask * weight.unsqueeze(1))).sum() / entries


# --- worker side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FedProtoMessage:
    """The global prototypes (K, d) and which classes have one; each client keeps its own model."""

    prototypes: np.ndarray
    present: np.ndarray
    init: ClientInit


class FedProtoClient(VaryingWork, ClientHalf[FedProtoParams, FedProtoMessage], PartwiseClient):
    """Its own model; SGD on CE + λ·MSE(embedding, global prototype); keeps the model and sends its class sums of
    embeddings over the training split (eval mode)."""

    def start(self, message: FedProtoMessage, job: ClientJob) -> Start:
        return Start(own_model_state(job, message.init))

    def phases(self, message: FedProtoMessage, job: ClientJob) -> list[Phase]:
        if not self.params.lam or not message.present.any():  # the first round: plain CE
            return super().phases(message, job)
        protos, mask = to_device(
            [np.asarray(message.prototypes, np.float32), np.asarray(message.present, np.float32)], job.device
        )
        return [Phase(epochs=job.train.local_epochs, loss=self.pull, constants={"prototypes": protos, "present": mask})]

    def pull(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """λ·MSE(f(x), C̄^(y)) over the batch."""
        assert out.features is not None
        return self.params.lam * prototype_loss(
            out.features, batch.y, constants["prototypes"], constants["present"], batch.weight
        )

    def upload(self, message: FedProtoMessage, job: ClientJob) -> Contribution:
        """Keep the trained model; upload its class sums of embeddings over the training split (eval mode)."""
        save_model_state(job)
        layer = self.spec.output_layer[job.architecture]
        features = torch.cat([f for _, f in features_before_output(job.model, layer, job.x_train)])
        sums, counts = class_sums(features, job.y_train, message.prototypes.shape[0])
        return ClassSums.of_client(sums, counts, np.asarray(job.train_label_counts) > 0)

    def private_parts(self, message: FedProtoMessage, job: ClientJob, upload: Any) -> tuple[Any, ...]:
        """(u_i, r_i) from its upload's class means and counts, with privacy on (:mod:`~.fedproto_private`)."""
        assert isinstance(upload, ClassSums)
        (prototypes,) = to_device([np.asarray(message.prototypes, np.float32)], job.device)
        return prototype_parts(upload.mean_sums, upload.counts, prototypes, self.params.aggregation)

    def evaluation(self, message: FedProtoMessage, job: ClientJob) -> np.ndarray:
        """Its own model; with ``inference="prototype"``, its output layer scores the distance to each global
        prototype of a class it holds (the authors' ``classes_list``)."""
        state = np.array(own_model_state(job, message.init), dtype=np.float32)
        if self.params.inference != "prototype" or not message.present.any():
            return state
        protos = message.prototypes.astype(np.float32)
        candidates = message.present & (np.asarray(job.train_label_counts) > 0)  # the authors' classes_list[idx]
        if not candidates.any():
            candidates = message.present
        weight = np.where(candidates[:, None], 2 * protos, 0).astype(np.float32)
        bias = np.where(candidates, -(protos * protos).sum(axis=1), ABSENT_LOGIT).astype(np.float32)
        state[job.flat.slice_of(self.spec.output_layer[job.architecture])] = np.concatenate([weight.reshape(-1), bias])
        return state

    def bytes_down(self, message: FedProtoMessage, job: ClientJob) -> int:
        """The global prototypes of the classes some client has uploaded so far (none in the first round), and
        which those are."""
        return int(message.present.sum()) * message.prototypes.shape[1] * 4 + message.present.shape[0]


# --- server side ----------------------------------------------------------------------------


def feature_dim(spec: ProblemSpec) -> int:
    """d, the input width of every architecture's output layer; ConfigError if they differ."""
    dims: dict[str, int] = {}
    for arch, layout in spec.layouts.items():
        name = f"{spec.output_layer.get(arch)}.weight"
        if name not in layout.names or len(layout.shapes[layout.names.index(name)]) != 2:
            raise ConfigError(
                f"algorithm.name='fedproto' needs models whose output layer is a linear layer, but model {arch!r} "
                f"has output layer {spec.output_layer.get(arch)!r}"
            )
        dims[arch] = int(layout.shapes[layout.names.index(name)][1])
    if len(set(dims.values())) > 1:
        raise ConfigError(
            f"algorithm.name='fedproto' averages embeddings, so every model must feed its output layer the same "
            f"number of features, but got {dims}; choose models with one feature width"
        )
    return next(iter(dims.values()))


class FedProtoServer(PartwiseUpload, ServerHalf[FedProtoParams, ClassSums]):
    """Keeps the global prototypes C̄ (K, d) and which classes have one. With privacy its clients upload
    :data:`~rayfed.algorithms.fedproto_private.FEDPROTO_PARTS`."""

    upload_parts = FEDPROTO_PARTS

    @classmethod
    def validate(cls, params: FedProtoParams, spec: ProblemSpec) -> None:
        feature_dim(spec)

    def __init__(self, params: FedProtoParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.prototypes = np.zeros((spec.num_classes, feature_dim(spec)), np.float32)
        self.present = np.zeros(spec.num_classes, bool)
        self.init = ClientInit.of(spec)

    def part_sizes(self) -> tuple[int, ...]:
        """The K prototypes' updates and the K class weights (:data:`FEDPROTO_PARTS`)."""
        return self.prototypes.size, self.prototypes.shape[0]

    def broadcast(self) -> FedProtoMessage:
        return FedProtoMessage(self.prototypes, self.present, self.init)

    def aggregate(self, ctx: RoundContext, contribution: ClassSums | PrivateParts) -> dict[str, float]:
        if isinstance(contribution, PrivateParts):  # privacy on: the noised sums of the parts
            aggregation = self.params.aggregation
            self.prototypes, self.present, seen = private_prototypes(
                self.prototypes, self.present, contribution, aggregation
            )
            return {"classes_with_prototype": float(self.present.sum()), "classes_uploaded": float(seen.sum())}
        new, seen = contribution.prototypes(self.params.aggregation)
        self.prototypes = np.where(seen[:, None], new, self.prototypes).astype(np.float32)
        self.present = self.present | seen
        return {"classes_with_prototype": float(self.present.sum()), "classes_uploaded": float(seen.sum())}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"prototypes": self.prototypes, "present": self.present.astype(np.uint8)}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.prototypes = np.array(state["prototypes"], dtype=np.float32)
        self.present = np.array(state["present"]).astype(bool)


register_algorithm(
    "fedproto",
    params=FedProtoParams,
    server=FedProtoServer,
    client=FedProtoClient,
    summary="FedProto (Tan et al. 2022): exchange class prototypes; local CE + lambda MSE to the global prototype",
    keeps_client_state=True,
    reporting=Reporting(label="FedProto"),
)
