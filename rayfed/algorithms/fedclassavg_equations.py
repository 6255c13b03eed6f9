"""FedClassAvg's local objective as pure functions on tensors: SupCon over two views and the classifier's
proximal term (P-FCA Eq. 4-5; the method: :mod:`rayfed.algorithms.fedclassavg`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["supcon_loss", "classifier_prox"]


def supcon_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    base_temperature: float,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Supervised contrastive loss over two views, as the authors' ``SupConLoss`` (Khosla et al. 2020).

    ``features`` is (2B, d): the B first views, then the B second views; ``labels`` is (B,).
    Every view a is an anchor; its positives P(a) are the other views with its label (its
    own second view included) and its contrast set A(a) is every view but itself:

        ℓ_a = −(1/|P(a)|) Σ_{p∈P(a)} [s_ap − log Σ_{b∈A(a)} exp s_ab],   s_ab = z_a·z_b / τ

        L = (τ/τ_base) · mean_a ℓ_a

    With ``weight`` (B,), views of weight 0 (a stack's padding) are neither anchors nor in any set.
    """
    n = features.shape[0]
    if n != 2 * labels.shape[0]:
        raise ValueError(f"features must hold two views per label: got {n} rows for {labels.shape[0]} labels")
    all_labels = labels.repeat(2)
    logits = features @ features.T / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()  # stability; cancels below
    not_self = ~torch.eye(n, dtype=torch.bool, device=features.device)
    if weight is not None:
        valid = weight.repeat(2) > 0
        not_self = not_self & valid.view(1, -1)
    positives = (all_labels.view(-1, 1) == all_labels.view(1, -1)) & not_self
    log_denominator = torch.logsumexp(logits.masked_fill(~not_self, float("-inf")), dim=1, keepdim=True)
    log_prob = logits - log_denominator
    if weight is None:
        mean_log_prob_pos = (log_prob * positives).sum(dim=1) / positives.sum(dim=1)
        return -(temperature / base_temperature) * mean_log_prob_pos.mean()
    anchors = weight.repeat(2)
    mean_log_prob_pos = (log_prob.masked_fill(~positives, 0.0)).sum(dim=1) / positives.sum(dim=1).clamp_min(1)
    return -(temperature / base_temperature) * (mean_log_prob_pos * anchors).sum() / anchors.sum().clamp_min(1.0)


def classifier_prox(
    weight: torch.Tensor,
    bias: torch.Tensor,
    anchor_weight: torch.Tensor,
    anchor_bias: torch.Tensor,
    rho: float,
    fidelity: str,
) -> torch.Tensor:
    """ρ·L_R(C_k, C) of Eq. 4.

    ``code``: (ρ/2)·[MSE(W_k, W) + MSE(b_k, b)], each MSE the element-wise mean (torch ``MSELoss``);
    ``paper``: ρ·‖w_Ck − w_C‖₂ over weight and bias together (Eq. 5, not squared).
    """
    if fidelity == "code":
        return 0.5 * rho * (F.mse_loss(weight, anchor_weight) + F.mse_loss(bias, anchor_bias))
    squared = ((weight - anchor_weight) ** 2).sum() + ((bias - anchor_bias) ** 2).sum()
    return rho * torch.sqrt(squared)
