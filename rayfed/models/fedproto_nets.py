"""FedProto's heterogeneous client networks: two-layer CNNs that differ in their second conv's width.

Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients", AAAI 2022,
arXiv:2105.00243, Sec. 5.1 ("model heterogeneity"): the clients of the MNIST-family experiments
run one CNN whose second convolution has 18, 20 or 22 output channels. The FedClassAvg paper
ran FedProto with this scheme on Fashion-MNIST and EMNIST (P-FCA Sec. 4.2; docs/algorithms.md,
FedProto section). The network (the authors' ``CNNMnist``)::

    conv1  C -> 10, 5x5;  max-pool 2;  ReLU
    conv2  10 -> w, 5x5;  Dropout2d(0.5);  max-pool 2;  ReLU        (w = 18, 20 or 22)
    fc1    w*h*h -> 50;  ReLU                                        the embedding (the prototype space)
    fc     Dropout(0.5), then 50 -> K                                the output layer

The output layer applies the dropout to its own input, so the features it receives (what a
forward pre-hook on ``fc`` reads, and what FedProto averages into prototypes) are the
embedding before the dropout, as the authors' ``x1``. Every width feeds the output layer the
same 50 features, so the three can share prototypes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from rayfed.models._spec import InputShape, ModelSpec, ensure_supported, min_side_reason, register_model

__all__ = ["EMBEDDING_DIM", "FEDPROTO_MODELS", "DropoutLinear", "FedProtoCNN"]

EMBEDDING_DIM = 50
"""Width of the embedding (``fc1``'s output), the prototypes' dimension d."""

_WIDTHS = (18, 20, 22)
FEDPROTO_MODELS = tuple(f"fedproto_cnn{w}" for w in _WIDTHS)
"""The registered names, one per width of ``conv2``."""
_MIN_PX = 12  # two 5x5 convs (no padding) and two 2x2 pools leave a 1x1 map from 12 px


class DropoutLinear(nn.Linear):
    """A linear layer that applies dropout (its child ``drop``) to its input first, in training mode only."""

    def __init__(self, in_features: int, out_features: int, p: float = 0.5) -> None:
        super().__init__(in_features, out_features)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.drop(x), self.weight, self.bias)


class FedProtoCNN(nn.Module):
    """The authors' ``CNNMnist`` with ``width`` channels in its second convolution."""

    output_layer: str = "fc"

    def __init__(self, input_shape: InputShape, num_classes: int, width: int) -> None:
        super().__init__()
        ensure_supported(f"fedproto_cnn{width}", _supports, input_shape)
        channels, height, width_px = input_shape
        self.conv1 = nn.Conv2d(channels, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, width, kernel_size=5)
        self.conv2_drop = nn.Dropout2d(0.5)
        side_h, side_w = ((height - 4) // 2 - 4) // 2, ((width_px - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(width * side_h * side_w, EMBEDDING_DIM)
        self.fc = DropoutLinear(EMBEDDING_DIM, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        embedding = F.relu(self.fc1(x.flatten(1)))
        return self.fc(embedding)


def _supports(input_shape: InputShape) -> str | None:
    if len(input_shape) != 3:
        return "needs images (C, H, W)"
    return min_side_reason(input_shape, _MIN_PX, "two 5x5 convolutions and two 2x2 pools")


def _factory(width: int) -> Callable[[InputShape, int], nn.Module]:
    return lambda input_shape, num_classes: FedProtoCNN(input_shape, num_classes, width)


for _width, _name in zip(_WIDTHS, FEDPROTO_MODELS):
    register_model(
        ModelSpec(
            name=_name,
            factory=_factory(_width),
            supports=_supports,
            description=f"FedProto's two-layer CNN with {_width} channels in conv2 (authors' CNNMnist)",
        )
    )
