"""FedAWA and FedAWA-L: aggregation weights optimised on the server from client vectors.

Shi et al., "FedAWA: Adaptive Optimization of Aggregation Weights in Federated Learning
Using Client Vectors", CVPR 2025 (seed 004, "P-AWA"). Reference code:
github.com/ChanglongShi/FedAWA (``server_funct.py::fedawa``). Spec: ``docs/algorithms.md`` §2.

Client vector τ_k = θ_k − θ_g (P-AWA Eq. 1), global vector τ_g(λ) = Σ_k λ_k τ_k, and::

    λ* = argmin_{λ ∈ Δ}  Σ_k λ_k ‖τ_k − τ_g(λ)‖₂ + d(Σ_k λ_k θ_k, θ_g)        (Eq. 3)
    θ_g ← Σ_k λ*_k θ_k                                                       (Alg. 1, line 13)

with Δ the simplex and d = 1 − cosine similarity (``distance="cos"``) or the Euclidean
distance (``"euclidean"``, P-AWA Tab. 5). FedAWA-L (Eq. 4) solves the same problem for
every layer l with its own λ_{·l}, on the layer's slices of θ and τ.

**The server never touches a P-vector while it optimises.** Once per round it computes,
per layer l, the Gram matrix G = T Tᵀ of the client vectors (T = [τ_1 … τ_M]ᵀ), b = T θ_g
and c = ‖θ_g‖²: one SYRK and one GEMV over the uploads (:func:`gram_statistics`). On
the simplex every quantity of Eq. 3 is a function of these M × M numbers::

    ‖τ_k − τ_g(λ)‖² = G_kk − 2(Gλ)_k + λᵀGλ
    cos(θ_g + τ_g, θ_g) = (c + bᵀλ) / (√c · √(c + 2bᵀλ + λᵀGλ))

so a solver step costs O(L·M²), whatever the model size. FedAWA-L batches its L
problems into one (L, M, M) problem; nothing loops over layers while solving.

**What a layer is (FedAWA-L).** One parameter tensor (``conv1.weight``, ``bn1.bias``, …),
the spec's suggested default (§2.2). A module's floating-point buffers (BatchNorm
running mean and variance) are aggregated with the weights of that module's ``weight``
tensor (its ``bias`` if it has none; the mean over layers if it has neither). FedAWA
aggregates buffers with its single λ, as the code does. The objective reads parameters
only, as the code's ``flat_w`` does.

**Two fidelities** (``algorithm.params.fidelity``, spec §2.2 and §6):

* ``paper`` (default): Eq. 3 is minimised each round by projected gradient descent on
  the simplex, warm-started from the weights the same clients had after their previous
  round (λ⁰_k = n_k/Σn at first sight, Alg. 1), and the minimiser aggregates. See
  :func:`minimise_on_simplex` for the step rule and the stopping rule. Caveat: the
  first term of Eq. 3 is zero at every vertex of Δ (λ = e_k gives τ_g = τ_k), so the
  minimiser tends towards few clients, often one.
* ``code``: what C-AWA does. Logits z (one per client id, initialised from the size
  fractions n_k/Σn themselves, not their log) are kept across rounds; each round a new
  Adam (lr 1e-3, betas (0.5, 0.999)) takes ``server_steps`` = 1 step on
  ``Σ_k λ_k ‖τ_k − τ_g‖ + Σ_k λ_k C_k``, λ = softmax(z), with C_k = d(θ_k, θ_g)
  detached (cos) or the mean of (θ_g − θ_k)² (euclidean), and the model is aggregated
  with the softmax computed *before* the step: θ_g ← γ Σ_k λ_k θ_k / Σ_k λ_k. Unlike the
  code, the logits are indexed by client id, so partial participation keeps every
  client's logit its own (the code re-uses a list positionally, spec §2.3).

Both fidelities aggregate every state entry, BatchNorm running statistics included, with
the round's weights and γ (C-AWA ``Server_update``). A client seen for the first time
starts from n_k / (N · mean of the round's n): n_k/Σn under full participation, an
estimate of it otherwise. Sizes are the clients' training samples (the code uses the
whole partition; under a fixed train fraction the fractions agree).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rayfed.algorithms.base import Contribution, ProblemSpec, RoundContext, ServerHalf, register_algorithm
from rayfed.algorithms.fedavg import GlobalModel, require_homogeneous
from rayfed.algorithms.sgdm import PersistentMomentumClient
from rayfed.config import _check, _check_choice
from rayfed.flat import ParamLayout
from rayfed.training import ClientJob

logger = logging.getLogger(__name__)

__all__ = [
    "FedAWAParams",
    "ClientVectors",
    "ClientVectorBroadcast",
    "LayerGroups",
    "layer_groups",
    "gram_statistics",
    "paper_objective",
    "code_objective",
    "project_onto_simplex",
    "minimise_on_simplex",
    "code_adam_steps",
    "combine",
    "FedAWAServer",
    "FedAWALServer",
]

_SMOOTHING = 1e-6
"""ε² = _SMOOTHING · mean_k ‖τ_k‖² smooths the paper objective's norms at zero (see paper_objective);
about the resolution of ‖τ_k − τ_g‖² computed from a float32 Gram matrix."""
_ARMIJO = 1e-4


# --- hyper-parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FedAWAParams:
    """Hyper-parameters of FedAWA and FedAWA-L (``algorithm.params.*``)."""

    fidelity: Literal["paper", "code"] = "paper"
    """``paper``: minimise Eq. 3 each round; ``code``: C-AWA's single Adam step (module docstring)."""
    distance: Literal["cos", "euclidean"] = "cos"
    """d of Eq. 3: 1 − cosine similarity (the paper's choice) or Euclidean (P-AWA Tab. 5).
    ``paper``: d = ‖Σλθ − θ_g‖₂; ``code``: C_k = mean over coordinates of (θ_g − θ_k)², as C-AWA."""
    tolerance: float = 1e-4
    """``paper``: stop once the Frank–Wolfe gap of every problem is at most tolerance × its
    objective at the start of the round (:func:`minimise_on_simplex`)."""
    max_steps: int = 200
    """``paper``: at most this many projected-gradient steps per round."""
    server_lr: float = 1e-3
    """``code``: Adam learning rate on the logits (C-AWA ``--server_lr``)."""
    server_beta1: float = 0.5
    server_beta2: float = 0.999
    """``code``: Adam betas (0.5, 0.999), as C-AWA."""
    server_steps: int = 1
    """``code``: Adam steps per round (C-AWA ``--server_epochs``); the optimiser is new every round."""
    gamma: float = 1.0
    """γ of the code's update θ_g ← γ Σ λ_k θ_k / Σ λ_k (both fidelities; 1 = none)."""

    def __post_init__(self) -> None:
        p = "algorithm.params."
        _check_choice(p + "fidelity", self.fidelity, ("paper", "code"))
        _check_choice(p + "distance", self.distance, ("cos", "euclidean"))
        for name in ("tolerance", "server_lr", "gamma"):
            value = getattr(self, name)
            _check(_is_real(value) and math.isfinite(value) and value > 0, p + name, value, "a finite number > 0")
        for name in ("max_steps", "server_steps"):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, p + name, value,
                   "an integer >= 1")
        for name in ("server_beta1", "server_beta2"):
            value = getattr(self, name)
            _check(_is_real(value) and 0 <= value < 1, p + name, value, "in [0, 1)")


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- what clients upload ------------------------------------------------------------------------


