"""IFCA: the Iterative Federated Clustering Algorithm, model-averaging variant.

Ghosh, Chung, Yin & Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, arXiv:2006.04088. See docs/algorithms.md, IFCA section.

The server keeps k cluster models θ_1..θ_k and broadcasts all of them. One round
(Algorithm 1, "option II: model averaging")::

    worker:  ĵ_i = argmin_j F_i(θ_j)            cluster identity: the lowest loss on its training data
             θ̃_i ← local SGD from θ_ĵ           (the run's local epochs)
             send θ̃_i with ĵ_i
    server:  θ_j ← Σ_{i: ĵ_i = j} n_i θ̃_i / Σ_{i: ĵ_i = j} n_i   for every j some client chose

A cluster no client chose this round keeps its model, so partial participation works as
it is. The clusters start from distinct random initialisations (the paper's experiments
use random initialisation): cluster 0 from the run's common initial model, cluster j > 0
from the model registered for the architecture, drawn from (run seed, j).

The upload is one model plus its cluster index; workers merge uploads into one
:class:`~rayfed.algorithms.contributions.WeightedSum` per cluster (:class:`ClusterSums`).
The download is all k models.

Evaluation uses the model of the client's cluster: chosen by training loss when the
evaluated job carries training data, otherwise the cluster the client chose when it last
trained (the server records it), and for a client that never trained the cluster most
clients chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.common.cluster_state import ClusterModelState
from rayfed.algorithms.contributions import WeightedSum, join
from rayfed.algorithms.declarations import EvaluationReadsTrain
from rayfed.algorithms.hooks import HELD_BY_CLIENTS, ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.models import build_model, seeded_init
from rayfed.train.evaluate import model_losses
from rayfed.train.flat import FlatModel
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check_int

__all__ = ["IFCAParams", "ClusterSums", "IFCAModels", "IFCAClient", "IFCAServer", "cluster_losses", "choose_cluster"]

CLUSTER_INIT_STREAM = 1 << 40
"""Cluster j > 0 starts from ``init_seed(seed, CLUSTER_INIT_STREAM + j)``, a stream apart from
the per-architecture and per-client ones (:mod:`rayfed.train.problem`, :mod:`rayfed.algorithms.local`)."""


@section("algorithm.params")
@dataclass(frozen=True)
class IFCAParams:
    """Hyper-parameters of IFCA (``algorithm.params.*``)."""

    num_clusters: int = documented(
        4,
        "k, the number of cluster models: 4 for MNIST, 2 for CIFAR-10, 8 for CIFAR-100, 2 for AG News in the "
        "cwFedAvg paper's baseline table (P-arXiv Tab. 4).",
    )

    def __post_init__(self) -> None:
        check_int("algorithm.params.num_clusters", self.num_clusters, low=1)


# --- the cluster identity estimate --------------------------------------------------------------


def cluster_losses(job: ClientJob, models: torch.Tensor) -> torch.Tensor:
    """F_i(θ_j) of the client for every cluster j, (k,) on its device: the mean cross-entropy of model j on its
    training data, the k models as one stack (:func:`~rayfed.train.evaluate.model_losses`)."""
    return model_losses(job.flat, job.architecture, models, job.x_train, job.y_train)


def choose_cluster(losses: torch.Tensor) -> torch.Tensor:
    """ĵ = argmin_j F_i(θ_j) (the lowest index on a tie), a 0-d int64 tensor on the losses' device."""
    return torch.argmin(losses)


# --- what a client uploads ----------------------------------------------------------------------


@dataclass
class ClusterSums(Contribution):
    """Per cluster j, Σ n_i θ̃_i and Σ n_i over the clients that chose j (a zero row where none did): a
    :class:`WeightedSum` per cluster, kept as one (k, S) array so that a client's choice, made on its worker's
    device, never reaches the host before the call's one read-back. ``+`` adds per cluster; ``client_ids`` and
    ``clusters`` list who chose which cluster."""

    totals: Any
    """(k, S): Σ n_i θ̃_i per cluster."""
    weights: Any
    """(k,) float64: Σ n_i per cluster."""
    client_ids: np.ndarray
    clusters: Any
    """(uploads,) int64: each upload's cluster."""

    @classmethod
    def of(cls, cluster: torch.Tensor, vector: torch.Tensor, client_id: int, size: float, k: int) -> ClusterSums:
        """One client's upload: its trained model in its cluster's row."""
        onehot = torch.nn.functional.one_hot(cluster, k)
        return cls(
            onehot[:, None].float() * (vector * float(size)),
            onehot.double() * float(size),
            np.array([client_id], np.int64),
            cluster.reshape(1),
        )

    def __add__(self, other: ClusterSums) -> ClusterSums:
        return ClusterSums(
            self.totals + other.totals,
            self.weights + other.weights,
            np.concatenate([self.client_ids, other.client_ids]),
            join(self.clusters, other.clusters),
        )

    @property
    def count(self) -> int:
        return len(self.client_ids)

    @property
    def nbytes(self) -> int:
        """What the sum carries: a model and a weight per cluster chosen, an id and a cluster per upload (a
        client's upload: its model in its cluster's row)."""
        weights = self.weights
        chosen = (
            int(np.count_nonzero(weights > 0)) if isinstance(weights, np.ndarray) else min(self.count, len(weights))
        )
        return chosen * (int(self.totals.shape[1]) * 4 + 8) + self.count * 16


