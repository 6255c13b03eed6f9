"""FedProto under differential privacy (docs/privacy.md, "Methods that upload more than a model"): its upload in
two parts, each with its own bound, and the server's prototypes from their noised sums.

Without privacy a client sends, per class j it holds, its local prototype C_ij (the mean embedding of its class-j
samples) with its count |D_ij|, and the server averages them (Tan et al. 2022, Eq. 6 as ``aggregation``: each
holder's prototype once, ``client_mean``, or weighted by the counts, ``count``). With privacy each client sends
(:data:`FEDPROTO_PARTS`), from the broadcast prototypes C̄_j (0 before a class has one):

    r_ij = 1[i holds j] / √K   (client_mean)   or   |D_ij| / |D_i|   (count)     ‖r_i‖₂ ≤ 1
    u_i  = [ r_ij (C_ij − C̄_j) ]_{j=1..K}                                        clipped to C

and the server, from the noised sums (post-processing), for each class whose noised mass M̃_j = Σ̃_i r_ij reaches
one client's most ŵ·r_max (r_max = 1/√K, or 1):

    C̄_j ← C̄_j + Σ̃_i r_ij (C_ij − C̄_j) / max(M̃_j, ŵ·r_max)

which is a weighted mean of the C_ij written around C̄_j, and marks the class as having a prototype; the others
keep theirs. With ``client_mean`` it is the aggregation's own (the common 1/√K cancels); with ``count`` its
weights are w_i |D_ij|/|D_i|, the paper's |D_ij| where ``privacy.weighting="samples"`` makes w_i = |D_i|, the
clients' class distributions with uniform weights. The counts |D_ij| themselves are not uploaded.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rayfed.algorithms.private_uploads import PrivateParts, UploadPart, mass_weighted_step

__all__ = ["FEDPROTO_PARTS", "prototype_parts", "private_prototypes"]

FEDPROTO_PARTS = (
    UploadPart("prototype updates: r_ij (C_ij − C̄_j) over the classes, one vector, clipped to C"),
    UploadPart("class weights: r_i, the weights of its prototypes in the global mean", bound=1.0),
)
"""What a FedProto client uploads with privacy on, in order (module docstring)."""


def class_weights(counts: Any, aggregation: str) -> Any:
    """r_i (K,) from the client's class counts |D_ij| (a tensor): 1[held]/√K, or |D_ij|/|D_i| for ``count``."""
    if aggregation == "count":
        return (counts / counts.sum().clamp(min=1)).float()
    return (counts > 0).float() / math.sqrt(counts.shape[0])


def prototype_parts(means: Any, counts: Any, prototypes: Any, aggregation: str) -> tuple[Any, Any]:
    """(u_i, r_i) of a client whose class means are ``means`` (K, d; 0 where it holds none) and class counts
    ``counts`` (K,), from the broadcast ``prototypes`` C̄ (K, d); tensors on its device."""
    weights = class_weights(counts, aggregation)
    return (weights[:, None] * (means - prototypes)).reshape(-1), weights


def private_prototypes(
    prototypes: np.ndarray, present: np.ndarray, sums: PrivateParts, aggregation: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C̄', present', the classes stepped this round) from the noised sums of the parts (module docstring)."""
    update, masses = sums.split()
    floor = sums.unit * (1.0 if aggregation == "count" else 1 / math.sqrt(prototypes.shape[0]))
    seen = masses >= floor
    stepped = mass_weighted_step(prototypes, update, masses, floor)
    return np.where(seen[:, None], stepped, prototypes).astype(np.float32), present | seen, seen
