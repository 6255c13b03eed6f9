"""FedClassAvg's four client networks: shapes on MNIST and CIFAR inputs, the shared classifier."""

from __future__ import annotations

import pytest
import torch

from rayfed.models import build_model, output_layer_name
from rayfed.models.fedclassavg_nets import FEDCLASSAVG_MODELS
from rayfed.train.flat import FlatModel


@pytest.mark.parametrize("name", FEDCLASSAVG_MODELS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_network_gives_512_features_and_k_logits(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    x = torch.randn(4, *shape)
    model.train()
    z = model.features(x)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    assert z.shape == (4, 512) and logits.shape == (4, 10)
    assert output_layer_name(model) == "classifier.1"
    layout = FlatModel(model).layout
    assert layout.names[-2:] == ("classifier.1.weight", "classifier.1.bias")
    assert layout.shapes[-2:] == ((10, 512), (10,))


def test_one_channel_stems_replace_the_first_convolution() -> None:
    assert build_model("fca_resnet18", (1, 28, 28), 10).extractor.conv1.in_channels == 1
    assert build_model("fca_shufflenet", (1, 28, 28), 10).extractor.conv1[0].in_channels == 1
    assert build_model("fca_googlenet", (1, 28, 28), 10).extractor.conv1.conv.in_channels == 1
