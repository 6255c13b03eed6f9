"""Tests of rayfed.models: shapes, layer names, parameter counts, validation, seeding."""

from __future__ import annotations

import doctest
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import rayfed.models
import rayfed.models._spec
import rayfed.models.cnn
import rayfed.models.resnet
from rayfed.models import (
    MODELS,
    FedAvgCNN,
    FedAWACNN,
    block_names,
    build_model,
    output_layer_name,
)
from rayfed.util.errors import ConfigError

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
TINY = (3, 64, 64)
ALL_MODELS = ["cnn4", "cnn5", "resnet18", "resnet18_imagenet", "resnet20"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    # These tensors are tiny; with two intra-op threads on a busy 2-core machine, each
    # OpenMP barrier waits for a descheduled thread and a ResNet-20 forward on 2 images
    # took 1.2 s instead of 7 ms. One thread avoids the contention; restored after.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _build(name: str, shape: tuple[int, int, int], k: int = 10, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(name, shape, k)


def test_registry_lists_every_model() -> None:
    from rayfed.models.fedclassavg_nets import FEDCLASSAVG_MODELS  # tested in test_fedclassavg_nets.py
    from rayfed.models.fedproto_nets import FEDPROTO_MODELS  # tested in test_fedproto_nets.py

    text = ["fasttext", "fasttext_pfllib"]  # tested in tests/data/test_agnews.py
    assert MODELS.names() == sorted([*ALL_MODELS, *FEDCLASSAVG_MODELS, *FEDPROTO_MODELS, *text])


@pytest.mark.parametrize("shape", [MNIST, CIFAR, TINY], ids=["1x28x28", "3x32x32", "3x64x64"])
@pytest.mark.parametrize("name", ALL_MODELS)
def test_forward_gives_batch_by_classes_logits(name: str, shape: tuple[int, int, int]) -> None:
    # Prepare
    model = _build(name, shape, k=7)
    x = torch.randn(2, *shape)
    # Execute
    with torch.no_grad():
        y = model(x)
    # Assert
    assert y.shape == (2, 7)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize(("shape", "flat"), [(MNIST, 1024), (CIFAR, 1600), (TINY, 10816)])
def test_cnn4_flatten_size_follows_input_shape(shape: tuple[int, int, int], flat: int) -> None:
    model = _build("cnn4", shape)
    assert model.last_feat[0].in_features == flat
    assert model.last_feat[0].out_features == 512


def test_cnn4_children_are_the_cwfedavg_blocks() -> None:
    model = _build("cnn4", CIFAR)
    assert isinstance(model, FedAvgCNN)
    assert block_names(model) == ["conv1", "conv2", "last_feat", "fc"]
    assert [type(m) for m in model.conv1] == [nn.Conv2d, nn.ReLU, nn.MaxPool2d]
    conv = model.conv1[0]
    assert (conv.kernel_size, conv.padding, conv.bias is not None) == ((5, 5), (0, 0), True)


def test_cnn4_output_layer_is_k_by_512() -> None:
    model = _build("cnn4", MNIST, k=10)
    name = output_layer_name(model)
    assert name == "fc"
    assert model.get_submodule(name).weight.shape == (10, 512)


def test_cnn5_matches_fedawa_layout_on_cifar() -> None:
    model = _build("cnn5", CIFAR, k=100)
    assert isinstance(model, FedAWACNN)
    assert block_names(model) == ["conv1", "conv2", "conv3", "last_feat", "fc"]
    assert model.last_feat[0].in_features == 64 * 4 * 4
    assert model.fc.weight.shape == (100, 64)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_every_model_declares_fc_as_output_layer(name: str) -> None:
    model = _build(name, CIFAR, k=10)
    assert output_layer_name(model) == "fc"
    assert model.fc.weight.shape[0] == 10


def test_resnet20_has_about_027m_parameters() -> None:
    model = _build("resnet20", CIFAR, k=10)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.26e6 < n_params < 0.28e6
    assert block_names(model) == ["stem", "layer1", "layer2", "layer3", "fc"]


def _has_maxpool(model: nn.Module) -> bool:
    return any(isinstance(m, nn.MaxPool2d) for m in model.modules())


def test_resnet18_stem_pools_only_from_64_px() -> None:
    assert not _has_maxpool(_build("resnet18", CIFAR))
    assert _has_maxpool(_build("resnet18", TINY))


def test_resnet18_stem_is_3x3_stride_1() -> None:
    conv = _build("resnet18", TINY).stem[0]
    assert (conv.kernel_size, conv.stride, conv.bias) == ((3, 3), (1, 1), None)


def test_resnet18_imagenet_adapts_conv1_to_grey_input() -> None:
    model = _build("resnet18_imagenet", MNIST)
    assert model.conv1.in_channels == 1
    assert model.conv1.kernel_size == (7, 7)
    assert block_names(model) == ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc"]


def test_unknown_name_lists_known_models() -> None:
    with pytest.raises(ConfigError) as info:
        build_model("cnn44", CIFAR, 10)
    message = str(info.value)
    assert "model.name='cnn44'" in message
    assert "cnn4" in message and "resnet20" in message


def test_too_small_input_names_field_model_and_allowed_shapes() -> None:
    with pytest.raises(ConfigError) as info:
        build_model("cnn4", (1, 8, 8), 10)
    message = str(info.value)
    assert "model.name='cnn4'" in message
    assert "(1, 8, 8)" in message
    assert "H and W >= 16" in message


@pytest.mark.parametrize("bad_shape", [(28, 28), (0, 28, 28), (1, 28.0, 28), (True, 28, 28), "1x28x28"])
def test_malformed_input_shape_is_rejected(bad_shape: object) -> None:
    with pytest.raises(ConfigError, match="input_shape="):
        build_model("cnn4", bad_shape, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1, 0, -3, 2.0])
