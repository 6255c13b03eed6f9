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
participation works as for FedAvg and the bytes are FedAvg's. The features are read with a
forward pre-hook on the output layer during the ordinary forward of the training loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.algorithms.hooks import ClientHalf
from rayfed.algorithms.registry import register_algorithm
from rayfed.train.job import ClientJob, TrainStats
from rayfed.train.problem import ProblemSpec
from rayfed.train.scratch import ScratchKey
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_real

__all__ = ["FedUVParams", "FedUVClient", "variance_target", "variance_loss", "uniformity_loss"]

_FEATURES = ScratchKey[torch.Tensor]("feduv.features")
"""``job.scratch`` key: the penultimate features of the current mini-batch, set by the hook."""


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
        2.0, "t of the paper form of L_U (fidelity=\"paper\"); 2 as in Wang & Isola's uniformity loss."
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


def variance_loss(logits: torch.Tensor, gamma: float) -> torch.Tensor:
    """L_V = (1/K) Σ_c max(0, γ − std_b softmax(logits)_bc), the std unbiased over the batch b.

    Zero for a batch of one sample, whose std is undefined (the code would give NaN).
    """
    if logits.shape[0] < 2:
        return logits.sum() * 0.0
    probabilities = torch.softmax(logits, dim=1)
    return F.relu(gamma - probabilities.std(dim=0)).mean()


def uniformity_loss(features: torch.Tensor, fidelity: str, temperature: float = 2.0) -> torch.Tensor:
    """L_U over the batch's pairs i < j.

    ``code``: mean exp(−d²_ij / σ²), d on the raw features, σ² = median of the non-zero d²_ij
    (part of the graph, as the code's ``torch.median``). ``paper``: log mean exp(−t·d²_ij), d on L2-normalised features.
    Zero for a batch of one sample (no pairs).
    """
    z = features.reshape(features.shape[0], -1)
    if z.shape[0] < 2:
        return z.sum() * 0.0
    if fidelity == "paper":
        squared = torch.pdist(F.normalize(z, dim=1), p=2).pow(2)
        return torch.logsumexp(-temperature * squared, dim=0) - math.log(squared.numel())
    squared = torch.pdist(z, p=2).pow(2)
    nonzero = squared[squared > 0]
    if nonzero.numel() == 0:  # every representation equal: the potential is at its maximum, 1
        return squared.mean() * 0.0 + 1.0
    scale = nonzero.median()
    return squared.mul(-1.0 / scale).exp().mean()


# --- the client half --------------------------------------------------------------------------------


class FedUVClient(ClientHalf[FedUVParams]):
    """Plain SGD on CE + λ·L_V(logits) + μ·L_U(features): the default loop, with the features of each
    mini-batch read by a forward pre-hook on the output layer."""

    def __init__(self, params: FedUVParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.gamma = variance_target(spec.num_classes)

    def train(self, job: ClientJob) -> TrainStats:
        layer = job.model.get_submodule(self.spec.output_layer[job.architecture])

        def capture(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            job.scratch[_FEATURES] = args[0]

        hook = layer.register_forward_pre_hook(capture)
        try:
            return self.run_local_sgd(job)
        finally:
            hook.remove()
            job.scratch.pop(_FEATURES, None)

    def extra_loss(self, job: ClientJob, logits: torch.Tensor) -> torch.Tensor | None:
        """λ·L_V + μ·L_U of the mini-batch whose logits these are."""
        params = self.params
        features = job.scratch.pop(_FEATURES)
        total = logits.new_zeros(())
        if params.variance_coeff:
            total = total + params.variance_coeff * variance_loss(logits, self.gamma)
        if params.uniformity_coeff:
            total = total + params.uniformity_coeff * uniformity_loss(features, params.fidelity, params.temperature)
        return total


register_algorithm(
    "feduv",
    params=FedUVParams,
    server=FedAvgServer,
    client=FedUVClient,
    summary="FedUV (Son et al., CVPR 2024): FedAvg + classifier-variance hinge and representation uniformity",
    label="FedUV",
    single_model=True,
)
