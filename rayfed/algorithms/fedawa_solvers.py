"""The solvers of FedAWA's aggregation weights, batched over L problems (rows): a projected-gradient
minimiser on the simplex (``fidelity=exact``) and Adam steps on softmax logits (``code``, ``paper``).

Shi et al., "FedAWA: Adaptive Optimization of Aggregation Weights in Federated Learning Using Client Vectors",
CVPR 2025, Sec. 4.4; the objectives they minimise are in :mod:`rayfed.algorithms.fedawa_objective`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.algorithms.fedawa_objective import Objective

__all__ = ["project_onto_simplex", "SolverReport", "minimise_on_simplex", "softmax", "adam_steps"]

_ARMIJO = 1e-4
"""Armijo's sufficient-decrease constant of :func:`minimise_on_simplex`."""


def project_onto_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of every row of ``v`` onto the probability simplex (sort-based)."""
    u = -np.sort(-v, axis=-1)
    cumulative = np.cumsum(u, axis=-1) - 1.0
    ks = np.arange(1, v.shape[-1] + 1)
    rho = (u - cumulative / ks > 0).sum(axis=-1)
    theta = np.take_along_axis(cumulative, (rho - 1)[..., None], axis=-1) / rho[..., None]
    return np.maximum(v - theta, 0.0)


@dataclass(frozen=True)
class SolverReport:
    steps: int
    start: np.ndarray
    """f(λ⁰) per problem."""
    final: np.ndarray
    """f(λ*) per problem."""
    gap: np.ndarray
    """Frank–Wolfe gap at λ* per problem."""


def minimise_on_simplex(
    objective: Objective, lam0: np.ndarray, *, tolerance: float, max_steps: int
) -> tuple[np.ndarray, SolverReport]:
    """Minimise L independent smooth functions over the simplex, batched: λ (L, M).

    Projected gradient descent, λ⁺ = Π_Δ(λ − η_l ∇f_l(λ)), with a per-problem step η_l. λ⁺
    is taken only if it satisfies Armijo's condition along the projection arc,
    f(λ⁺) ≤ f(λ) + 10⁻⁴ ⟨∇f(λ), λ⁺ − λ⟩ (so f never increases), and η_l then becomes the
    Barzilai–Borwein step sᵀs / sᵀy, s = λ⁺ − λ, y = ∇f(λ⁺) − ∇f(λ) (2η_l where sᵀy ≤ 0,
    the function being non-convex); otherwise λ stays and η_l halves. η_l starts at
    1 / (max ∇f − min ∇f) at λ⁰.

    Stopping rule: problem l is done once its Frank–Wolfe gap
    ⟨∇f(λ), λ⟩ − min_k ∂f/∂λ_k = max_{s ∈ Δ} ⟨∇f(λ), λ − s⟩ (zero exactly at the
    first-order stationary points on Δ) is at most ``tolerance`` · |f_l(λ⁰)|; all stop
    after ``max_steps`` steps. One objective evaluation per step.
    """
    lam = np.array(lam0, dtype=np.float64)
    f, g = objective(lam)
    start = f.copy()
    threshold = tolerance * np.maximum(np.abs(start), 1e-300)
    eta = 1.0 / np.maximum(np.ptp(g, axis=1), 1e-300)
    steps = 0
    gap = (lam * g).sum(axis=1) - g.min(axis=1)
    while steps < max_steps:
        active = gap > threshold
        if not active.any():
            break
        steps += 1
        candidate = project_onto_simplex(lam - eta[:, None] * g)
        fc, gc = objective(candidate)
        step = candidate - lam
        accept = active & (fc <= f + _ARMIJO * (g * step).sum(axis=1))
        sy, ss = (step * (gc - g)).sum(axis=1), (step * step).sum(axis=1)
        bb = np.where(sy > 0, ss / np.where(sy > 0, sy, 1.0), 2.0 * eta)
        eta = np.where(accept, np.clip(bb, 1e-12, 1e12), 0.5 * eta)
        lam = np.where(accept[:, None], candidate, lam)
        f = np.where(accept, fc, f)
        g = np.where(accept[:, None], gc, g)
        gap = (lam * g).sum(axis=1) - g.min(axis=1)
    return lam, SolverReport(steps, start, f, gap)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def adam_steps(
    objective: Objective, z0: np.ndarray, *, steps: int, lr: float, betas: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``steps`` ≥ 1 steps of a new ``torch.optim.Adam`` (eps 10⁻⁸) on f(softmax(z)), rows of z (L, M).

    Returns (λ, f(λ), z): λ = softmax(z) at the start of the last step (the weights the
    code aggregates with), the objective there, and z after the last step.
    """
    z = np.array(z0, dtype=np.float64)
    m = np.zeros_like(z)
    v = np.zeros_like(z)
    b1, b2 = betas
    for t in range(1, steps + 1):
        lam = softmax(z)
        value, grad_lam = objective(lam)
        grad = lam * (grad_lam - (lam * grad_lam).sum(axis=1, keepdims=True))  # through the softmax
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        z = z - lr * m_hat / (np.sqrt(v_hat) + 1e-8)
    return lam, value, z
