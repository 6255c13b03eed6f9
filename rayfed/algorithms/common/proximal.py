"""The proximal term (μ/2) ‖w − w_anchor‖² of FedProx (Li et al., MLSys 2020, Eq. 2), which Ditto,
FedAMP and FedDyn add towards their own anchors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["flatten_logically", "proximal_term"]


def flatten_logically(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parameter tensors, each in its logical (row-major) order, concatenated.

    Not the flat vector's order: that one stores convolution kernels channels-last
    (:mod:`rayfed.train.flat`). Both sides of :func:`proximal_term` use this one.
    """
    return torch.cat([p.reshape(-1) for p in params])


def proximal_term(params: Sequence[torch.Tensor], anchor: torch.Tensor, mu: float) -> torch.Tensor:
    """(μ/2) ‖w − w_g‖² (FedProx Eq. 2): w = the parameter tensors in layout order, w_g =
    :func:`flatten_logically` of the starting parameters."""
    return 0.5 * mu * (flatten_logically(params) - anchor).pow(2).sum()
