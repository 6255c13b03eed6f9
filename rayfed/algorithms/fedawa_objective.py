"""FedAWA's objectives and its aggregation, on M × M quantities of the client vectors (the solvers: fedawa_solvers).

Shi et al., "FedAWA: Adaptive Optimization of Aggregation Weights in Federated Learning
Using Client Vectors", CVPR 2025, Sec. 4.3-4.4. Client vector τ_k = θ_k − θ_g (Eq. 1),
global vector τ_g(λ) = Σ_k λ_k τ_k, and the objective of the aggregation weights::

    Σ_k λ_k ‖τ_k − τ_g(λ)‖₂ + d(Σ_k λ_k θ_k, θ_g),   ‖λ‖₁ = 1            (Eq. 3)

with d = 1 − cosine similarity or the Euclidean distance (Sec. 5.3, Tab. 5). FedAWA-L
(Eq. 4) has one λ per layer l, on the layer's slices of θ and τ. The authors' code
minimises a variant, Σ_k λ_k ‖τ_k − τ_g‖ + Σ_k λ_k C_k with C_k = d(θ_k, θ_g) held
constant (docs/algorithms.md, FedAWA section): :func:`code_objective`.

**Nothing here loops over the model while it optimises.** On the simplex every quantity
of both objectives is a function of, per layer l, the Gram matrix G = T Tᵀ of the client
vectors (T = [τ_1 … τ_M]ᵀ), b = T θ_g and c = ‖θ_g‖²::

    ‖τ_k − τ_g(λ)‖² = G_kk − 2(Gλ)_k + λᵀGλ
    cos(θ_g + τ_g, θ_g) = (c + bᵀλ) / (√c · √(c + 2bᵀλ + λᵀGλ))

and one evaluation of an objective and its gradient needs G only through two products,
Gλ and Gw (:func:`_distances`, :func:`_dispersion`). :class:`ClientVectorProducts` gives
them two ways: :class:`GramStatistics` forms G once (one SYRK over the uploads), after
which an evaluation costs O(L·M²), the choice when the weights take many steps;
:class:`MatrixFreeProducts` applies G as T(Tᵀx), two matrix-vector products over the
uploads per product, and needs only the row norms G_kk besides, the choice for a single
step (the code's default), whose two products cost less than the SYRK.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rayfed.algorithms.contributions import row_square_norms
from rayfed.train.layout import ParamLayout

__all__ = [
    "LayerGroups",
    "layer_groups",
    "ClientVectorProducts",
    "GramStatistics",
    "gram_statistics",
    "MatrixFreeProducts",
    "Objective",
    "paper_objective",
    "code_objective",
    "EXACT_SMOOTHING",
    "combine",
]

EXACT_SMOOTHING = 1e-6
"""ε² = EXACT_SMOOTHING · mean_k ‖τ_k‖² smooths the norms of Eq. 3 at zero for the exact minimiser
(:func:`paper_objective`); about the resolution of ‖τ_k − τ_g‖² computed from a float32 Gram matrix."""


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
    if not layer_wise:  # the buffers a segment of their own: the parameters' sum is the one the objective made
        pieces = [(slice(0, size), 0)] + ([(slice(size, size + buffers.size), 0)] if buffers.size else [])
        return LayerGroups((slice(0, size),), tuple(pieces))
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


# --- what the objectives read of the client vectors ---------------------------------------------


class ClientVectorProducts(abc.ABC):
    """Per group l, in float64: ``diag`` (L, M) = ‖τ_k,l‖², ``b`` (L, M) = ⟨τ_k,l, θ_g,l⟩,
    ``c`` (L,) = ‖θ_g,l‖², and :meth:`gram`, x ↦ G_l x_l."""

    diag: np.ndarray
    b: np.ndarray
    c: np.ndarray

    @property
    def num_clients(self) -> int:
        return int(self.b.shape[-1])

    @abc.abstractmethod
    def gram(self, x: np.ndarray) -> np.ndarray:
        """G_l x_l for every row x_l of ``x`` (L, M)."""

    def weighted_sum(self, group: int, weights: np.ndarray) -> np.ndarray | None:
        """T_lᵀ w of group l (Σ_k w_k τ_k,l, float32) for the float32 ``weights`` w (M,), if a product made it
        already (None if not): :func:`combine` then reads the uploads once less."""
        return None


@dataclass(frozen=True)
class GramStatistics(ClientVectorProducts):
    """G_l (L, M, M) formed once; every product is then O(M²)."""

    G: np.ndarray
    b: np.ndarray
    c: np.ndarray

    @property
    def diag(self) -> np.ndarray:  # type: ignore[override]
        return np.diagonal(self.G, axis1=1, axis2=2)

    def gram(self, x: np.ndarray) -> np.ndarray:
        return np.einsum("lkj,lj->lk", self.G, x)


def gram_statistics(vectors: np.ndarray, global_vector: np.ndarray, slices: Sequence[slice]) -> GramStatistics:
    """G, b and c of every slice of the client vectors: one SYRK and one GEMV per slice.

    ``vectors`` (M, ≥P) float32 rows τ_k; only the columns inside ``slices`` are read.

    >>> T = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    >>> s = gram_statistics(T, np.array([1.0, 1.0], np.float32), [slice(0, 2)])
    >>> s.G[0].tolist(), s.b[0].tolist(), s.c.tolist()
    ([[1.0, 0.0], [0.0, 4.0]], [1.0, 2.0], [2.0])
    """
    grams, dots = [], []
    for part in slices:
        block = vectors[:, part]
        grams.append(block @ block.T)
        dots.append(block @ global_vector[part])
    return GramStatistics(
        np.stack(grams).astype(np.float64), np.stack(dots).astype(np.float64), _squared_norms(global_vector, slices)
    )


class MatrixFreeProducts(ClientVectorProducts):
    """G_l x = T_l (T_lᵀ x): two GEMVs over the uploads per product, no Gram matrix.

    Setting up reads the uploads once for b = T θ_g, and once more for the row norms unless the
    workers made them (``square_norms``, (M, L) from :func:`row_square_norms`, the same bits); each
    evaluation of an objective then takes two products (Gλ, Gw). The inner products T_lᵀ x of the
    last two evaluations are kept (:meth:`weighted_sum`): the weights a single Adam step evaluates
    are those it aggregates with, whose sum is then not made again.
    """

    def __init__(
        self,
        vectors: np.ndarray,
        global_vector: np.ndarray,
        slices: Sequence[slice],
        square_norms: np.ndarray | None = None,
    ) -> None:
        self.vectors, self.slices = vectors, tuple(slices)
        self.blocks = [vectors[:, s] for s in self.slices]
        if square_norms is None:  # BLAS dots, as accurate as the SYRK's diagonal (einsum's float32 sum is not)
            square_norms = row_square_norms(vectors, self.slices)
        self.diag = square_norms.T.astype(np.float64)
        self.b = np.stack([t @ global_vector[s] for t, s in zip(self.blocks, self.slices)]).astype(np.float64)
        self.c = _squared_norms(global_vector, self.slices)
        self._kept: list[dict[tuple[int, bytes], np.ndarray]] = []
        """T_lᵀ x of the last two products (Gλ, Gw), by group and float32 weights x_l."""

    def gram(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(x.shape, np.float64)
        kept = {}
        for group, (weights, block) in enumerate(zip(x.astype(np.float32), self.blocks)):
            inner = np.matmul(weights, block)
            out[group] = block @ inner
            kept[group, weights.tobytes()] = inner
        self._kept = [*self._kept[-1:], kept]
        return out

    def weighted_sum(self, group: int, weights: np.ndarray) -> np.ndarray | None:
        key = (group, weights.tobytes())
        return next((kept[key] for kept in self._kept if key in kept), None)


def _squared_norms(vector: np.ndarray, slices: Sequence[slice]) -> np.ndarray:
    return np.asarray([np.dot(vector[s], vector[s]) for s in slices], np.float64)


# --- the objectives -----------------------------------------------------------------------------

Objective = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""λ (L, M) ↦ (f (L,), ∇_λ f (L, M)), batched over the groups."""


