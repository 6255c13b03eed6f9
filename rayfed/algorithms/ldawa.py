"""L-DAWA: layer-wise divergence-aware weight aggregation.

Rehman, Gao, de Gusmão, Alibeigi, Shen and Lane, "L-DAWA: Layer-wise Divergence Aware Weight
Aggregation in Federated Self-Supervised Visual Representation Learning", ICCV 2023,
arXiv:2307.07393. See docs/algorithms.md, L-DAWA section.

Each layer l of each uploaded client model θ_k is scaled by its angular agreement with the
global model's layer, and the scaled layers are averaged with equal weights:

    δ_k^l = min(1, cos(θ_k^l, θ_g^l)),        θ_g^l ← (1/K) Σ_k δ_k^l θ_k^l

over the K clients that uploaded this round. The weights are not renormalised (as in the
authors' aggregation code), so a layer on which clients diverge from θ_g shrinks.

A layer is one parameter tensor. Floating-point buffers (BatchNorm running statistics) are
averaged with equal weights 1/K (δ = 1): they are statistics, not learnt weights. Where a
layer of θ_g or θ_k is all zeros (BatchNorm's bias at initialisation) the angle is undefined
and δ = 1, so the layer is averaged instead of being zeroed for ever.

The authors' training script (``FL_Pretraining/main_CIFAR10_LDAWA.py``) aggregates the first
rounds with FedAvg's size-weighted average and switches to the rule above only after that
warm-up (``if int(GLB_RND) > 2``: three rounds); ``warmup_rounds`` (default 3) does the same.

Clients train as in FedAvg and upload their whole model; the cosines are computed for all
clients and layers at once, as segment sums over the layout (``np.add.reduceat``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rayfed.algorithms.common.global_model import GlobalModelServer, WholeModelsClient
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.hooks import RoundContext
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_int

__all__ = ["LDAWAParams", "layer_cosines", "ldawa_aggregate", "LDAWAServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class LDAWAParams:
    """Hyper-parameters of L-DAWA (``algorithm.params.*``)."""

    warmup_rounds: int = documented(
        3,
        "Rounds aggregated with FedAvg's size-weighted average before L-DAWA starts (the authors' "
        "training script: 3; 0 = L-DAWA from the first round).",
    )

    def __post_init__(self) -> None:
        check_int("algorithm.params.warmup_rounds", self.warmup_rounds, low=0)


def _layers(starts: np.ndarray, stop: int) -> list[slice]:
    bounds = [*starts.tolist(), stop]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def layer_cosines(models: np.ndarray, global_params: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """δ_k^l = cos(θ_k^l, θ_g^l), clipped at 1 against rounding, for every client row of ``models``
    (K, P) and every layer, the layers being the segments that begin at ``starts`` (L,); (K, L).
    A zero layer gives δ = 1. One layer at a time, in float64, so the temporaries stay K × (one layer)."""
    layers = _layers(starts, global_params.shape[0])
    cosines = np.ones((models.shape[0], len(layers)), dtype=np.float64)
    for index, layer in enumerate(layers):
        block = models[:, layer].astype(np.float64)
        g = global_params[layer].astype(np.float64)
        denominator = np.linalg.norm(block, axis=1) * np.linalg.norm(g)
        defined = denominator > 0
        cosines[defined, index] = (block[defined] @ g) / denominator[defined]
    return np.minimum(cosines, 1.0)


def ldawa_aggregate(models: np.ndarray, global_state: np.ndarray, layout: ParamLayout) -> tuple[np.ndarray, np.ndarray]:
    """The new global state (parameters then buffers) from the K uploaded states ``models`` (K, S)
    and the current ``global_state`` (S,); also returns δ (K, L). Parameters: (1/K) Σ_k δ_k^l θ_k^l;
    buffers (the entries after ``layout.size``): the plain mean."""
    p = layout.size
    starts = np.asarray(layout.offsets[:-1], np.int64)
    delta = layer_cosines(models[:, :p], global_state[:p], starts)
    k = models.shape[0]
    merged = np.empty_like(global_state, dtype=np.float32)
    for index, layer in enumerate(_layers(starts, p)):  # (1/K) Σ_k δ_k^l θ_k^l, one GEMV per layer
        merged[layer] = (delta[:, index] / k).astype(np.float32) @ models[:, layer]
    if models.shape[1] > p:
        merged[p:] = models[:, p:].mean(axis=0)
    return merged, delta


class LDAWAServer(GlobalModelServer[LDAWAParams, ClientVectors]):
    """Keeps θ_g; aggregates layer by layer with δ_k^l = min(1, cos(θ_k^l, θ_g^l)) and weight 1/K."""

    def __init__(self, params: LDAWAParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.layout = spec.layouts[self.architecture]

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        if ctx.round < self.params.warmup_rounds:  # the authors' FedAvg warm-up
            self.global_vector = contribution.size_weighted_mean()
            return {"clients_aggregated": float(contribution.count)}
        self.global_vector, delta = ldawa_aggregate(contribution.matrix(), self.global_vector, self.layout)
        return {
            "clients_aggregated": float(contribution.count),
            "ldawa_mean_cos": float(delta.mean()),
            "ldawa_min_cos": float(delta.min()),
        }


register_algorithm(
    "ldawa",
    params=LDAWAParams,
    server=LDAWAServer,
    client=WholeModelsClient,
    summary="L-DAWA (Rehman et al. 2023): each client layer scaled by min(1, cos(theta_k^l, theta_g^l)), mean 1/K",
    reporting=Reporting(label="L-DAWA", single_model=True),
)
