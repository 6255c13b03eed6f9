"""KT-pFL's equations as pure functions: soft predictions, personalised targets, the coefficient update.

Zhang, Guo, Ma, Wang, Xu and Wu, "Parameterized Knowledge Transfer for Personalized Federated
Learning", NeurIPS 2021, arXiv:2111.02862. See docs/algorithms.md, KT-pFL section.

With s_m = softmax(f(w_m; x)/T) client m's soft predictions on the public set x (P samples,
K classes) and c the M x M knowledge-coefficient matrix, the server keeps for client n the
personalised soft prediction

    t_n = Σ_m c_nm s_m                                                         (Sec. 3, Eq. 4)

and learns c by gradient descent on the knowledge-transfer loss plus the penalty that keeps
c near the uniform 1/M (ρ = ``penalty``):

    L(c) = Σ_n KL(t_n ‖ s_n) + (ρ/2) ‖c − 1/M‖²_F,    c ← c − η ∇_c L(c)         (Eq. 7-8)

Each client distils towards its t_n on the public set (KL at temperature T, scaled by T²
as in Hinton et al.'s distillation) besides cross-entropy on its own data (Eq. 5-6).

Only clients that have uploaded predictions take part (``seen``): t_n mixes their rows of
``c``, renormalised to sum to 1, so partial participation mixes the predictions the server
holds. After each step c is clipped at 0, so that every t_n stays a distribution.

``rule="code"`` is what the code behind the FedClassAvg paper's KT-pFL numbers does
(``hukla/FedClassAvg`` ``src/KTpFL.py::get_models_logits`` and ``distill_one_model``; the
original ``cugzj/KT-pFL`` has the same c-loss but steps with an adaptive rate and mixes with
softmax(5 c), which neither rule follows; docs/algorithms.md, KT-pFL): per row n,
L_n(c) = MSE(s_n, Σ_m c_nm s_m) + ρ·mean_m (c_nm − 1/M)² (element-wise means), one plain
gradient step c_n ← c_n − η ∇L_n, no clipping, and t_n = Σ_m c_nm s_m without renormalising;
the student is distilled with MSE(softmax(z), t_n) (temperature 1 on the student, no T²).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "soft_predictions",
    "mixing_weights",
    "personalised_targets",
    "coefficient_loss",
    "update_coefficients",
    "distillation_loss",
    "code_coefficient_loss",
    "code_distillation_loss",
]

EPS = 1e-12


def soft_predictions(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """s = softmax(logits / T) (Sec. 3): the public-set knowledge a client uploads."""
    return torch.softmax(logits / temperature, dim=-1)


def mixing_weights(c: torch.Tensor, seen: torch.Tensor, *, normalise: bool = True) -> torch.Tensor:
    """c restricted to the columns of the clients with predictions (M, M_seen), each row renormalised to sum 1
    unless ``normalise`` is false (the authors' codes mix with c as it is)."""
    sub = c[:, seen]
    return sub / sub.sum(dim=1, keepdim=True).clamp_min(EPS) if normalise else sub


def personalised_targets(
    c: torch.Tensor, predictions: torch.Tensor, seen: torch.Tensor, *, normalise: bool = True
) -> torch.Tensor:
    """t_n = Σ_m c̃_nm s_m for every client n (Eq. 4): (M, P, K) from c (M, M) and predictions (M, P, K)."""
    return torch.einsum("nm,mpk->npk", mixing_weights(c, seen, normalise=normalise), predictions[seen])


def coefficient_loss(c: torch.Tensor, predictions: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """L(c) = Σ_{n seen} mean_x KL(t_n ‖ s_n) + (ρ/2)‖c − 1/M‖²_F (Eq. 7)."""
    targets = personalised_targets(c, predictions, seen)[seen]
    students = predictions[seen]
    kl = (targets * (torch.log(targets.clamp_min(EPS)) - torch.log(students.clamp_min(EPS)))).sum(dim=-1)
    uniform = 1.0 / c.shape[0]
    return kl.mean(dim=1).sum() + 0.5 * penalty * (c - uniform).pow(2).sum()


def code_coefficient_loss(
    c: torch.Tensor, predictions: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """Σ_{n seen} [MSE(s_n, Σ_m c_nm s_m) + ρ·mean_m (c_nm − 1/M)²] (authors' codes; rows are independent,
    so one gradient step on the sum is the codes' row-by-row step)."""
    targets = personalised_targets(c, predictions, seen, normalise=False)[seen]
    students = predictions[seen]
    mse = ((students - targets) ** 2).mean(dim=(1, 2))
    penalty_rows = ((c[seen] - 1.0 / c.shape[0]) ** 2).mean(dim=1)
    return (mse + penalty * penalty_rows).sum()


def update_coefficients(
    c: np.ndarray,
    predictions: np.ndarray,
    seen: np.ndarray,
    *,
    lr: float,
    penalty: float,
    steps: int,
    rule: str = "paper",
) -> tuple[np.ndarray, float]:
    """``steps`` gradient steps on c (Eq. 8); returns the new c and the last loss.

    ``paper``: c ← max(c − η ∇L(c), 0) with :func:`coefficient_loss`; ``code``: c ← c − η ∇L(c) with
    :func:`code_coefficient_loss`, no clipping (``hukla/FedClassAvg`` ``KTpFL.py``)."""
    coefficients = torch.tensor(c, dtype=torch.float64, requires_grad=True)
    preds = torch.as_tensor(predictions, dtype=torch.float64)
    mask = torch.as_tensor(seen, dtype=torch.bool)
    loss = torch.zeros((), dtype=torch.float64)
    loss_fn = code_coefficient_loss if rule == "code" else coefficient_loss
    for _ in range(steps):
        loss = loss_fn(coefficients, preds, mask, penalty)
        (grad,) = torch.autograd.grad(loss, coefficients)
        with torch.no_grad():
            coefficients.sub_(lr * grad)
            if rule != "code":
                coefficients.clamp_(min=0.0)
    return coefficients.detach().numpy(), float(loss.detach())


def distillation_loss(
    logits: torch.Tensor, target: torch.Tensor, temperature: float, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """T² · KL(t ‖ softmax(logits/T)), averaged over the batch (Eq. 6); over its samples of weight 1, when
    ``weight`` marks padding."""
    log_student = F.log_softmax(logits / temperature, dim=-1)
    if weight is None:
        return F.kl_div(log_student, target, reduction="batchmean") * temperature**2
    per_sample = F.kl_div(log_student, target, reduction="none").sum(dim=-1)
    return (per_sample * weight).sum() / weight.sum().clamp_min(1.0) * temperature**2


def code_distillation_loss(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """MSE(softmax(logits), t), the element-wise mean (``hukla/FedClassAvg`` ``KTpFL.py::distill_one_model``:
    the student at temperature 1, the target at T, no T²); over the samples of weight 1, when ``weight`` marks
    padding."""
    if weight is None:
        return F.mse_loss(torch.softmax(logits, dim=-1), target)
    per_sample = (torch.softmax(logits, dim=-1) - target).pow(2).mean(dim=-1)
    return (per_sample * weight).sum() / weight.sum().clamp_min(1.0)