def _distances(
    lam: np.ndarray, products: ClientVectorProducts, eps2: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """h = Gλ, q = λᵀGλ and D_k = √(‖τ_k − τ_g(λ)‖² + ε²), batched over the leading axis."""
    h = products.gram(lam)
    q = np.einsum("lk,lk->l", lam, h)
    d2 = np.maximum(products.diag - 2.0 * h + q[:, None], 0.0) + np.asarray(eps2).reshape(-1, 1)
    return h, q, np.sqrt(d2)


def _dispersion(
    lam: np.ndarray, products: ClientVectorProducts, h: np.ndarray, D: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Σ_k λ_k D_k and its gradient in λ: D_j + h_j Σ_k w_k − (Gw)_j with w_k = λ_k / D_k
    (w_k = 0 where D_k = 0: the gradient torch gives the norm at zero)."""
    w = np.divide(lam, D, out=np.zeros_like(lam), where=D > 0)
    grad = D + h * w.sum(axis=1, keepdims=True) - products.gram(w)
    return (lam * D).sum(axis=1), grad


def _cosine_distance(c: np.ndarray, beta: np.ndarray, q: np.ndarray) -> np.ndarray:
    """1 − cos(u, u + v) from c = ‖u‖², β = ⟨u, v⟩, q = ‖v‖², free of cancellation:
    1 − cos = (c q − β²) / (‖u‖‖u+v‖ (‖u‖‖u+v‖ + ⟨u, u+v⟩)) (Lagrange's identity)."""
    nu_nv = np.sqrt(c * np.maximum(c + 2.0 * beta + q, 0.0))
    num = np.maximum(c * q - beta**2, 0.0)
    return np.divide(num, nu_nv * (nu_nv + c + beta), out=np.zeros_like(num), where=nu_nv > 0)


def paper_objective(products: ClientVectorProducts, distance: str, *, smoothing: float = 0.0) -> Objective:
    """Eq. 3 (Eq. 4 batched over layers) and its gradient in λ, for λ on the simplex.

    f(λ) = Σ_k λ_k D_k + d(λ), D_k = √(‖τ_k − τ_g(λ)‖² + ε²), d = 1 − cos(θ_g + τ_g, θ_g)
    (``cos``), √(‖τ_g‖² + ε²) (``euclidean``) or 0 (``none``: Tab. 5's "no regulariser"), with
    ε² = ``smoothing`` · mean_k ‖τ_k‖².
    ``smoothing = 0`` is Eq. 3 as written. The exact minimiser needs f differentiable at
    the vertices (where ‖τ_k − τ_g‖ = 0) and passes :data:`EXACT_SMOOTHING`, which changes
    f by at most ε = 10⁻³ · RMS_k ‖τ_k‖. The gradient is exact along the simplex (off it,
    Σ_k λ_k θ_k ≠ θ_g + τ_g and the true gradient differs by a constant, which the
    tangent directions and the softmax do not see).
    """
    b, c = products.b, products.c
    eps2 = smoothing * products.diag.mean(axis=1) + (1e-300 if smoothing else 0.0)

    def evaluate(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h, q, D = _distances(lam, products, eps2)
        value, grad = _dispersion(lam, products, h, D)
        if distance == "none":
            return value, grad
        if distance == "cos":
            beta = np.einsum("lk,lk->l", lam, b)
            reg = _cosine_distance(c, beta, q)
            # ∂cos/∂λ = [b(β + q) − (c + β) h] / (√c · ‖θ_g + τ_g‖³); 0 where θ_g,l = 0 (d = 0 there)
            scale = (np.sqrt(c) * np.maximum(c + 2.0 * beta + q, 0.0) ** 1.5)[:, None]
            dcos = b * (beta + q)[:, None] - (c + beta)[:, None] * h
            grad = grad - np.divide(dcos, scale, out=np.zeros_like(dcos), where=scale > 0)
        else:
            reg = np.sqrt(q + eps2)
            grad = grad + np.divide(h, reg[:, None], out=np.zeros_like(h), where=reg[:, None] > 0)
        return value + reg, grad

    return evaluate


def code_objective(products: ClientVectorProducts, distance: str, group_sizes: np.ndarray) -> Objective:
    """The code's loss Σ_k λ_k ‖τ_k − τ_g‖ + Σ_k λ_k C_k and its gradient in λ.

    C_k = 1 − cos(θ_g, θ_k) (``cos``), Σ(θ_g − θ_k)² / P_l (``euclidean``) or 0 (``none``),
    constant in λ (detached in the code). The norm is not smoothed: like torch, its gradient is 0 at 0.
    """
    if distance == "none":
        C = np.zeros_like(products.diag)
    elif distance == "cos":
        C = _cosine_distance(products.c[:, None], products.b, products.diag)
    else:
        C = products.diag / group_sizes[:, None]

    def evaluate(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h, _, D = _distances(lam, products, 0.0)
        value, grad = _dispersion(lam, products, h, D)
        return value + (lam * C).sum(axis=1), grad + C

    return evaluate


# --- aggregation --------------------------------------------------------------------------------


def combine(
    global_vector: np.ndarray,
    vectors: np.ndarray,
    lam: np.ndarray,
    groups: LayerGroups,
    gamma: float,
    products: ClientVectorProducts | None = None,
) -> np.ndarray:
    """γ Σ_k λ_k θ_k / Σ_k λ_k = γ (θ_g + Σ_k λ_k τ_k) for rows λ on the simplex, per segment.

    One GEMV per segment (one per group and one per piece of buffers), λ (L, M) float64, ``vectors`` (M, S)
    float32; none for a group's parameters whose Σ_k λ_k τ_k ``products`` made already for the same weights
    (:meth:`ClientVectorProducts.weighted_sum`: the same product, so the same bits).
    """
    weights = np.vstack([lam, lam.mean(axis=0, keepdims=True)]).astype(np.float32)
    out = np.empty_like(global_vector)
    for part, group in groups.segments:
        made = None
        if products is not None and group < groups.num_groups and part == groups.param_slices[group]:
            made = products.weighted_sum(group, weights[group])
        if made is None:
            made = np.matmul(weights[group], vectors[:, part])  # (np.dot is slow on strided views)
        np.add(made, global_vector[part], out=out[part])
    if gamma != 1.0:
        out *= np.float32(gamma)
    return out
