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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.common.cluster_state import ClusterModelState
from rayfed.algorithms.contributions import WeightedSum
from rayfed.algorithms.hooks import Broadcast, ClientHalf, Contribution, RoundContext, ServerHalf
from rayfed.algorithms.registry import register_algorithm
from rayfed.models import build_model, seeded_init
from rayfed.train.evaluate import model_losses
from rayfed.train.flat import FlatModel
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from rayfed.train.scratch import ScratchKey
from rayfed.util.documented import documented, section
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check_int

__all__ = ["IFCAParams", "ClusterSums", "IFCAModels", "IFCAServer", "cluster_losses", "choose_cluster"]

CLUSTER_INIT_STREAM = 1 << 40
"""Cluster j > 0 starts from ``init_seed(seed, CLUSTER_INIT_STREAM + j)``, a stream apart from
the per-architecture and per-client ones (:mod:`rayfed.train.problem`, :mod:`rayfed.algorithms.local`)."""

_CHOICE = ScratchKey[int]("ifca.cluster")
"""``job.scratch`` key of the cluster the client chose in :meth:`IFCAModels.personalise`."""


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


def cluster_losses(jobs: Sequence[ClientJob], models: np.ndarray) -> np.ndarray:
    """F_i(θ_j) of every client i of ``jobs`` (clients of one architecture) for every cluster j, (C, k): the mean
    cross-entropy of model j on the client's training data, the k models as one stack over every client's data
    (:func:`~rayfed.train.evaluate.model_losses`); NaN for a client without training data."""
    x = torch.cat([job.x_train for job in jobs]) if len(jobs) > 1 else jobs[0].x_train
    y = torch.cat([job.y_train for job in jobs]) if len(jobs) > 1 else jobs[0].y_train
    return model_losses(jobs[0].flat, jobs[0].architecture, models, x, y, [job.num_train for job in jobs])


def choose_cluster(losses: np.ndarray) -> int:
    """ĵ = argmin_j F_i(θ_j) (the lowest index on a tie)."""
    return int(np.argmin(losses))


# --- what a client uploads ----------------------------------------------------------------------


@dataclass
class ClusterSums(Contribution):
    """Per chosen cluster j, the :class:`WeightedSum` Σ n_i θ̃_i, Σ n_i of its clients; ``+`` adds per cluster.

    ``client_ids`` and ``clusters`` list who chose which cluster (one index per upload).
    """

    sums: dict[int, WeightedSum]
    client_ids: np.ndarray
    clusters: np.ndarray

    @classmethod
    def of(cls, cluster: int, vector: np.ndarray, client_id: int, size: float) -> ClusterSums:
        """One client's upload: its trained model in its cluster's slot."""
        return cls(
            {cluster: WeightedSum.of(vector, size)}, np.array([client_id], np.int64), np.array([cluster], np.int64)
        )

    def __add__(self, other: ClusterSums) -> ClusterSums:
        sums = dict(self.sums)
        for cluster, part in other.sums.items():
            sums[cluster] = sums[cluster] + part if cluster in sums else part
        return ClusterSums(
            sums, np.concatenate([self.client_ids, other.client_ids]), np.concatenate([self.clusters, other.clusters])
        )

    @property
    def count(self) -> int:
        return len(self.client_ids)

    @property
    def nbytes(self) -> int:
        """The models (and weights), plus a client id and a cluster index per client."""
        return sum(s.nbytes for s in self.sums.values()) + int(self.client_ids.nbytes) + int(self.clusters.nbytes)

    def is_finite(self) -> bool:
        return all(s.is_finite() for s in self.sums.values())


# --- the broadcast and the server ---------------------------------------------------------------


@dataclass(frozen=True)
class IFCAModels(Broadcast):
    """The k cluster models (k, S), each client's last chosen cluster (M,; −1 = never) and the most chosen one."""

    models: np.ndarray
    assignment: np.ndarray
    default_cluster: int
    eval_needs_train = True  # evaluation picks the cluster by training loss too, as personalise does

    def personalise(self, job: ClientJob) -> None:
        """ĵ = argmin_j F_i(θ_j) on the client's training data; θ ← θ_ĵ."""
        job.flat.load_state(self.models[self._choose([job])[0]])

    def personalise_stacked(self, jobs: Sequence[ClientJob]) -> Any:
        """Every client's cluster chosen at once (the k models weighed on all their training data together), and
        their starting models."""
        return to_device([self.models[self._choose(jobs)]], jobs[0].device)[0]

    def _choose(self, jobs: Sequence[ClientJob]) -> list[int]:
        """Each client's ĵ (the known cluster of a client without training data), also kept in its scratch."""
        losses = cluster_losses(jobs, self.models)
        clusters = []
        for job, row in zip(jobs, losses):
            cluster = choose_cluster(row) if job.num_train else self._known_cluster(job.client_id)
            job.scratch[_CHOICE] = cluster
            clusters.append(cluster)
        return clusters

    def _known_cluster(self, client_id: int) -> int:
        known = int(self.assignment[client_id]) if client_id >= 0 else -1
        return known if known >= 0 else self.default_cluster

    def contribute(self, job: ClientJob) -> ClusterSums:
        return ClusterSums.of(job.scratch[_CHOICE], job.flat.state_numpy(), job.client_id, job.num_train)

    def prepare_eval(self, job: ClientJob) -> None:
        """The model of the client's cluster, chosen by training loss as in :meth:`personalise` (the
        engine's evaluation jobs carry the train split, :attr:`eval_needs_train`); a job without
        training data gets the cluster the client chose when it last trained."""
        self.personalise(job)

    def bytes_down(self, job: ClientJob) -> int:
        """All k models."""
        return int(self.models.nbytes)


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

    def aggregate(self, ctx: RoundContext, contribution: ClusterSums | None) -> dict[str, float]:
        if contribution is None:
            return {"clients_aggregated": 0.0}
        # New arrays, so broadcasts already handed out (and Ray's zero-copy reads) stay valid.
        models, assignment = self.models.copy(), self.assignment.copy()
        for cluster, weighted in contribution.sums.items():
            models[cluster] = weighted.average()
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
    client=ClientHalf,
    summary="IFCA (Ghosh et al. 2020): k cluster models; each client trains the one with its lowest training loss, "
    "the server averages per cluster",
    label=lambda params: f"IFCA (k={params.num_clusters})",
)
