"""The stacked forms of the layers that hold parameters, and which models have them (:func:`stack_blocker`).

A stacked step (:mod:`rayfed.train.stacked`) runs a model's own ``forward`` on activations whose
dimension 1 holds every client's channels (or features), one client after the other: client c's
channels at c·channels. A layer with parameters is driven by its stacked form for the duration of
the step (:func:`stacked_layers`); every other layer acts on each channel, or on a sample's
features in order, and runs as it is. Dropout draws each client's own masks
(:mod:`rayfed.train.dropout`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rayfed.models import MODELS
from rayfed.models.fedproto_nets import DropoutLinear
from rayfed.models.layers import NormalizedLinear
from rayfed.train.dropout import SEEDED_DROPOUT

__all__ = ["STACKED_LAYERS", "model_unstackable", "stack_blocker", "stacked_layers", "stacked_forward"]

STACKED_LAYERS = (nn.Conv2d, nn.Linear, nn.BatchNorm2d)
"""The layers with parameters that have a stacked form."""
_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def stack_blocker(module: nn.Module, drop_last: bool) -> str:
    """Why clients of ``module`` cannot train stacked, or "" when they can: every layer holding parameters or
    floating-point buffers has a stacked form (a zero-padded ``Conv2d``, a ``Linear``, a ``BatchNorm2d`` that
    tracks running statistics with a momentum, the last only with ``train.drop_last``: a padded batch would
    enter its statistics), and every dropout layer draws client masks."""
    for name, layer in module.named_modules():
        if isinstance(layer, _DROPOUT) and not isinstance(layer, SEEDED_DROPOUT) and layer.p > 0:
            return f"its layer {name} ({type(layer).__name__}) has no stacked form"
        holds = any(True for _ in layer.parameters(recurse=False)) or any(
            b.is_floating_point() for b in layer.buffers(recurse=False)
        )
        zero_padded_conv = isinstance(layer, nn.Conv2d) and layer.padding_mode == "zeros"
        if not holds or isinstance(layer, nn.Linear) or zero_padded_conv:
            continue
        if isinstance(layer, nn.BatchNorm2d) and layer.track_running_stats and layer.momentum is not None:
            if not drop_last:
                return (
                    f"its BatchNorm layer {name} would take padded samples into its statistics (train.drop_last=false)"
                )
            continue
        return f"its layer {name} ({type(layer).__name__}) has no stacked form"
    return ""


def model_unstackable(architecture: str, module: nn.Module, drop_last: bool) -> str:
    """Why clients of the registered ``architecture`` cannot train stacked (its declaration,
    :attr:`~rayfed.models.ModelSpec.unstackable`, or :func:`stack_blocker` of its layers), or "" when they can."""
    declared = MODELS.get(architecture).unstackable if architecture in MODELS else ""
    return declared or stack_blocker(module, drop_last)


@contextmanager
def stacked_layers(module: nn.Module) -> Iterator[dict[str, Any]]:
    """Drive ``module``'s parameterised layers by their stacked forms while the block runs. The mapping
    yielded is what they read at every call: ``width`` (the clients), each parameter by its name as a
    (width, *shape) tensor, and each BatchNorm layer's running statistics (``<name>#running``)."""
    current: dict[str, Any] = {}
    layers = [(name, layer) for name, layer in module.named_modules() if isinstance(layer, STACKED_LAYERS)]
    for name, layer in layers:
        layer.forward = stacked_forward(name, layer, current)  # type: ignore[method-assign,assignment]
    try:
        yield current
    finally:
        for _, layer in layers:
            del layer.forward


def stacked_forward(name: str, layer: nn.Module, current: Mapping[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The stacked form of one layer, on activations whose dimension 1 holds the clients' channels (or
    features) one client after the other; it reads its stacked parameters from ``current`` at every call."""
    prefix = f"{name}." if name else ""  # the module itself may be the layer (its parameters: "weight", "bias")
    if isinstance(layer, nn.Conv2d):

        def conv(x: torch.Tensor) -> torch.Tensor:
            weight, bias = current[f"{prefix}weight"], current.get(f"{prefix}bias")
            return F.conv2d(
                x,
                weight.flatten(0, 1),
                None if bias is None else bias.flatten(),
                layer.stride,
                layer.padding,
                layer.dilation,
                layer.groups * current["width"],
            )

        return conv
    if isinstance(layer, nn.Linear):
        normalized = isinstance(layer, NormalizedLinear)
        dropout = layer.drop if isinstance(layer, DropoutLinear) else None

        def linear(x: torch.Tensor) -> torch.Tensor:
            width, weight, bias = current["width"], current[f"{prefix}weight"], current.get(f"{prefix}bias")
            if x.dim() != 2:
                raise ValueError(f"stacked training needs 2-D inputs to linear layers, but {name} got {tuple(x.shape)}")
            if dropout is not None:
                x = dropout(x)
            rows = x.view(x.shape[0], width, -1).transpose(0, 1)  # (width, batch, in)
            if normalized:
                rows = F.normalize(rows, dim=2)
            out = (
                torch.bmm(rows, weight.transpose(1, 2))
                if bias is None
                else torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))
            )
            return out.transpose(0, 1).reshape(x.shape[0], -1)

        return linear
    assert isinstance(layer, nn.BatchNorm2d) and layer.momentum is not None  # stack_blocker: running statistics
    momentum = layer.momentum

    def batch_norm(x: torch.Tensor) -> torch.Tensor:  # in eval mode: the running statistics, left as they are
        weight, bias = current.get(f"{prefix}weight"), current.get(f"{prefix}bias")
        mean, var = current[f"{name}#running"]
        return F.batch_norm(
            x,
            mean,
            var,
            None if weight is None else weight.flatten(),
            None if bias is None else bias.flatten(),
            layer.training,
            momentum,
            layer.eps,
        )

    return batch_norm
