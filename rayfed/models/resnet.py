"""Residual networks: CIFAR/Tiny-ImageNet ResNet-18, ResNet-20, and torchvision's ResNet-18.

* ``resnet18``: the small-image ResNet-18 of FedAWA (CVPR 2025). 3x3 stride-1 stem,
  plus a 3x3 stride-2 max-pool only for inputs of at least 64 px (Tiny-ImageNet).
* ``resnet20``: the CIFAR ResNet-20 of FedAWA, about 0.27 M parameters.
* ``resnet18_imagenet``: torchvision ``resnet18`` with the ImageNet stem, as used by
  cwFedAvg's ``-m resnet`` (docs/algorithms.md, cwFedAvg section).

All use PyTorch's default initialisation (torchvision's own for ``resnet18_imagenet``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rayfed.models._spec import (
    InputShape,
    ModelSpec,
    ensure_supported,
    min_side_reason,
    register_model,
)

__all__ = ["BasicBlock", "ResNet", "resnet18", "resnet20", "resnet18_imagenet"]

TINY_STEM_MIN_PX = 64
"""Inputs at least this large (H and W) get the Tiny-ImageNet stem max-pool."""


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus a shortcut, then ReLU.

    The shortcut is the identity, or a 1x1 stride-``stride`` conv + BN when the
    stride or the width changes (``shortcut`` is then a Sequential, else ``None``).
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Sequential | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out += x if self.shortcut is None else self.shortcut(x)
        return F.relu(out, inplace=True)


class ResNet(nn.Module):
    """A small-image ResNet of BasicBlocks.

    Children, in order: ``stem`` (conv3x3 C->widths[0] stride 1 without bias, BN,
    ReLU, and a 3x3 stride-2 max-pool when ``stem_pool``), ``layer1`` ...
    ``layerN`` (``depths[i]`` blocks of width ``widths[i]``; the first block of every
    stage but the first has stride 2), then global average pooling and ``fc``
    (Linear(widths[-1] -> K)).
    """

    output_layer: str = "fc"

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        *,
        widths: Sequence[int],
        depths: Sequence[int],
        stem_pool: bool,
    ) -> None:
        super().__init__()
        if len(widths) != len(depths) or not widths:
            raise ValueError(
                f"widths and depths must be non-empty and of equal length, "
                f"but got widths={tuple(widths)}, depths={tuple(depths)}"
            )
        stem: list[nn.Module] = [
            _conv3x3(in_channels, widths[0]),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        ]
        if stem_pool:
            stem.append(nn.MaxPool2d(3, stride=2, padding=1))
        self.stem = nn.Sequential(*stem)
        self._stage_names: tuple[str, ...] = tuple(f"layer{i + 1}" for i in range(len(widths)))
        in_planes = widths[0]
        for i, (name, width, depth) in enumerate(zip(self._stage_names, widths, depths)):
            strides = [1 if i == 0 else 2] + [1] * (depth - 1)
            blocks = []
            for stride in strides:
                blocks.append(BasicBlock(in_planes, width, stride))
                in_planes = width
            self.add_module(name, nn.Sequential(*blocks))
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for name in self._stage_names:
            x = getattr(self, name)(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _resnet18_supports(input_shape: InputShape) -> str | None:
    return min_side_reason(input_shape, 8, "three stride-2 stages")


def resnet18(input_shape: InputShape, num_classes: int) -> ResNet:
    """The CIFAR / Tiny-ImageNet ResNet-18 (FedAWA).

    Stages [2, 2, 2, 2] of widths 64/128/256/512 and strides 1/2/2/2. The stem
    max-pool is present only when H and W are at least 64 (the Tiny variant).

    >>> m = resnet18((3, 32, 32), 10)
    >>> any(isinstance(x, nn.MaxPool2d) for x in m.modules())
    False
    """
    ensure_supported("resnet18", _resnet18_supports, input_shape)
    channels, height, width = input_shape
    return ResNet(
        channels,
        num_classes,
        widths=(64, 128, 256, 512),
        depths=(2, 2, 2, 2),
        stem_pool=min(height, width) >= TINY_STEM_MIN_PX,
    )


def _resnet20_supports(input_shape: InputShape) -> str | None:
    return min_side_reason(input_shape, 8, "two stride-2 stages")


def resnet20(input_shape: InputShape, num_classes: int) -> ResNet:
    """The CIFAR ResNet-20 (FedAWA): 3 stages x 3 blocks, widths 16/32/64.

    >>> sum(p.numel() for p in resnet20((3, 32, 32), 10).parameters())
    272474
    """
    ensure_supported("resnet20", _resnet20_supports, input_shape)
    return ResNet(input_shape[0], num_classes, widths=(16, 32, 64), depths=(3, 3, 3), stem_pool=False)


def _resnet18_imagenet_supports(input_shape: InputShape) -> str | None:
    return min_side_reason(input_shape, 16, "the ImageNet stem downsamples by 4 before three stride-2 stages")


def resnet18_imagenet(input_shape: InputShape, num_classes: int) -> nn.Module:
    """torchvision ``resnet18(num_classes=K)`` with the ImageNet stem (cwFedAvg ``-m resnet``).

    For C != 3 input channels, ``conv1`` is replaced by a 7x7 stride-2 C->64 conv
    initialised the way torchvision initialises its convs. torchvision is imported
    here, not at module import, because importing it costs more than a second.
    The model's ``output_layer`` is set on the instance, as torchvision owns the class.
    """
    ensure_supported("resnet18_imagenet", _resnet18_imagenet_supports, input_shape)
    from torchvision.models import resnet18 as tv_resnet18

    model = tv_resnet18(weights=None, num_classes=num_classes)
    channels = input_shape[0]
    if channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, 7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.output_layer = "fc"
    return model


register_model(
    ModelSpec(
        name="resnet18",
        factory=resnet18,
        supports=_resnet18_supports,
        description="CIFAR/Tiny-ImageNet ResNet-18 (3x3 stem; stem max-pool from 64 px)",
    )
)
register_model(
    ModelSpec(
        name="resnet20",
        factory=resnet20,
        supports=_resnet20_supports,
        description="CIFAR ResNet-20 (3x3 BasicBlocks, widths 16/32/64)",
    )
)
register_model(
    ModelSpec(
        name="resnet18_imagenet",
        factory=resnet18_imagenet,
        supports=_resnet18_imagenet_supports,
        description="torchvision ResNet-18 with the ImageNet 7x7 stem and max-pool",
    )
)
