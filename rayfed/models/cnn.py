"""Small CNNs: the cwFedAvg 4-layer CNN ("cnn4") and FedAWA's 5-layer CNN ("cnn5").

Both use PyTorch's default initialisation, as the reference code does, and both
compute their flatten size from the input shape instead of from the dataset name.
Top-level children are the blocks that cwFedAvg's selective application counts
(cwFedAvg, ICCV 2025, §4.3): the last ``m`` of them are class-wise.
"""

from __future__ import annotations

import torch
from torch import nn

from rayfed.models._spec import (
    InputShape,
    ModelSpec,
    ensure_supported,
    min_side_reason,
    register_model,
)

__all__ = ["FedAvgCNN", "FedAWACNN"]


def _conv_pool(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    """Valid (unpadded) conv with bias, in-place ReLU, 2x2 max-pool."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


def _cnn4_side(side: int) -> int:
    """Spatial size after cnn4's two (5x5 valid conv, 2x2 pool) stages."""
    return ((side - 4) // 2 - 4) // 2


def _cnn4_supports(input_shape: InputShape) -> str | None:
    return min_side_reason(input_shape, 16, "two 5x5 valid convs and two 2x2 max-pools")


class _ConvClassifier(nn.Module):
    """Conv blocks, then ``last_feat`` (Linear, ReLU) on the flattened maps, then the output layer ``fc``.

    The one body of both CNNs: their blocks are top-level children registered in order (``conv1``, ``conv2``, ...,
    ``last_feat``, ``fc``), so PyTorch's default initialisation draws their parameters in that order and the
    class-wise blocks of cwFedAvg are the last children.
    """

    output_layer: str = "fc"

    def __init__(self, convs: list[nn.Sequential], flat: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self._conv_names = [f"conv{i}" for i in range(1, len(convs) + 1)]
        for name, block in zip(self._conv_names, convs):
            self.add_module(name, block)
        self.last_feat = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(inplace=True))
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self._conv_names:
            x = getattr(self, name)(x)
        return self.fc(self.last_feat(torch.flatten(x, 1)))


class FedAvgCNN(_ConvClassifier):
    """The 4-layer CNN of the cwFedAvg papers (PFLlib ``FedAvgCNN``; docs/algorithms.md, cwFedAvg section).

    ``conv1``: Conv 5x5 C->32, ReLU, MaxPool 2; ``conv2``: Conv 5x5 32->64, ReLU,
    MaxPool 2; ``last_feat``: Linear(D->512), ReLU on the flattened maps; ``fc``:
    Linear(512->K). D = 64*h*w of the maps after ``conv2``: 1024 for 1x28x28, 1600
    for 3x32x32 and 10816 for 3x64x64. Any input with H, W >= 16 fits.

    >>> FedAvgCNN((1, 28, 28), 10).last_feat[0].in_features
    1024
    """

    def __init__(self, input_shape: InputShape, num_classes: int) -> None:
        ensure_supported("FedAvgCNN", _cnn4_supports, input_shape)
        channels, height, width = input_shape
        convs = [_conv_pool(channels, 32, 5), _conv_pool(32, 64, 5)]
        super().__init__(convs, 64 * _cnn4_side(height) * _cnn4_side(width), 512, num_classes)


def _cnn5_side(side: int) -> int:
    """Spatial size after cnn5's conv-pool, conv-pool, conv (all 3x3 valid)."""
    return ((side - 2) // 2 - 2) // 2 - 2


def _cnn5_supports(input_shape: InputShape) -> str | None:
    return min_side_reason(input_shape, 18, "three 3x3 valid convs and two 2x2 max-pools")


class FedAWACNN(_ConvClassifier):
    """FedAWA's "5-layer" CNN (the authors' ``CNNCifar10``/``CNNCifar100``; docs/algorithms.md, FedAWA).

    ``conv1``: Conv 3x3 C->32, ReLU, MaxPool 2; ``conv2``: Conv 3x3 32->64, ReLU,
    MaxPool 2; ``conv3``: Conv 3x3 64->64, ReLU; ``last_feat``: Linear(D->64), ReLU
    on the flattened maps; ``fc``: Linear(64->K). D = 1024 (64*4*4) for 32x32
    inputs. Any input with H, W >= 18 fits.

    >>> FedAWACNN((3, 32, 32), 10).last_feat[0].in_features
    1024
    """

    def __init__(self, input_shape: InputShape, num_classes: int) -> None:
        ensure_supported("FedAWACNN", _cnn5_supports, input_shape)
        channels, height, width = input_shape
        convs = [
            _conv_pool(channels, 32, 3),
            _conv_pool(32, 64, 3),
            nn.Sequential(nn.Conv2d(64, 64, 3), nn.ReLU(inplace=True)),
        ]
        super().__init__(convs, 64 * _cnn5_side(height) * _cnn5_side(width), 64, num_classes)


register_model(
    ModelSpec(
        name="cnn4",
        factory=FedAvgCNN,
        supports=_cnn4_supports,
        description="cwFedAvg 4-layer CNN (PFLlib FedAvgCNN): 2 conv 5x5 + FC 512 + output",
    )
)
register_model(
    ModelSpec(
        name="cnn5",
        factory=FedAWACNN,
        supports=_cnn5_supports,
        description="FedAWA 5-layer CNN: 3 conv 3x3 + FC 64 + output",
    )
)
