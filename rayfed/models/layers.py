"""Layers that methods ask of a model beyond the architecture's own.

:class:`NormalizedLinear` is a linear layer that reads its input L2-normalised: with weight s·μ (unit
rows μ_c) and zero bias it computes s·cos(f, μ_c), FedNH's classifier (Dai et al., AAAI 2023).
:func:`normalize_inputs_of` gives a built model such an output layer, keeping its parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["NormalizedLinear", "normalize_inputs_of"]


class NormalizedLinear(nn.Linear):
    """``nn.Linear`` on the L2-normalised input (each sample's features scaled to norm 1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.normalize(x, dim=1), self.weight, self.bias)


def normalize_inputs_of(model: nn.Module, name: str) -> None:
    """Make ``model``'s linear layer ``name`` a :class:`NormalizedLinear`, in place: the same parameter
    tensors (so a flat vector bound to them stays bound), the same state-dict keys."""
    layer = model.get_submodule(name)
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"{name} is a {type(layer).__name__}, not an nn.Linear")
    if not isinstance(layer, NormalizedLinear):
        layer.__class__ = NormalizedLinear
