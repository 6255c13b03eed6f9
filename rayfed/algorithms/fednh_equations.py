"""FedNH's equations as pure functions: the server's first prototypes, a client's class means, the smoothing.

Dai et al., "Tackling Data Heterogeneity in Federated Learning with Class Prototypes", AAAI 2023 (the method and
its notation: :mod:`rayfed.algorithms.fednh`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.algorithms.common.class_counts import class_counts

__all__ = ["initial_prototypes", "class_means", "smooth_prototypes"]


def initial_prototypes(num_classes: int, dim: int, seed: int, steps: int = 500) -> np.ndarray:
    """K unit prototypes spread uniformly on the sphere S^{h−1}, drawn from ``seed``.

    K ≤ h: orthonormal rows (the QR of a Gaussian matrix), every pairwise cosine 0, as the
    code's orthogonal initialisation. K > h: normalised Gaussian rows moved by projected
    gradient descent on a soft maximum of their pairwise cosines.
    """
    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(max(num_classes, dim), min(num_classes, dim), generator=generator, dtype=torch.float64)
    if num_classes <= dim:
        q, r = torch.linalg.qr(gaussian)  # (h, K), orthonormal columns
        q = q * torch.sign(torch.diagonal(r))  # a unique (Haar-distributed) orthonormal basis
        return q.T.contiguous().float().numpy()
    points = F.normalize(gaussian, dim=1).requires_grad_(True)  # (K, h)
    optimiser = torch.optim.SGD([points], lr=0.1)
    off_diagonal = ~torch.eye(num_classes, dtype=torch.bool)
    for _ in range(steps):
        cosines = F.normalize(points, dim=1) @ F.normalize(points, dim=1).T
        loss = torch.logsumexp(10.0 * cosines[off_diagonal], dim=0)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        with torch.no_grad():
            points.copy_(F.normalize(points, dim=1))
    return points.detach().float().numpy()


def class_means(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's upload for the prototypes: (Σ rows n_c·μ̂_c, counts n_c), K × h (float32) and K (float64), on the
    features' device.

    μ̂_c = normalise(mean of the L2-normalised features of class c), as the code's
    ``_estimate_prototype``; a class the client does not hold has a zero row and count 0.
    """
    unit = F.normalize(features.double(), dim=1)
    counts = class_counts(labels, num_classes)
    sums = torch.zeros(num_classes, unit.shape[1], dtype=torch.float64, device=unit.device)
    sums.index_add_(0, labels, unit)
    means = F.normalize(sums, dim=1)  # the unit mean; a zero row stays zero
    return (means * counts[:, None]).float(), counts


def smooth_prototypes(prototypes: np.ndarray, sums: np.ndarray, counts: np.ndarray, rho: float) -> np.ndarray:
    """The server's update: μ_c ← normalise(ρμ_c + (1−ρ)·normalise(Σ_k n_kc μ̂_kc / Σ_k n_kc)) for each
    class with Σ_k n_kc > 0; the other classes keep μ_c."""
    held = counts > 0
    updated = np.array(prototypes, dtype=np.float64)
    average = sums[held] / counts[held, None]
    average /= np.maximum(np.linalg.norm(average, axis=1, keepdims=True), 1e-12)
    mixed = rho * updated[held] + (1.0 - rho) * average
    updated[held] = mixed / np.maximum(np.linalg.norm(mixed, axis=1, keepdims=True), 1e-12)
    return updated.astype(np.float32)
