"""FedUV: FedAvg whose clients add two regularisers that make local training behave as if it were IID.

Son, Kim, Chung, Huang and Liu, "FedUV: Uniformity and Variance for Heterogeneous Federated
Learning", CVPR 2024, arXiv:2402.18372 (authors' code ``sonhamin/FedUV``).
See docs/algorithms.md, FedUV section.

On IID data a classifier's softmax output varies across a batch in every class dimension,
and the encoder's representations spread over the whole space. On a client that sees few
classes neither holds, and the classifier's bias towards those classes is what breaks
FedAvg. Each mini-batch's loss becomes

    L = CE + λ·L_V + μ·L_U

* variance (L_V): a hinge on the per-class standard deviation of the softmax probabilities
  p = softmax(logits) over the batch, L_V = (1/K) Σ_c max(0, γ − std_b(p_bc)), with the target
  γ the same standard deviation for one-hot outputs of every class, γ = std of the columns of
  I_K = 1/√K (unbiased std, as the code's ``torch.std``);
* uniformity (L_U): the Gaussian potential of the representations z (the penultimate features,
  what the output layer reads): ``fidelity="code"`` mean_{i<j} exp(−‖z_i − z_j‖² / σ²) on the raw
  features, σ² = the median of the non-zero squared distances (the code's median heuristic);
  ``fidelity="paper"`` the hyperspherical form log mean_{i<j} exp(−t‖ẑ_i − ẑ_j‖²) on the
  L2-normalised features ẑ with temperature t (Wang & Isola's uniformity loss).

The server is FedAvg's (the code averages whole models by sample size), so partial
participation works as for FedAvg and the bytes are FedAvg's. The features are those the output
layer reads in the training step's forward (``Phase.features``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelClient
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_real

__all__ = [
    "FedUVParams",
    "FedUVClient",
    "variance_target",
    "variance_loss",
    "pair_distances",
    "uniformity_loss",
]


@section("algorithm.params")
@dataclass(frozen=True)
class FedUVParams:
    """Hyper-parameters of FedUV (``algorithm.params.*``); defaults are the authors' code's."""

    variance_coeff: float = documented(
        2.5, "λ, the weight of the classifier-variance hinge L_V (the code's --std_coeff, default 2.5)."
    )
    uniformity_coeff: float = documented(
        0.5, "μ, the weight of the representation uniformity L_U (the code's --unif_coeff, default 0.5)."
    )
    fidelity: Literal["code", "paper"] = documented(
        "code",
        "code: L_U = mean exp(−‖z_i − z_j‖²/σ²) on raw features, σ² = median squared distance; "
        "paper: L_U = log mean exp(−t‖ẑ_i − ẑ_j‖²) on L2-normalised features.",
    )
    temperature: float = documented(
        2.0, 't of the paper form of L_U (fidelity="paper"); 2 as in Wang & Isola\'s uniformity loss.'
    )

    def __post_init__(self) -> None:
        p = "algorithm.params."
        check_real(p + "variance_coeff", self.variance_coeff, low=0)
        check_real(p + "uniformity_coeff", self.uniformity_coeff, low=0)
        check_choice(p + "fidelity", self.fidelity, ("code", "paper"))
        check_real(p + "temperature", self.temperature, low=0, low_open=True)


# --- the two regularisers: pure functions on tensors ---------------------------------------------


def variance_target(num_classes: int) -> float:
    """γ: the per-class std of one-hot outputs over one sample of each class, std of a column of I_K = 1/√K."""
    return 1.0 / math.sqrt(num_classes)


def variance_loss(logits: torch.Tensor, gamma: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """L_V = (1/K) Σ_c max(0, γ − std_b softmax(logits)_bc), the std unbiased over the batch's samples b
    (those of weight 1, when ``weight`` marks padding).

    Zero for a batch of one sample, whose std is undefined (the code would give NaN).
    """
    if logits.shape[0] < 2:
        return logits.sum() * 0.0
    probabilities = torch.softmax(logits, dim=1)
    if weight is None:
        return F.relu(gamma - probabilities.std(dim=0)).mean()
    count, w = weight.sum(), weight.unsqueeze(1)
    enough = count >= 2  # fewer than two samples: no std, no term (and no gradient through a square root of 0)
    mean = (probabilities * w).sum(dim=0) / count.clamp_min(1.0)
    variance = ((probabilities - mean).pow(2) * w).sum(dim=0) / (count - 1).clamp_min(1.0)
    std = torch.where(enough, variance, torch.ones_like(variance)).sqrt()
    return torch.where(enough, F.relu(gamma - std).mean(), torch.zeros_like(count))


def pair_distances(z: torch.Tensor) -> torch.Tensor:
    """The squared distances ‖z_i − z_j‖² of the rows' pairs i < j, in ``torch.pdist``'s order."""
    n = z.shape[0]
    first, second = torch.triu_indices(n, n, 1, device=z.device)
    return (z.unsqueeze(1) - z.unsqueeze(0)).pow(2).sum(dim=-1)[first, second]


def uniformity_loss(
    features: torch.Tensor, fidelity: str, temperature: float = 2.0, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """L_U over the batch's pairs i < j (of samples of weight 1, when ``weight`` marks padding).

    ``code``: mean exp(−d²_ij / σ²), d on the raw features, σ² = median of the non-zero d²_ij
    (part of the graph, as the code's ``torch.median``); 1 when every d²_ij is 0. ``paper``:
    log mean exp(−t·d²_ij), d on L2-normalised features. Zero for a batch of one sample (no pairs).
    Nothing is read back to the host, so a captured step computes it.
    """
    z = features.reshape(features.shape[0], -1)
    n = z.shape[0]
    if n < 2:
        return z.sum() * 0.0
    first, second = torch.triu_indices(n, n, 1, device=z.device)
    valid = None if weight is None else weight[first] * weight[second]
    pairs = torch.ones_like(first, dtype=z.dtype) if valid is None else valid
    if fidelity == "paper":
        logits = -temperature * pair_distances(F.normalize(z, dim=1))
        if valid is None:
            return torch.logsumexp(logits, dim=0) - math.log(logits.numel())
        count = pairs.sum()
        # Pairs with padding weigh exp(-1e4) = 0; without any real pair the term is 0.
        value = torch.logsumexp(logits.masked_fill(valid == 0, -1e4), dim=0) - count.clamp_min(1.0).log()
        return torch.where(count > 0, value, torch.zeros_like(value))
    squared = pair_distances(z)
    scale = torch.where((squared > 0) & (pairs > 0), squared, math.nan).nanmedian()
    equal = torch.isnan(scale)  # every representation equal: the potential is at its maximum, 1
    potential = (squared.mul(-1.0 / torch.where(equal, 1.0, scale)).exp() * pairs).sum() / pairs.sum().clamp_min(1.0)
    return torch.where(equal, squared.mean() * 0.0 + 1.0, potential)


# --- the client half --------------------------------------------------------------------------------


class FedUVClient(GlobalModelClient[FedUVParams, GlobalModel]):
    """FedAvg's client training plain SGD on CE + λ·L_V(logits) + μ·L_U(features), the features those the output
    layer reads."""

    def __init__(self, params: FedUVParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.gamma = variance_target(spec.num_classes)

    def phases(self, message: GlobalModel, job: ClientJob) -> list[Phase]:
        if not self.params.variance_coeff and not self.params.uniformity_coeff:
            return super().phases(message, job)
        return [Phase(epochs=job.train.local_epochs, loss=self.regularisers)]

    def regularisers(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """λ·L_V + μ·L_U of the mini-batch."""
        p = self.params
        total = out.logits.new_zeros(())
        if p.variance_coeff:
            total = total + p.variance_coeff * variance_loss(out.logits, self.gamma, batch.weight)
        if p.uniformity_coeff:
            assert out.features is not None
            total = total + p.uniformity_coeff * uniformity_loss(out.features, p.fidelity, p.temperature, batch.weight)
        return total


register_algorithm(
    "feduv",
    params=FedUVParams,
    server=FedAvgServer,
    client=FedUVClient,
    summary="FedUV (Son et al., CVPR 2024): FedAvg + classifier-variance hinge and representation uniformity",
    reporting=Reporting(label="FedUV", single_model=True),
)
