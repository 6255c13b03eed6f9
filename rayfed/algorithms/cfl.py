"""CFL: clustered federated learning by recursive bipartition of the clients' updates.

Sattler, Müller & Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multi-Task Optimization under Privacy Constraints", IEEE TNNLS 2020, arXiv:1910.01991.
See docs/algorithms.md, CFL section.

The server keeps a partition of the clients into clusters and one model per cluster.
One round::

    worker:  θ_i ← θ_{c(i)};  Δθ_i ← SGD(θ_i) − θ_{c(i)};  send Δθ_i
    server:  for each cluster c with uploads U_c:
                 Δθ_c = Σ_{i∈U_c} n_i Δθ_i / Σ_{i∈U_c} n_i                (the cluster's mean update)
                 if ‖Δθ_c‖ < ε₁ and max_{i∈U_c} ‖Δθ_i‖ > ε₂                (Alg. 1: stationary for the
                    (and round ≥ warm-up, |U_c| ≥ min_cluster_clients):      cluster, not for its clients)
                     α_ij = ⟨Δθ_i, Δθ_j⟩ / (‖Δθ_i‖ ‖Δθ_j‖)                 (cosine similarity)
                     c₁, c₂ = argmin_{c₁∪c₂=U_c} max_{i∈c₁, j∈c₂} α_ij     (optimal bipartition)
             θ_c ← θ_c + Δθ_c for every cluster after the splits

The criterion's norms are those of the weight updates by default, as the authors' code and the
cwFedAvg papers' thresholds have them. Their scale is that of the optimiser: an epoch of plain SGD
moves a client by Δθ_i = −η Σ_k g_ik, so ‖Δθ_i‖ grows with the learning rate η, the steps s_i
(the client's data over the batch size) and, with momentum m, by 1/(1 − m). ``norms="gradient"``
takes P-CFL's criterion in its own terms, the norms of the clients' gradients: each update is
divided by its step length λ_i = η s_i / (1 − m), which gives the mean gradient ḡ_i = −Δθ_i/λ_i of
the client's epoch (exactly for plain SGD), and the cluster's is Σ n_i ḡ_i / Σ n_i. Thresholds in
gradient units carry over between optimisers and datasets; the similarities, being cosines, are
the same either way.

A split cluster's two parts both start from its model; each then adds its own members'
mean update in the same round (as the authors' reference code aggregates after
clustering). Norms and similarities are over the model's parameters; buffers (BatchNorm
statistics) are averaged with the parameters, FedAvg-style.

The optimal bipartition (the paper's Algorithm 2) merges clients in order of decreasing
similarity until two groups remain: single linkage, i.e. cutting the weakest edge of a
maximum spanning tree, which is exactly the minimiser of the largest cross similarity.
``linkage="complete"`` uses complete-linkage agglomeration instead, as the authors' code
does (it is not guaranteed to reach that minimum).

Partial participation works: a cluster's criterion and bipartition use its clients that
uploaded this round; its members that sat out stay in the part that keeps the cluster's
id (the part with more training samples), and a cluster without uploads keeps its model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.common.cluster_state import ClusterModelState
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.batches import steps_per_epoch
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_int, check_real

__all__ = [
    "CFLParams",
    "ClientUpdates",
    "ClusterModels",
    "CFLClient",
    "CFLServer",
    "cosine_similarity_matrix",
    "update_norms",
    "split_criterion",
    "bipartition",
    "max_cross_similarity",
    "step_length",
]

_PATH = "algorithm.params."
LINKAGES = ("single", "complete")
NORMS = ("update", "gradient")


@section("algorithm.params")
@dataclass(frozen=True)
class CFLParams:
    """Hyper-parameters of CFL (``algorithm.params.*``)."""

    eps1: float = documented(
        0.4,
        "ε₁: a cluster may split only when the norm of its clients' weighted mean update is below it (the cluster "
        "is near a stationary point); 0.4 as in the cwFedAvg paper's baseline table (P-arXiv Tab. 4).",
    )
    eps2: float = documented(
        0.9,
        "ε₂: ... and the largest norm of a single client's update is above it (some client is not stationary); "
        "0.9 as in the cwFedAvg paper's baseline table (P-arXiv Tab. 4).",
    )
    warmup_rounds: int = documented(
        20, "No split before this round (0-based); the authors' code clusters only after round 20."
    )
    min_cluster_clients: int = documented(
        3, "A cluster splits only if at least this many of its clients uploaded this round (the authors' code: > 2)."
    )
    linkage: Literal["single", "complete"] = documented(
        "single",
        "single: the paper's optimal bipartition (Alg. 2, min over bipartitions of the max cross-cluster cosine "
        "similarity); complete: complete-linkage agglomeration into two groups, as the authors' code.",
    )
    norms: Literal["update", "gradient"] = documented(
        "update",
        "update: ε₁ and ε₂ bound the norms of the weight updates, as the authors' code and the cwFedAvg papers "
        "(their scale grows with lr, steps and momentum); gradient: the norms of the clients' mean gradients "
        "Δθ_i / (lr · steps / (1 − momentum)), P-CFL's criterion, the same for any optimiser (module docstring).",
    )

    def __post_init__(self) -> None:
        check_real(_PATH + "eps1", self.eps1, low=0)
        check_real(_PATH + "eps2", self.eps2, low=0)
        check_int(_PATH + "warmup_rounds", self.warmup_rounds, low=0)
        check_int(_PATH + "min_cluster_clients", self.min_cluster_clients, low=2)
        check_choice(_PATH + "linkage", self.linkage, LINKAGES)
        check_choice(_PATH + "norms", self.norms, NORMS)


# --- the paper's equations as pure functions ----------------------------------------------------


def cosine_similarity_matrix(updates: np.ndarray) -> np.ndarray:
    """α_ij = ⟨Δθ_i, Δθ_j⟩ / (‖Δθ_i‖ ‖Δθ_j‖) for the (M, P) rows, as one (M, M) float64 product.

    A zero update has similarity 0 with every other (and with itself).
    """
    rows = np.asarray(updates, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1)
    unit = rows / np.where(norms > 0, norms, 1.0)[:, None]
    return unit @ unit.T


def update_norms(updates: np.ndarray, sizes: np.ndarray) -> tuple[float, float]:
    """(‖Σ_i n_i Δθ_i / Σ_i n_i‖, max_i ‖Δθ_i‖): the two norms of CFL's split criterion."""
    rows = np.asarray(updates, dtype=np.float64)
    weights = np.asarray(sizes, dtype=np.float64)
    mean = weights @ rows / weights.sum() if weights.sum() > 0 else rows.mean(axis=0)
    return float(np.linalg.norm(mean)), float(np.linalg.norm(rows, axis=1).max())