@dataclass
class ClientVectors(Contribution):
    """The client vectors τ_k = θ_k − θ_g of a set of clients, with their ids and sizes.

    Rows are whole states (parameters, then buffers). ``+`` concatenates, lazily: it
    joins the tuples of blocks, and :meth:`matrix` copies them into one (M, S) array
    once, on the server. Concatenation is associative; the row order (the merge order,
    fixed by the engine) changes results only by float rounding.
    """

    blocks: tuple[np.ndarray, ...]
    client_ids: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, vector: np.ndarray, client_id: int, size: float) -> ClientVectors:
        """One client's upload."""
        return cls((vector[None, :],), np.array([client_id], np.int64), np.array([size], np.float64))

    def __add__(self, other: ClientVectors) -> ClientVectors:
        return ClientVectors(
            self.blocks + other.blocks,
            np.concatenate([self.client_ids, other.client_ids]),
            np.concatenate([self.sizes, other.sizes]),
        )

    __iadd__ = __add__

    @property
    def count(self) -> int:
        return len(self.client_ids)

    def matrix(self) -> np.ndarray:
        """The (M, S) float32 matrix of client vectors; no copy when there is one block."""
        if len(self.blocks) == 1:
            return self.blocks[0]
        return np.concatenate(self.blocks, axis=0)

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self.blocks) + int(self.client_ids.nbytes) + int(self.sizes.nbytes)

    def is_finite(self) -> bool:
        return all(bool(np.isfinite(b).all()) for b in self.blocks) and bool(np.isfinite(self.sizes).all())


