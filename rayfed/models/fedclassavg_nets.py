"""FedClassAvg's heterogeneous client networks: an extractor F_k and the shared classifier C.

Jang et al., "FedClassAvg: Local Representation Learning for Personalized Federated
Learning on Heterogeneous Neural Networks", ICPP 2022, arXiv:2210.14226 ("P-FCA" below;
docs/algorithms.md, FedClassAvg section).
Every client model is f_k = C ∘ F_k:

* ``extractor`` (F_k) maps an image to a 512-d feature z. Its last layer is a *linear*
  projection (``fcin``; ``fcout`` for the AlexNet-style net, as the authors name it), with
  no activation after it, so FedClassAvg's contrastive loss sees the raw projection.
* ``classifier`` (C) is ``Sequential(ReLU, Linear(512 -> K))``, identical in every
  architecture; only its weight (K x 512) and bias (K) are exchanged. Its linear layer
  is the model's ``output_layer``, ``"classifier.1"``.

========================  ===============================================================
``fca_resnet18``          torchvision ``resnet18``, ``fc`` -> Linear(512 -> 512) ``fcin``
``fca_shufflenet``        torchvision ``shufflenet_v2_x1_0``, ``fc`` -> Linear(1024 -> 512)
``fca_googlenet``         torchvision ``googlenet(init_weights=True)``, ``fc`` -> Linear(1024 -> 512);
                          auxiliary heads present (1000-way, as built by the authors' code) but unused
``fca_alexnet``           the authors' small AlexNet-style net (``models.alexnet_mnist``)
========================  ===============================================================

As in the authors' ``supcon_utils.define_model``, the torchvision networks are built with
their own initialisation, then the projection (and, for 1-channel data, the first
convolution) is replaced by a freshly built layer with PyTorch's default initialisation:
ResNet-18's ``conv1`` by 1->64 7x7/2 pad 3, ShuffleNetV2's ``conv1[0]`` by 1->24 3x3/2
pad 1, GoogLeNet's ``conv1.conv`` by 1->64 7x7/2 pad 3 (all without bias). Other channel
counts C != 3 are handled the same way.

Input sizes. All four run unchanged on 1x28x28 and 3x32x32, with no adaptation: the
ImageNet stems reduce 28 px to 7 px before the stages, so ResNet-18's and ShuffleNetV2's
last stages and GoogLeNet's ``inception4*``/``inception5*`` blocks see 1x1 maps (their
ceil-mode max-pools never produce an empty map), and the global average pools make the
feature size independent of the input. GoogLeNet's auxiliary heads pool to 4x4
adaptively, so they also run (in training mode) on those small maps. The smallest side
accepted is 16 px (checked by :func:`build_model`).

torchvision is imported inside the factories: importing it costs more than a second.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import nn

from rayfed.models._spec import InputShape, ModelSpec, ensure_supported, min_side_reason, register_model

__all__ = [
    "FEATURE_DIM",
    "FEDCLASSAVG_MODELS",
    "FedClassAvgNet",
    "AlexNetSmall",
    "fca_resnet18",
    "fca_shufflenet",
    "fca_googlenet",
    "fca_alexnet",
]

FEATURE_DIM = 512
"""Width of the feature z = F_k(x) in every architecture (the classifier's input)."""

FEDCLASSAVG_MODELS = ("fca_resnet18", "fca_shufflenet", "fca_googlenet", "fca_alexnet")
"""The paper's client architectures, in the order client c gets ``FEDCLASSAVG_MODELS[c % 4]``
(FedClassAvg, ICPP 2022, §4.2 and Table 2): pass as ``model.client_models``."""

_MIN_PX = 16


class FedClassAvgNet(nn.Module):
    """f = C ∘ F: an ``extractor`` producing ``feature_dim`` features and the shared ``classifier``.

    ``features(x)`` returns z = F(x) (the extractor's main output; GoogLeNet's auxiliary
    outputs are dropped); ``forward(x)`` returns the logits C(z).
    """

    output_layer: str = "classifier.1"

    def __init__(self, extractor: nn.Module, num_classes: int, feature_dim: int = FEATURE_DIM) -> None:
        super().__init__()
        self.extractor = extractor
        self.classifier = nn.Sequential(nn.ReLU(), nn.Linear(feature_dim, num_classes))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.extractor(x)
        # torchvision's GoogLeNet returns (logits, aux2, aux1) in training mode.
        return out.logits if hasattr(out, "logits") else out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class AlexNetSmall(nn.Module):
    """The authors' AlexNet-style extractor for small images (``models.alexnet_mnist``).

    conv3x3 C->64 'same', ReLU, MaxPool(2, s1, p1); conv3x3 64->128 'same', ReLU,
    MaxPool(2, s2, p1); conv3x3 128->256 'same', ReLU; AdaptiveAvgPool 3x3, flatten
    (2304); ``fc``: Dropout 0.5, ``fcin`` Linear(2304->512), ReLU, ``fcout``
    Linear(512->512). One linear layer deeper than the other extractors.

    >>> AlexNetSmall(1)(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 512])
    """

    def __init__(self, in_channels: int, feature_dim: int = FEATURE_DIM) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2, stride=1, padding=1)
        )
        self.conv2 = nn.Sequential(nn.Conv2d(64, 128, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2, padding=1))
        self.conv3 = nn.Sequential(nn.Conv2d(128, 256, 3, padding="same"), nn.ReLU())
        self.avgpool = nn.AdaptiveAvgPool2d((3, 3))
        self.fc = nn.Sequential(
            OrderedDict(
                [
                    ("drop1", nn.Dropout(p=0.5)),
                    ("fcin", nn.Linear(256 * 3 * 3, 512)),
                    ("relu", nn.ReLU()),
                    ("fcout", nn.Linear(512, feature_dim)),
                ]
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.conv3(self.conv2(self.conv1(x))))
        return self.fc(torch.flatten(x, 1))


def _supports(input_shape: InputShape) -> str | None:
    return min_side_reason(input_shape, _MIN_PX, "ImageNet-style stems and stride-2 stages")


def _projection(in_features: int) -> nn.Sequential:
    """The authors' ``fc = Sequential(fcin=Linear(in -> 512))``: a linear projection, no activation."""
    return nn.Sequential(OrderedDict([("fcin", nn.Linear(in_features, FEATURE_DIM))]))


def _stem(in_channels: int, out_channels: int, kernel: int) -> nn.Conv2d:
    """A first convolution for C != 3 inputs, stride 2, 'same'-style padding, no bias (default init)."""
    return nn.Conv2d(in_channels, out_channels, kernel, stride=2, padding=kernel // 2, bias=False)


def fca_resnet18(input_shape: InputShape, num_classes: int) -> FedClassAvgNet:
    """torchvision ResNet-18 (ImageNet stem) with ``fc`` = Linear(512 -> 512) ``fcin``.

    >>> sum(p.numel() for p in fca_resnet18((1, 28, 28), 10).parameters())
    11438026
    """
    ensure_supported("fca_resnet18", _supports, input_shape)
    from torchvision.models import resnet18

    net = resnet18(weights=None)
    net.fc = _projection(512)
    if input_shape[0] != 3:
        net.conv1 = _stem(input_shape[0], 64, 7)
    return FedClassAvgNet(net, num_classes)


def fca_shufflenet(input_shape: InputShape, num_classes: int) -> FedClassAvgNet:
    """torchvision ShuffleNetV2 x1.0 with ``fc`` = Linear(1024 -> 512) ``fcin``."""
    ensure_supported("fca_shufflenet", _supports, input_shape)
    from torchvision.models import shufflenet_v2_x1_0

    net = shufflenet_v2_x1_0(weights=None)
    net.fc = _projection(1024)
    if input_shape[0] != 3:
        net.conv1[0] = _stem(input_shape[0], 24, 3)
    return FedClassAvgNet(net, num_classes)


def fca_googlenet(input_shape: InputShape, num_classes: int) -> FedClassAvgNet:
    """torchvision GoogLeNet (``init_weights=True``, auxiliary heads kept) with ``fc`` = Linear(1024 -> 512).

    The auxiliary heads are built as the authors' code builds them (1000-way outputs)
    and run in training mode, but their outputs are never used, so their parameters get
    no gradient and never change; they exist for fidelity of the parameter count and of
    the initialisation's random stream.
    """
    ensure_supported("fca_googlenet", _supports, input_shape)
    from torchvision.models import googlenet

    net = googlenet(weights=None, init_weights=True, aux_logits=True)
    net.fc = _projection(1024)
    if input_shape[0] != 3:
        net.conv1.conv = _stem(input_shape[0], 64, 7)
    return FedClassAvgNet(net, num_classes)


def fca_alexnet(input_shape: InputShape, num_classes: int) -> FedClassAvgNet:
    """The authors' small AlexNet-style extractor (:class:`AlexNetSmall`) and the shared classifier."""
    ensure_supported("fca_alexnet", _supports, input_shape)
    return FedClassAvgNet(AlexNetSmall(input_shape[0]), num_classes)


_FACTORIES: tuple[tuple[str, Callable[[InputShape, int], nn.Module], str, str], ...] = (
    ("fca_resnet18", fca_resnet18, "FedClassAvg ResNet-18 extractor (torchvision) + shared classifier", ""),
    (
        "fca_shufflenet",
        fca_shufflenet,
        "FedClassAvg ShuffleNetV2 x1.0 extractor (torchvision) + shared classifier",
        "its blocks split, concatenate and shuffle channels",
    ),
    (
        "fca_googlenet",
        fca_googlenet,
        "FedClassAvg GoogLeNet extractor (torchvision, aux heads unused) + classifier",
        "its Inception blocks concatenate channels",
    ),
    ("fca_alexnet", fca_alexnet, "FedClassAvg small AlexNet-style extractor + shared classifier", ""),
)

for _name, _factory, _description, _unstackable in _FACTORIES:
    register_model(
        ModelSpec(name=_name, factory=_factory, supports=_supports, description=_description, unstackable=_unstackable)
    )