def step_length(lr: float, steps: int, momentum: float) -> float:
    """λ = η s / (1 − m): how far s steps of SGD at learning rate η with momentum m carry a constant gradient of
    norm 1, so that −Δθ / λ is the mean gradient of the steps (exactly without momentum).

    >>> step_length(0.005, 200, 0.0), round(step_length(0.1, 7, 0.9), 9)
    (1.0, 7.0)
    """
    return lr * steps / (1.0 - momentum)


def split_criterion(mean_norm: float, max_norm: float, eps1: float, eps2: float) -> bool:
    """The paper's condition to split a cluster: ‖Δθ_c‖ < ε₁ and max_i ‖Δθ_i‖ > ε₂."""
    return mean_norm < eps1 and max_norm > eps2


def max_cross_similarity(similarity: np.ndarray, part: np.ndarray) -> float:
    """α_cross^max = max_{i∈c₁, j∈c₂} α_ij for the bipartition given by the boolean mask ``part`` (c₂)."""
    return float(similarity[np.ix_(~part, part)].max())


def _find(parent: np.ndarray, i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = int(parent[i])
    return i


def _single_linkage(similarity: np.ndarray) -> np.ndarray:
    """The paper's Algorithm 2: merge the groups of the most similar pairs first, stop at two groups."""
    m = len(similarity)
    parent = np.arange(m)
    upper = np.triu_indices(m, k=1)
    order = np.argsort(-similarity[upper], kind="stable")
    groups = m
    for k in order:
        if groups == 2:
            break
        a, b = _find(parent, int(upper[0][k])), _find(parent, int(upper[1][k]))
        if a != b:
            parent[max(a, b)] = min(a, b)
            groups -= 1
    roots = np.array([_find(parent, i) for i in range(m)])
    return roots != roots[0]


def _complete_linkage(similarity: np.ndarray) -> np.ndarray:
    """Agglomerate by complete linkage (group similarity = its least similar pair) until two groups remain."""
    m = len(similarity)
    linkage = np.array(similarity, dtype=np.float64)
    np.fill_diagonal(linkage, -np.inf)
    label = np.arange(m)
    alive = np.ones(m, dtype=bool)
    for _ in range(m - 2):
        masked = np.where(np.outer(alive, alive), linkage, -np.inf)
        a, b = sorted(np.unravel_index(int(np.argmax(masked)), masked.shape))
        merged = np.minimum(linkage[a], linkage[b])
        linkage[a, :], linkage[:, a] = merged, merged
        linkage[a, a] = -np.inf
        alive[b] = False
        label[label == b] = a
    return label != label[0]


def bipartition(similarity: np.ndarray, sizes: np.ndarray, linkage: str = "single") -> np.ndarray:
    """Split the clients of one cluster into two groups by their update similarities.

    ``single`` gives argmin_{c₁∪c₂} max_{i∈c₁, j∈c₂} α_ij (the paper's optimal bipartition,
    Alg. 2); ``complete`` complete-linkage agglomeration into two groups. Returns a boolean
    mask of the clients that leave: the group with fewer training samples (``sizes``; on a
    tie the group without the first client), so the larger group keeps the cluster's id.
    """
    m = len(similarity)
    if m < 2:
        raise ValueError(f"a bipartition needs at least 2 clients, got {m}")
    second = _single_linkage(similarity) if linkage == "single" else _complete_linkage(similarity)
    weights = np.asarray(sizes, dtype=np.float64)
    if weights[second].sum() > weights[~second].sum():
        second = ~second
    return second


# --- the broadcast and the server ---------------------------------------------------------------


@dataclass
class ClientUpdates(ClientVectors):
    """CFL's upload: each client's Δθ_i, id and n_i (:class:`ClientVectors`), and its step length λ_i."""

    step_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(M,) λ_i = η s_i / (1 − m) of each row (:func:`step_length`)."""

    def __add__(self, other: ClientVectors) -> ClientUpdates:
        if not isinstance(other, ClientUpdates):
            return NotImplemented
        joined = ClientVectors.__add__(self, other)
        lengths = np.concatenate([self.step_lengths, other.step_lengths])
        return ClientUpdates(joined.blocks, joined.client_ids, joined.sizes, joined.label_counts, step_lengths=lengths)

    __iadd__ = __add__


@dataclass(frozen=True)
class ClusterModels:
    """Every cluster's model (C, S) and each client's cluster (M,); a client receives only its own."""

    models: np.ndarray
    assignment: np.ndarray

    def model_of(self, client_id: int) -> np.ndarray:
        return self.models[self.assignment[client_id]]


class CFLClient(ClientHalf[Any, ClusterModels]):
    """Starts from its cluster's model θ_{c(i)}, trains, and sends its update Δθ_i with its local SGD's λ_i."""

    def start(self, message: ClusterModels, job: ClientJob) -> Start:
        """θ_i ← θ_{c(i)}."""
        return Start(message.model_of(job.client_id))

    def upload(self, message: ClusterModels, job: ClientJob) -> Contribution:
        """Δθ_i = θ_i − θ_{c(i)} (parameters then buffers), and λ_i of the client's local SGD."""
        train = job.train
        steps = train.local_epochs * steps_per_epoch(job.num_train, train.batch_size, train.drop_last)
        change = job.trained - to_device([message.model_of(job.client_id)], job.device)[0]
        row = ClientVectors.of(change, job.client_id, job.num_train)
        lengths = np.array([step_length(job.lr, steps, train.momentum)], np.float64)
        return ClientUpdates(row.blocks, row.client_ids, row.sizes, None, step_lengths=lengths)

    def bytes_down(self, message: ClusterModels, job: ClientJob) -> int:
        return int(message.models.shape[1]) * 4


class CFLServer(ClusterModelState, ServerHalf[CFLParams, ClientUpdates]):
    """Keeps the cluster models (C, S) and the assignment of clients to clusters (M,); C grows by splits."""

    @classmethod
    def validate(cls, params: CFLParams, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    def __init__(self, params: CFLParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        architecture = sole_architecture(spec)
        self.num_params = spec.layouts[architecture].size
        self.models = np.array(initial[architecture], dtype=np.float32)[None, :]
        self.assignment = np.zeros(spec.num_clients, dtype=np.int64)

    def broadcast(self) -> ClusterModels:
        return ClusterModels(self.models, self.assignment)

    def aggregate(self, ctx: RoundContext, contribution: ClientUpdates) -> dict[str, float]:
        ids, sizes, updates = contribution.client_ids, contribution.sizes, contribution.matrix()
        params = updates[:, : self.num_params]
        if self.params.norms == "gradient":  # −ḡ_i = Δθ_i / λ_i; a client that took no step has no gradient
            lengths = contribution.step_lengths
            params = params / np.where(lengths > 0, lengths, np.inf)[:, None].astype(np.float32)
        # New arrays, so broadcasts already handed out (and Ray's zero-copy reads) stay valid.
        assignment, models = self.assignment.copy(), [row for row in self.models]
        before = assignment[ids]
        splits, mean_norms, max_norms, cross = 0, [], [], []
        for cluster in np.unique(before):
            rows = np.flatnonzero(before == cluster)
            mean_norm, max_norm = update_norms(params[rows], sizes[rows])
            mean_norms.append(mean_norm)
            max_norms.append(max_norm)
            if not self._may_split(ctx, len(rows), mean_norm, max_norm):
                continue
            similarity = cosine_similarity_matrix(params[rows])
            leaving = bipartition(similarity, sizes[rows], self.params.linkage)
            cross.append(max_cross_similarity(similarity, leaving))
            assignment[ids[rows[leaving]]] = len(models)
            models.append(models[cluster].copy())
            splits += 1
        after = assignment[ids]
        for cluster in np.unique(after):
            rows = np.flatnonzero(after == cluster)
            weights = sizes[rows] / sizes[rows].sum() if sizes[rows].sum() > 0 else np.full(len(rows), 1 / len(rows))
            models[cluster] = (models[cluster] + weights @ updates[rows].astype(np.float64)).astype(np.float32)
        self.models, self.assignment = np.stack(models), assignment
        metrics = {
            "clients_aggregated": float(len(ids)),
            "cfl_clusters": float(len(self.models)),
            "cfl_splits": float(splits),
            "cfl_mean_update_norm": float(max(mean_norms)),
            "cfl_max_update_norm": float(max(max_norms)),
            "cfl_max_cross_similarity": float(max(cross)) if cross else float("nan"),
        }
        return metrics

    def _may_split(self, ctx: RoundContext, uploaded: int, mean_norm: float, max_norm: float) -> bool:
        p = self.params
        if ctx.round < p.warmup_rounds or uploaded < p.min_cluster_clients:
            return False
        return split_criterion(mean_norm, max_norm, p.eps1, p.eps2)


register_algorithm(
    "cfl",
    params=CFLParams,
    server=CFLServer,
    client=CFLClient,
    summary="CFL (Sattler et al. 2020): FedAvg per cluster; a cluster near stationarity is bipartitioned by the "
    "cosine similarity of its clients' updates",
    reporting=Reporting(label="CFL"),
)