def test_fewer_than_two_or_non_int_classes_are_rejected(k: object) -> None:
    with pytest.raises(ConfigError, match=f"num_classes={k}"):
        build_model("cnn4", MNIST, k)  # type: ignore[arg-type]


def test_numpy_and_torch_integers_are_accepted() -> None:
    numpy_shape = (np.int64(1), np.int64(28), np.int64(28))
    model = build_model("cnn4", numpy_shape, np.int64(10))  # type: ignore[arg-type]
    assert model.last_feat[0].in_features == 1024
    assert build_model("cnn4", torch.Size(MNIST), 10).fc.out_features == 10


def test_constructing_directly_with_bad_shape_raises() -> None:
    with pytest.raises(ConfigError, match="FedAWACNN"):
        FedAWACNN((3, 16, 16), 10)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_same_seed_gives_identical_parameters(name: str) -> None:
    first = _build(name, CIFAR, seed=3).state_dict()
    second = _build(name, CIFAR, seed=3).state_dict()
    other = _build(name, CIFAR, seed=4).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert not torch.equal(first["fc.weight"], other["fc.weight"])


def test_output_layer_name_falls_back_to_last_linear() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    assert output_layer_name(model) == "2"


def test_output_layer_name_rejects_a_wrong_declaration() -> None:
    class Broken(nn.Module):
        output_layer = "head"

        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

    with pytest.raises(ConfigError, match="output_layer='head'"):
        output_layer_name(Broken())


@pytest.mark.parametrize(
    "module",
    [rayfed.models, rayfed.models._spec, rayfed.models.cnn, rayfed.models.resnet],
    ids=lambda m: m.__name__,
)
def test_docstring_examples_run(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.failed == 0


def test_importing_models_does_not_import_torchvision() -> None:
    # torchvision costs over a second to import; only resnet18_imagenet needs it. The
    # parent package is stubbed so that only rayfed.models' own imports are measured.
    package_dir = str(Path(rayfed.models.__file__).resolve().parent.parent)
    code = (
        "import sys, types\n"
        "package = types.ModuleType('rayfed')\n"
        f"package.__path__ = [{package_dir!r}]\n"
        "sys.modules['rayfed'] = package\n"
        "import rayfed.models\n"
        "print('torchvision' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
