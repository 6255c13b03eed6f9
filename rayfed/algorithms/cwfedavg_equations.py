"""cwFedAvg's equations as pure functions: Eq. 4 (p̃ from row norms), Eq. 6, Eq. 7 and Eq. 8 (WDR).

Lee & Choi, "Class-Wise Federated Averaging for Efficient Personalization", ICCV 2025
("P-ICCV" below), §4; the earlier version, "Regularizing and Aggregating Clients with Class
Distribution for Personalized Federated Learning", arXiv:2406.07800 ("P-arXiv"), §3.
See docs/algorithms.md, cwFedAvg section. The halves that use them are in
:mod:`rayfed.algorithms.cwfedavg`.

Notation: K classes, client i with n_i training samples and label distribution p_i,
output-layer weight W_i (K × h), class-specific global models G_1..G_K.

>>> distribution_from_norms(output_row_norms(np.array([[3.0, 4.0], [0.0, 5.0], [6.0, 8.0]])))
array([0.25, 0.25, 0.5 ])
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "estimate_class_distribution",
    "output_row_norms",
    "distribution_from_norms",
    "empirical_distribution",
    "classwise_partial_sums",
    "classwise_average",
    "classwise_aggregate",
    "personalise",
    "wdr_penalty",
]


def estimate_class_distribution(weight: torch.Tensor) -> torch.Tensor:
    """p̃_j = ‖W_j,:‖₂ / Σ_k ‖W_k,:‖₂ (P-ICCV Eq. 4, P-arXiv Eq. 9), differentiable.

    ``weight`` is the output layer's weight matrix (K, h), bias excluded, or a batch
    (..., K, h). Gradients flow through the row norms and through the normalising sum.
    """
    norms = torch.linalg.vector_norm(weight, dim=-1)
    return norms / norms.sum(dim=-1, keepdim=True)


def output_row_norms(weight: np.ndarray) -> np.ndarray:
    """r_j = ‖W_j,:‖₂, the numerator of P-ICCV Eq. 4, in float64; (..., K, h) -> (..., K)."""
    return np.linalg.norm(np.asarray(weight, dtype=np.float64), axis=-1)


def distribution_from_norms(norms: np.ndarray) -> np.ndarray:
    """p̃_j = r_j / Σ_k r_k (P-ICCV Eq. 4) from row norms (..., K); an all-zero row gives 1/K."""
    norms = np.asarray(norms, dtype=np.float64)
    total = norms.sum(axis=-1, keepdims=True)
    uniform = np.full_like(norms, 1.0 / norms.shape[-1])
    return np.divide(norms, total, out=uniform, where=total > 0)


def empirical_distribution(counts: np.ndarray) -> np.ndarray:
    """p_ij = n_ij / n_i (P-ICCV §3.2) from label counts (..., K); a client without samples gets 1/K."""
    return distribution_from_norms(counts)


def classwise_partial_sums(models: np.ndarray, sizes: np.ndarray, p_tilde: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numerators and denominators of P-ICCV Eq. 6 over a set of clients.

    ``models`` (N, P) holds θ_i^cw, ``sizes`` (N,) the training counts n_i, ``p_tilde``
    (N, K) the rows p̃_i. Returns (Σ_i n_i p̃_ij θ_i, Σ_i n_i p̃_ij) as (K, P) float32 and
    (K,) float64. Both are sums over clients, so sets of clients add.
    """
    weights = np.asarray(sizes, dtype=np.float64)[:, None] * np.asarray(p_tilde, dtype=np.float64)
    numerators = weights.T.astype(np.float32) @ np.asarray(models, dtype=np.float32)
    return numerators, weights.sum(axis=0)


def classwise_average(numerators: np.ndarray, masses: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """G_j = Σ_i n_i p̃_ij θ_i / Σ_i n_i p̃_ij (P-ICCV Eq. 6), from the sums of
    :func:`classwise_partial_sums`. A class with zero mass keeps its ``previous`` G_j (no NaN)."""
    present = np.asarray(masses) > 0
    safe = np.where(present, masses, 1.0).astype(np.float32)
    averaged = numerators / safe[:, None]
    return np.where(present[:, None], averaged, previous).astype(np.float32, copy=False)


def classwise_aggregate(models: np.ndarray, sizes: np.ndarray, p_tilde: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Class-wise local-model aggregation, P-ICCV Eq. 5-6 with p̃ for p:

        q_ij = n_i p̃_ij / Σ_i' n_i' p̃_i'j,   G_j = Σ_i q_ij θ_i

    ``models`` (N, P), ``sizes`` (N,), ``p_tilde`` (N, K), ``previous`` (K, P) -> (K, P).
    (The weights n_i/Σn of the paper cancel in q_ij.) A class no client has keeps its
    previous model.
    """
    return classwise_average(*classwise_partial_sums(models, sizes, p_tilde), previous)


def personalise(p_tilde: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Class-wise global-model aggregation, θ_i = Σ_j p̃_ij G_j (P-ICCV Eq. 7).

    ``p_tilde`` (K,) or (M, K), ``heads`` (K, P) -> (P,) or (M, P), as one matrix product.
    """
    return (np.asarray(p_tilde, dtype=np.float32) @ heads).astype(np.float32, copy=False)


def wdr_penalty(p: torch.Tensor, weight: torch.Tensor, coefficient: float) -> torch.Tensor:
    """Weight distribution regulariser, c·‖p_i − p̃_i(W)‖₂ (P-ICCV Eq. 8; L2, not squared).

    ``p`` (K,) is the client's empirical class distribution, ``weight`` the live output
    weight (K, h). c is λ in the paper and 0.5·λ in the authors' code.
    """
    return coefficient * torch.linalg.vector_norm(p - estimate_class_distribution(weight))