@dataclass(frozen=True)
class ClientVectorBroadcast(GlobalModel):
    """The global model; a trained client sends its client vector τ_k = θ_k − θ_g."""

    def contribute(self, job: ClientJob) -> ClientVectors:  # type: ignore[override]
        return ClientVectors.of(job.flat.state_numpy() - self.vector, job.client_id, job.num_train)


# --- layers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerGroups:
    """How a state vector splits into the groups that share one λ.

    ``param_slices[l]`` is group l's part of the parameter vector (what the objective
    reads); ``segments`` lists (slice of the state vector, group) for aggregation, with
    group ``len(param_slices)`` meaning "the mean λ over groups" (buffers of modules
    without parameters).
    """

    param_slices: tuple[slice, ...]
    segments: tuple[tuple[slice, int], ...]

    @property
    def num_groups(self) -> int:
        return len(self.param_slices)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([s.stop - s.start for s in self.param_slices], dtype=np.float64)


def layer_groups(layout: ParamLayout, buffer_layout: ParamLayout | None, *, layer_wise: bool) -> LayerGroups:
    """FedAWA: one group, the whole state. FedAWA-L: one group per parameter tensor,
    each buffer joining its module's ``weight`` (else ``bias``) group."""
    size = layout.size
    buffers = buffer_layout if buffer_layout is not None else ParamLayout((), (), (0,))
    if not layer_wise:
        return LayerGroups((slice(0, size),), ((slice(0, size + buffers.size), 0),))
    param_slices = tuple(slice(a, b) for a, b in zip(layout.offsets[:-1], layout.offsets[1:]))
    index = {name: i for i, name in enumerate(layout.names)}
    segments: list[tuple[slice, int]] = [(s, i) for i, s in enumerate(param_slices)]
    for name, start, stop in zip(buffers.names, buffers.offsets[:-1], buffers.offsets[1:]):
        module = name.rpartition(".")[0]
        prefix = f"{module}." if module else ""
        group = index.get(prefix + "weight", index.get(prefix + "bias", len(param_slices)))
        piece = slice(size + start, size + stop)
        last_slice, last_group = segments[-1]
        if last_group == group and last_slice.stop == piece.start:  # running_mean, running_var: one segment
            segments[-1] = (slice(last_slice.start, piece.stop), group)
        else:
            segments.append((piece, group))
    return LayerGroups(param_slices, tuple(segments))


# --- the M × M statistics and the objectives ----------------------------------------------------


@dataclass(frozen=True)
class GramStatistics:
    """Per group l: G_l = T_l T_lᵀ (M × M), b_l = T_l θ_g,l (M), c_l = ‖θ_g,l‖², in float64."""

    G: np.ndarray
    b: np.ndarray
    c: np.ndarray

    @property
    def num_clients(self) -> int:
        return int(self.G.shape[-1])