# --- the message and the client -------------------------------------------------------------------


@dataclass(frozen=True)
class IFCAModels:
    """The k cluster models (k, S), each client's last chosen cluster (M,; −1 = never) and the most chosen one."""

    models: np.ndarray
    assignment: np.ndarray = field(metadata=HELD_BY_CLIENTS)
    default_cluster: int


@dataclass
class ClusterStart(Start):
    """A client's start: the model of the cluster it chose, and that cluster (a 0-d tensor on its device)."""

    cluster: Any = None


class IFCAClient(ClientHalf[Any, IFCAModels], EvaluationReadsTrain):
    """Picks ĵ = argmin_j F_i(θ_j) on its training data (on the device), trains θ_ĵ and sends it in ĵ's row.
    Evaluated with the cluster it picks so on the evaluation job (which carries the training split)."""

    def __init__(self, params: Any, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self._models: tuple[int, torch.Tensor] | None = None

    def _on_device(self, message: IFCAModels, device: torch.device) -> torch.Tensor:
        """The message's k models on ``device``, moved once per message."""
        if self._models is None or self._models[0] != id(message.models) or self._models[1].device != device:
            self._models = (id(message.models), to_device([message.models], device)[0])
        return self._models[1]

    def start(self, message: IFCAModels, job: ClientJob) -> ClusterStart:
        """ĵ = argmin_j F_i(θ_j) on the client's training data; θ ← θ_ĵ. A client without training data takes the
        cluster it chose when it last trained (the most chosen one if it never did)."""
        models = self._on_device(message, job.device)
        if job.num_train:
            cluster = choose_cluster(cluster_losses(job, models))
        else:
            known = int(message.assignment[job.client_id]) if job.client_id >= 0 else -1
            cluster = to_device([np.array(known if known >= 0 else message.default_cluster)], job.device)[0]
        return ClusterStart(models.index_select(0, cluster.reshape(1))[0], cluster)  # models[cluster] would sync

    def upload(self, message: IFCAModels, job: ClientJob) -> Contribution:
        start: ClusterStart = job.start
        state = job.trained
        return ClusterSums.of(start.cluster, state, job.client_id, job.num_train, len(message.models))


def cluster_initialisation(spec: ProblemSpec, architecture: str, cluster: int) -> np.ndarray:
    """Cluster ``cluster``'s own random initial state, drawn from (run seed, cluster) with torch's
    global generator forked, so the caller's random stream is untouched."""
    with seeded_init(init_seed(spec.seed, CLUSTER_INIT_STREAM + cluster)):
        module = build_model(architecture, spec.input_shape, spec.num_classes)
    return FlatModel(module).state_numpy()


class IFCAServer(ClusterModelState, ServerHalf[IFCAParams, ClusterSums]):
    """Keeps the k cluster models and the cluster each client last chose."""

    @classmethod
    def validate(cls, params: IFCAParams, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    def __init__(self, params: IFCAParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        architecture = sole_architecture(spec)
        first = np.asarray(initial[architecture], dtype=np.float32)
        others = [cluster_initialisation(spec, architecture, j) for j in range(1, params.num_clusters)]
        self.models = np.stack([first, *others]).astype(np.float32, copy=False)
        self.assignment = np.full(spec.num_clients, -1, dtype=np.int64)

    def broadcast(self) -> IFCAModels:
        return IFCAModels(self.models, self.assignment, self._most_chosen())

    def _most_chosen(self) -> int:
        chosen = self.assignment[self.assignment >= 0]
        return int(np.bincount(chosen, minlength=len(self.models)).argmax()) if len(chosen) else 0

    def aggregate(self, ctx: RoundContext, contribution: ClusterSums) -> dict[str, float]:
        # New arrays, so broadcasts already handed out (and Ray's zero-copy reads) stay valid.
        models, assignment = self.models.copy(), self.assignment.copy()
        for cluster in np.flatnonzero(contribution.weights > 0):
            models[cluster] = WeightedSum(contribution.totals[cluster], float(contribution.weights[cluster])).average()
        assignment[contribution.client_ids] = contribution.clusters
        self.models, self.assignment = models, assignment
        counts = np.bincount(contribution.clusters, minlength=len(models))
        return {
            "clients_aggregated": float(contribution.count),
            "ifca_clusters_chosen": float((counts > 0).sum()),
            "ifca_largest_cluster_share": float(counts.max() / counts.sum()),
        }


register_algorithm(
    "ifca",
    params=IFCAParams,
    server=IFCAServer,
    client=IFCAClient,
    summary="IFCA (Ghosh et al. 2020): k cluster models; each client trains the one with its lowest training loss, "
    "the server averages per cluster",
    reporting=Reporting(label=lambda params: f"IFCA (k={params.num_clusters})"),
)
