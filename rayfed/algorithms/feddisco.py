"""FedDisco: aggregation weights from dataset sizes and label-distribution discrepancies.

Ye, Xu, Wang, Xu, Chen and Wang, "FedDisco: Federated Learning with Discrepancy-Aware
Collaboration", ICML 2023, arXiv:2305.19229. See docs/algorithms.md, FedDisco section.

Every client k reveals its training-label histogram (K counts). The server measures the
discrepancy d_k between the client's label distribution and the global one (uniform, as the
authors' code assumes: ``hypo_distribution = 1/K``) and aggregates with the paper's
discrepancy-aware weights

    p_k = ReLU(n_k/n − a·d_k + b) / Σ_j ReLU(n_j/n − a·d_j + b),    θ_g ← Σ_k p_k θ_k

over the clients that uploaded this round, n = Σ_j n_j. With the KL metric the code divides
d_k by Σ_j d_j (the round's clients), so a = 0.5, b = 0.1 (the code's defaults) act on
discrepancies that sum to 1. A client whose labels are far from uniform gets less weight.

Clients train as in FedAvg and upload their whole model plus their histogram. The weights
are a normalised nonlinear function of the round's clients, so the server needs each
client's model (:class:`ClientVectors`), not only a running sum. The same weights can start
FedAWA's refinement (``algorithm.name=fedawa, algorithm.params.initial_weights=feddisco``,
the FedAWA paper's modularity experiment): :func:`feddisco_initial_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelClient, GlobalModelServer
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.fedawa_weights import register_initial_weights
from rayfed.algorithms.hooks import Contribution, RoundContext
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_real

__all__ = [
    "METRICS",
    "FedDiscoParams",
    "discrepancy",
    "disco_weights",
    "feddisco_initial_weights",
    "ModelAndHistogramClient",
    "FedDiscoServer",
]

METRICS = ("kl", "l1", "l2", "cosine")

DEFAULT_A = 0.5
DEFAULT_B = 0.1


@section("algorithm.params")
@dataclass(frozen=True)
class FedDiscoParams:
    """Hyper-parameters of FedDisco (``algorithm.params.*``); defaults are the authors' code's."""

    a: float = documented(DEFAULT_A, "a: how much the discrepancy d_k lowers a client's weight (0.5).")
    b: float = documented(DEFAULT_B, "b of the weight formula: the offset that keeps weights positive (0.1).")
    metric: Literal["kl", "l1", "l2", "cosine"] = documented(
        "kl",
        "d_k: KL(local ‖ uniform), normalised to sum 1 over the round's clients (code default), or the "
        "unnormalised L1, L2 or 1 − cosine distance to the uniform distribution.",
    )

    def __post_init__(self) -> None:
        check_real("algorithm.params.a", self.a, low=0)
        check_real("algorithm.params.b", self.b)
        check_choice("algorithm.params.metric", self.metric, METRICS)


# --- the paper's equations as pure functions ------------------------------------------------------


def discrepancy(label_counts: np.ndarray, metric: str = "kl") -> np.ndarray:
    """d_k of each row of ``label_counts`` (M, K) against the uniform distribution 1/K.

    ``kl``: KL(p_k ‖ u) = Σ_c p_kc log(p_kc · K) (0 log 0 = 0), divided by Σ_k d_k as the code
    does (all zeros if every client is uniform); ``l1``/``l2``: ‖p_k − u‖; ``cosine``: 1 − cos(p_k, u).
    """
    counts = np.asarray(label_counts, np.float64)
    k = counts.shape[1]
    p = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1e-300)
    uniform = np.full(k, 1.0 / k)
    if metric == "kl":
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(p * k), 0.0)
        d = terms.sum(axis=1)
        total = d.sum()
        return np.zeros_like(d) if total <= 0 else d / total
    if metric == "l1":
        return np.abs(p - uniform).sum(axis=1)
    if metric == "l2":
        return np.linalg.norm(p - uniform, axis=1)
    if metric == "cosine":
        return 1.0 - (p @ uniform) / np.maximum(np.linalg.norm(p, axis=1) * np.linalg.norm(uniform), 1e-300)
    raise ValueError(f"unknown discrepancy metric {metric!r}; choose one of {METRICS}")


def disco_weights(
    sizes: np.ndarray, label_counts: np.ndarray, a: float = DEFAULT_A, b: float = DEFAULT_B, metric: str = "kl"
) -> np.ndarray:
    """p_k of the weight formula over the given clients: ReLU(n_k/n − a·d_k + b), normalised to sum 1.

    If every value is ≤ 0 (only possible with a large ``a`` or a negative ``b``) the sizes'
    fractions n_k/n are returned instead (the code has no such branch).
    """
    fractions = np.asarray(sizes, np.float64) / max(float(np.sum(sizes)), 1e-300)
    raw = np.maximum(fractions - a * discrepancy(label_counts, metric) + b, 0.0)
    total = raw.sum()
    return fractions if total <= 0 else raw / total


@register_initial_weights("feddisco", needs_label_counts=True)
def feddisco_initial_weights(
    client_ids: np.ndarray, sizes: np.ndarray, label_counts: np.ndarray | None, spec: ProblemSpec
) -> np.ndarray:
    """FedDisco's p_k (default a, b, KL) as FedAWA's λ⁰, scaled by M/N so a client's weight is an
    estimate of its share of all N clients (exactly p_k when all clients are at hand)."""
    if label_counts is None:
        raise ValueError("initial_weights='feddisco' needs the clients' label counts in their uploads")
    return disco_weights(sizes, label_counts) * (len(client_ids) / spec.num_clients)


# --- worker side ----------------------------------------------------------------------------------


class ModelAndHistogramClient(GlobalModelClient[FedDiscoParams, GlobalModel]):
    """FedAvg's client, which sends its whole model and its training-label counts."""

    def upload(self, message: GlobalModel, job: ClientJob) -> Contribution:
        return ClientVectors.of(job.trained.clone(), job.client_id, job.num_train, job.train_label_counts)


# --- server side ----------------------------------------------------------------------------------


class FedDiscoServer(GlobalModelServer[FedDiscoParams, ClientVectors]):
    """Keeps θ_g; aggregates the round's models with the discrepancy-aware weights (every state entry)."""

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        if contribution.label_counts is None:
            raise ValueError("feddisco: the uploads carry no label counts")
        p = self.params
        weights = disco_weights(contribution.sizes, contribution.label_counts, p.a, p.b, p.metric)
        self.global_vector = (weights.astype(np.float32) @ contribution.matrix()).astype(np.float32, copy=False)
        return {
            "clients_aggregated": float(contribution.count),
            "feddisco_max_weight": float(weights.max()),
            "feddisco_min_weight": float(weights.min()),
        }


register_algorithm(
    "feddisco",
    params=FedDiscoParams,
    server=FedDiscoServer,
    client=ModelAndHistogramClient,
    summary="FedDisco (Ye et al. 2023): weights ReLU(n_k/n - a d_k + b) from label-distribution discrepancy",
    reporting=Reporting(label="FedDisco", single_model=True),
)
