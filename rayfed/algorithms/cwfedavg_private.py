"""cwFedAvg under differential privacy (docs/privacy.md, "Methods that upload more than a model"): its upload in
parts, each with its own bound, and the server's step from their noised sums.

Without privacy a client sends its row p̃_i (P-ICCV Eq. 4) and its share of Eq. 6, n_i p̃_ij θ_i^cw with the
masses n_i p̃_ij, beside FedAvg's share of the other layers. With privacy it sends two parts
(:data:`CWFEDAVG_PARTS`), both as updates around what it was broadcast, so that a clip bounds them:

    u_i = ( θ_i^other − G_avg ,  [p̃_ij (θ_i^cw − G_j)]_{j=1..K} )     one vector, clipped to C
    r_i = p̃_i                                                         ‖p̃_i‖₂ ≤ ‖p̃_i‖₁ = 1, clipped to 1

‖[p̃_ij v_j]_j‖ ≤ ‖p̃_i‖₂ max_j ‖v_j‖, so a row that weights a class little adds little of it. The server noises
Σ_i w_i u_i and Σ_i w_i r_i (:mod:`rayfed.execution.privacy`) and steps (post-processing of the noised sums):

    G_avg ← G_avg + Σ̃_i w_i (θ_i^other − G_avg) / W_P                 (DP-FedAvg's fixed denominator)
    G_j   ← G_j + Σ̃_i w_i p̃_ij (θ_i^cw − G_j) / max(M̃_j, w_max)      (Eq. 6 in update form, M̃_j = Σ̃_i w_i p̃_ij)

Eq. 6 is G_j + Σ_i n_i p̃_ij (θ_i^cw − G_j) / Σ_i n_i p̃_ij written around G_j; the denominator is the noised mass,
held to at least one client's whole weight so that noise on a class nobody holds is not magnified. Each client
keeps its own row p̃_i for its next start (Eq. 7): it never reaches the server, whose table of rows (and the
figures drawn from it) stays at its initial 1/K.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rayfed.algorithms.private_uploads import PrivateParts, UploadPart, mass_weighted_step

__all__ = ["CWFEDAVG_PARTS", "client_parts", "private_step"]

CWFEDAVG_PARTS = (
    UploadPart("model update: θ_i^other − G_avg and the class-wise updates p̃_ij (θ_i^cw − G_j), clipped to C"),
    UploadPart("class masses: the row p̃_i, the weights of its class-wise aggregation (Eq. 6)", bound=1.0),
)
"""What a cwFedAvg client uploads with privacy on, in order (module docstring)."""


def client_parts(row: Any, classwise: Any, shared: Any, heads: Any, shared_global: Any) -> tuple[Any, Any]:
    """(u_i, r_i) of a client whose row is p̃_i (K,), whose trained class-wise part is θ_i^cw (P_cw,) and FedAvg
    part θ_i^other, from the broadcast G (K, P_cw) and G_avg (module docstring); tensors on its device."""
    import torch

    weighted = row[:, None] * (classwise[None, :] - heads)  # p̃_ij (θ_i^cw − G_j)
    return torch.cat([shared - shared_global, weighted.reshape(-1)]), row


def private_step(
    heads: np.ndarray, shared: np.ndarray, sums: PrivateParts
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(G', G_avg', metrics) from the noised sums of the parts (module docstring); new arrays."""
    update, masses = sums.split()
    width = shared.shape[0]
    new_shared = (shared + update[:width] / np.float32(sums.weight)).astype(np.float32)
    new_heads = mass_weighted_step(heads, update[width:], masses, sums.unit)  # Eq. 6 around G_j
    metrics = {
        "clients_aggregated": float(sums.count),
        "classes_held_to_one_client": float(np.sum(masses < sums.unit)),
    }
    return new_heads, new_shared, metrics