def gram_statistics(vectors: np.ndarray, global_vector: np.ndarray, slices: Sequence[slice]) -> GramStatistics:
    """G, b and c of every slice of the client vectors: one SYRK and one GEMV per slice.

    ``vectors`` (M, ≥P) float32 rows τ_k; only the columns inside ``slices`` are read.

    >>> T = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    >>> s = gram_statistics(T, np.array([1.0, 1.0], np.float32), [slice(0, 2)])
    >>> s.G[0].tolist(), s.b[0].tolist(), s.c.tolist()
    ([[1.0, 0.0], [0.0, 4.0]], [1.0, 2.0], [2.0])
    """
    grams, dots, norms = [], [], []
    for part in slices:
        block = vectors[:, part]
        g = global_vector[part]
        grams.append(block @ block.T)
        dots.append(block @ g)
        norms.append(np.dot(g, g))
    return GramStatistics(
        np.stack(grams).astype(np.float64), np.stack(dots).astype(np.float64), np.asarray(norms, np.float64)
    )


Objective = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _distances(lam: np.ndarray, G: np.ndarray, eps2: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """h = Gλ, q = λᵀGλ and D_k = √(‖τ_k − τ_g(λ)‖² + ε²), batched over the leading axis."""
    h = np.einsum("lkj,lj->lk", G, lam)
    q = np.einsum("lk,lk->l", lam, h)
    diag = np.diagonal(G, axis1=1, axis2=2)
    d2 = np.maximum(diag - 2.0 * h + q[:, None], 0.0) + np.asarray(eps2).reshape(-1, 1)
    return h, q, np.sqrt(d2)


def _dispersion(lam: np.ndarray, G: np.ndarray, h: np.ndarray, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ_k λ_k D_k and its gradient in λ: D_j + h_j Σ_k w_k − (Gw)_j with w_k = λ_k / D_k (w_k = 0 where D_k = 0)."""
    w = np.divide(lam, D, out=np.zeros_like(lam), where=D > 0)
    grad = D + h * w.sum(axis=1, keepdims=True) - np.einsum("lkj,lk->lj", G, w)
    return (lam * D).sum(axis=1), grad


def _cosine_distance(c: np.ndarray, beta: np.ndarray, q: np.ndarray) -> np.ndarray:
    """1 − cos(u, u + v) from c = ‖u‖², β = ⟨u, v⟩, q = ‖v‖², free of cancellation:
    1 − cos = (c q − β²) / (‖u‖‖u+v‖ (‖u‖‖u+v‖ + ⟨u, u+v⟩)) (Lagrange's identity)."""
    nu_nv = np.sqrt(c * np.maximum(c + 2.0 * beta + q, 0.0))
    num = np.maximum(c * q - beta**2, 0.0)
    return np.divide(num, nu_nv * (nu_nv + c + beta), out=np.zeros_like(num), where=nu_nv > 0)


def paper_objective(stats: GramStatistics, distance: str) -> Objective:
    """Eq. 3 (Eq. 4 batched over layers) and its gradient, on the simplex, from G, b, c.

    f(λ) = Σ_k λ_k D_k + d(λ) with D_k = √(‖τ_k − τ_g(λ)‖² + ε²), ε² = 10⁻⁶ · mean_k G_kk
    (the resolution of a float32 Gram matrix), which makes f differentiable at the vertices
    (where ‖τ_k − τ_g‖ = 0) and changes it by at most ε = 10⁻³ · RMS_k ‖τ_k‖.
    d = 1 − cos(θ_g + τ_g, θ_g) or √(‖τ_g‖² + ε²). Maps λ (L, M) to (f (L,), ∇f (L, M)).
    """
    G, b, c = stats.G, stats.b, stats.c
    eps2 = _SMOOTHING * np.diagonal(G, axis1=1, axis2=2).mean(axis=1) + 1e-300

    def evaluate(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h, q, D = _distances(lam, G, eps2)
        value, grad = _dispersion(lam, G, h, D)
        if distance == "cos":
            beta = np.einsum("lk,lk->l", lam, b)
            reg = _cosine_distance(c, beta, q)
            # ∂cos/∂λ = [b(β + q) − (c + β) h] / (√c · ‖θ_g + τ_g‖³); 0 where θ_g,l = 0 (d = 0 there)
            scale = (np.sqrt(c) * np.maximum(c + 2.0 * beta + q, 0.0) ** 1.5)[:, None]
            dcos = b * (beta + q)[:, None] - (c + beta)[:, None] * h
            grad = grad - np.divide(dcos, scale, out=np.zeros_like(dcos), where=scale > 0)
        else:
            reg = np.sqrt(q + eps2)
            grad = grad + h / reg[:, None]
        return value + reg, grad

    return evaluate


def code_objective(stats: GramStatistics, distance: str, group_sizes: np.ndarray) -> Objective:
    """C-AWA's loss Σ_k λ_k ‖τ_k − τ_g‖ + Σ_k λ_k C_k and its gradient in λ, from G, b, c.

    C_k = 1 − cos(θ_g, θ_k) (``cos``) or Σ(θ_g − θ_k)² / P_l (``euclidean``), constant in λ
    (detached in the code). The norm is not smoothed: like torch, its gradient is 0 at 0.
    """
    G, b, c = stats.G, stats.b, stats.c
    diag = np.diagonal(G, axis1=1, axis2=2)
    if distance == "cos":
        C = _cosine_distance(c[:, None], b, diag)
    else:
        C = diag / group_sizes[:, None]

    def evaluate(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h, _, D = _distances(lam, G, 0.0)
        value, grad = _dispersion(lam, G, h, D)
        return value + (lam * C).sum(axis=1), grad + C

    return evaluate


# --- solvers ------------------------------------------------------------------------------------


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


def code_adam_steps(objective: Objective, z0: np.ndarray, params: FedAWAParams) -> tuple[np.ndarray, np.ndarray]:
    """C-AWA's server loop on the logits z (L, M): a new Adam, ``server_steps`` steps.

    Returns (λ, z): λ = softmax(z) as computed at the start of the last step (the weights
    the code aggregates with) and z after the last step (kept for the next round).
    """
    z = np.array(z0, dtype=np.float64)
    m = np.zeros_like(z)
    v = np.zeros_like(z)
    b1, b2 = params.server_beta1, params.server_beta2
    for t in range(1, params.server_steps + 1):  # server_steps >= 1, so λ is always set
        lam = softmax(z)
        _, grad_lam = objective(lam)
        grad = lam * (grad_lam - (lam * grad_lam).sum(axis=1, keepdims=True))  # through the softmax
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        z = z - params.server_lr * m_hat / (np.sqrt(v_hat) + 1e-8)  # torch.optim.Adam, eps 1e-8
    return lam, z


# --- aggregation --------------------------------------------------------------------------------


def combine(
    global_vector: np.ndarray, vectors: np.ndarray, lam: np.ndarray, groups: LayerGroups, gamma: float
) -> np.ndarray:
    """γ Σ_k λ_k θ_k / Σ_k λ_k = γ (θ_g + Σ_k λ_k τ_k) for rows λ on the simplex, per segment.

    One GEMV per segment (one in all for FedAWA); λ (L, M) float64, ``vectors`` (M, S) float32.
    """
    weights = np.vstack([lam, lam.mean(axis=0, keepdims=True)]).astype(np.float32)
    out = np.empty_like(global_vector)
    for part, group in groups.segments:
        np.matmul(weights[group], vectors[:, part], out=out[part])  # (np.dot is slow on strided views)
    out += global_vector
    if gamma != 1.0:
        out *= np.float32(gamma)
    return out


# --- the server half ----------------------------------------------------------------------------


class FedAWAServer(ServerHalf[FedAWAParams, ClientVectors]):
    """Keeps θ_g and, per client id, its weight (paper) or logit (code); one group of λ."""

    layer_wise = False

    def __init__(self, params: FedAWAParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        name = "fedawa_l" if self.layer_wise else "fedawa"
        architecture = require_homogeneous(spec, name)
        self.global_vector = np.array(initial[architecture], dtype=np.float32)
        self.groups = layer_groups(
            spec.layouts[architecture], spec.buffer_layouts.get(architecture), layer_wise=self.layer_wise
        )
        covered = max(s.stop for s, _ in self.groups.segments)
        if covered != self.global_vector.size:
            raise ValueError(
                f"{name}: the state has {self.global_vector.size} floats but the layout covers {covered}; "
                "ProblemSpec.buffer_layouts must describe the model's buffers"
            )
        self.client_state = np.full((self.groups.num_groups, spec.num_clients), np.nan)
        """Per group and client id: the weight (paper) or logit (code); NaN = not seen yet."""
        self._warned_vertex = False

    def broadcast(self) -> ClientVectorBroadcast:
        return ClientVectorBroadcast(self.global_vector)

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors | None) -> dict[str, float]:
        if contribution is None:
            return {"clients_aggregated": 0.0}
        ids = contribution.client_ids
        vectors = contribution.matrix()
        stats = gram_statistics(vectors, self.global_vector, self.groups.param_slices)
        self._first_sight(ids, contribution.sizes)
        if self.params.fidelity == "code":
            objective = code_objective(stats, self.params.distance, self.groups.sizes)
            lam, self.client_state[:, ids] = code_adam_steps(objective, self.client_state[:, ids], self.params)
            metrics = {"fedawa_objective": float(objective(lam)[0].mean())}
        else:
            mass = self.client_state[:, ids].sum(axis=1, keepdims=True)
            lam0 = self.client_state[:, ids] / mass
            lam, report = minimise_on_simplex(
                paper_objective(stats, self.params.distance),
                lam0,
                tolerance=self.params.tolerance,
                max_steps=self.params.max_steps,
            )
            self.client_state[:, ids] = lam * mass
            if len(ids) > 1 and lam.max() > 0.99 and not self._warned_vertex:
                self._warned_vertex = True
                logger.warning(
                    "round %d: fidelity='paper' put %.3f of the weight on one client: the exact minimiser of "
                    "Eq. 3 lies at a vertex of the simplex (its first term vanishes there). The published "
                    "numbers come from fidelity='code' (one Adam step per round)", ctx.round, float(lam.max()),
                )
            relative_gap = float((report.gap / np.maximum(np.abs(report.start), 1e-300)).max())
            if relative_gap > self.params.tolerance:
                logger.debug("round %d: solver stopped after %d steps, relative gap %.3g", ctx.round,
                             report.steps, relative_gap)
            metrics = {
                "fedawa_objective_start": float(report.start.mean()),
                "fedawa_objective": float(report.final.mean()),
                "fedawa_solver_steps": float(report.steps),
                "fedawa_solver_gap": relative_gap,
            }
        self.global_vector = combine(self.global_vector, vectors, lam, self.groups, self.params.gamma)
        metrics.update(clients_aggregated=float(len(ids)), fedawa_max_weight=float(lam.max(axis=1).mean()))
        return metrics

    def _first_sight(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        """Clients never aggregated before start from n_k / (N · mean n) (= n_k / Σn with everyone)."""
        new = np.isnan(self.client_state[0, ids])
        if new.any():
            start = sizes / (self.spec.num_clients * max(float(sizes.mean()), 1e-12))
            self.client_state[:, ids[new]] = start[new]
        if self.params.fidelity == "paper":  # a subset whose weights all went to 0 restarts uniform
            empty = self.client_state[:, ids].sum(axis=1) <= 0
            self.client_state[np.ix_(empty, ids)] = 1.0 / self.spec.num_clients

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"global": self.global_vector, "client_state": self.client_state}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.global_vector = np.array(state["global"], dtype=np.float32)
        self.client_state = np.array(state["client_state"], dtype=np.float64)


class FedAWALServer(FedAWAServer):
    """FedAWA-L (P-AWA Eq. 4): one λ per layer (parameter tensor), solved as one batch."""

    layer_wise = True


register_algorithm(
    "fedawa",
    params=FedAWAParams,
    server=FedAWAServer,
    client=PersistentMomentumClient,
    summary="FedAWA (Shi et al. 2025): aggregation weights optimised from client vectors (Eq. 3)",
    keeps_client_state=True,
)
register_algorithm(
    "fedawa_l",
    params=FedAWAParams,
    server=FedAWALServer,
    client=PersistentMomentumClient,
    summary="FedAWA-L (Shi et al. 2025): layer-wise aggregation weights from client vectors (Eq. 4)",
    keeps_client_state=True,
)
