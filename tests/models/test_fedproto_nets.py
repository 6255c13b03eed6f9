"""FedProto's two-layer CNNs: the authors' CNNMnist layers, one embedding width, the embedding read before dropout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rayfed.models import build_model, output_layer_name
from rayfed.models.fedproto_nets import EMBEDDING_DIM, FEDPROTO_MODELS
from rayfed.util.errors import ConfigError


@pytest.mark.parametrize("name,width", list(zip(FEDPROTO_MODELS, (18, 20, 22))))
def test_layers_are_the_authors_cnnmnist_with_their_conv2_width(name: str, width: int) -> None:
    model = build_model(name, (1, 28, 28), 10)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # CNNMnist: conv1 1->10 5x5, conv2 10->w 5x5, fc1 (w*4*4 = 320/20*w) -> 50, fc2 50 -> K.
    assert shapes == {
        "conv1.weight": (10, 1, 5, 5),
        "conv1.bias": (10,),
        "conv2.weight": (width, 10, 5, 5),
        "conv2.bias": (width,),
        "fc1.weight": (EMBEDDING_DIM, width * 16),
        "fc1.bias": (EMBEDDING_DIM,),
        "fc.weight": (10, EMBEDDING_DIM),
        "fc.bias": (10,),
    }
    assert output_layer_name(model) == "fc"


def test_output_layer_sees_the_embedding_before_its_dropout() -> None:
    # Prepare: capture what the output layer receives, in training mode (dropout active).
    torch.manual_seed(0)
    model = build_model("fedproto_cnn20", (1, 28, 28), 10).train()
    seen: list[torch.Tensor] = []
    model.fc.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    x = torch.randn(8, 1, 28, 28)
    # Execute: one forward with a fixed generator, then the same forward written out by hand.
    torch.manual_seed(1)
    logits = model(x)
    torch.manual_seed(1)
    h = F.relu(F.max_pool2d(model.conv1(x), 2))
    h = F.relu(F.max_pool2d(model.conv2_drop(model.conv2(h)), 2))
    embedding = F.relu(model.fc1(h.flatten(1)))
    expected = F.linear(F.dropout(embedding, 0.5, True), model.fc.weight, model.fc.bias)
    # Assert: the hook reads the embedding (no dropout zeros, no 2x scaling); dropout acts inside fc.
    torch.testing.assert_close(seen[0], embedding)
    torch.testing.assert_close(logits, expected)


def test_refuses_inputs_too_small_and_token_inputs() -> None:
    with pytest.raises(ConfigError, match="model.name|fedproto_cnn18"):
        build_model("fedproto_cnn18", (1, 8, 8), 10)
    with pytest.raises(ConfigError):
        build_model("fedproto_cnn18", (200, 1000), 4)
