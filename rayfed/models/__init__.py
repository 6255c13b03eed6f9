"""Model zoo: registered architectures, the builder, and layer-group helpers.

Each architecture is a :class:`ModelSpec` registered in :data:`MODELS` under the
config value of ``model.name``:

========================  =====================================================
``cnn4``                  cwFedAvg 4-layer CNN (PFLlib ``FedAvgCNN``)
``cnn5``                  FedAWA 5-layer CNN
``resnet18``              CIFAR / Tiny-ImageNet ResNet-18 (FedAWA)
``resnet18_imagenet``     torchvision ResNet-18 (ImageNet stem; cwFedAvg)
``resnet20``              CIFAR ResNet-20 (FedAWA)
``fca_*``                 FedClassAvg's four client networks
``fedproto_cnn{18,20,22}`` FedProto's two-layer CNNs of three widths
``fasttext``              fastText-style text classifier (token sequences)
========================  =====================================================

Which paper uses which: docs/algorithms.md, the section of each algorithm.

A new architecture is one module that calls :func:`register_model` and is imported
below.

>>> import torch
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = build_model("cnn4", (1, 28, 28), 10)
>>> block_names(model), output_layer_name(model)
(['conv1', 'conv2', 'last_feat', 'fc'], 'fc')
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rayfed.models import (
    fedclassavg_nets,  # noqa: F401  (registers the fca_* models)
    fedproto_nets,  # noqa: F401  (registers the fedproto_cnn* models)
)
from rayfed.models._spec import MODELS, InputShape, ModelSpec, input_kind, register_model

# Importing a model module registers its models.
from rayfed.models.cnn import FedAvgCNN, FedAWACNN
from rayfed.models.resnet import ResNet, resnet18, resnet18_imagenet, resnet20
from rayfed.models.text import FastText
from rayfed.util.errors import ConfigError

__all__ = [
    "MODELS",
    "InputShape",
    "ModelSpec",
    "register_model",
    "input_kind",
    "build_model",
    "seeded_init",
    "output_layer_name",
    "block_names",
    "FedAvgCNN",
    "FedAWACNN",
    "FastText",
    "ResNet",
    "resnet18",
    "resnet18_imagenet",
    "resnet20",
]


def _check_input_shape(input_shape: object) -> InputShape:
    """Return ``input_shape`` as a tuple of positive ints, ``(C, H, W)`` or ``(L, V)``, or raise.

    Any integer type (``int``, NumPy integers, a ``torch.Size``'s entries) is accepted.
    """
    if isinstance(input_shape, (tuple, list)) and len(input_shape) in (2, 3):
        try:
            dims = [operator.index(d) for d in input_shape if not isinstance(d, bool)]
        except TypeError:
            dims = []
        if len(dims) == len(input_shape) and min(dims) > 0:
            return tuple(dims)
    raise ConfigError(
        "the dataset's input shape must be three positive ints (C, H, W) for images or two (L, V) "
        f"for token sequences, but got input_shape={input_shape!r}"
    )


_KIND_SHAPES = {"image": "images (C, H, W)", "tokens": "token sequences (L, V)"}
_INIT_LOCK = threading.Lock()


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Draw the body's random initialisations from ``seed`` alone.

    Torch's global CPU generator is forked and seeded for the body, so the models built in it
    depend only on ``seed`` and the caller's random stream is untouched; a lock keeps threads
    that build models at once (parallel tuning trials) from sharing the forked generator.
    """
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


def build_model(name: str, input_shape: InputShape, num_classes: int) -> nn.Module:
    """Build the registered model ``name`` for ``(C, H, W)`` or ``(L, V)`` inputs and ``num_classes`` outputs.

    Parameters are drawn from torch's global generator only, so calling
    ``torch.manual_seed(s)`` first makes the result reproducible.

    Raises
    ------
    ConfigError
        If ``name`` is not registered (the message lists the known models), if the
        model does not fit ``input_shape`` (the message names ``model.name``, the
        shape and what is allowed), or if ``num_classes < 2``.
    """
    spec = MODELS.get(name)
    shape = _check_input_shape(input_shape)
    try:
        classes = None if isinstance(num_classes, bool) else operator.index(num_classes)
    except TypeError:
        classes = None
    if classes is None or classes < 2:
        raise ConfigError(
            f"num_classes must be an int >= 2 for model.name={name!r}, but got num_classes={num_classes!r}"
        )
    kind = input_kind(shape)
    if kind != spec.input_kind:
        fitting = sorted(name for name in MODELS.names() if MODELS.get(name).input_kind == kind)
        raise ConfigError(
            f"model.name={name!r} ({spec.description}) takes {_KIND_SHAPES[spec.input_kind]}, but the "
            f"dataset gives {_KIND_SHAPES[kind]}, input_shape={shape}; set model.name to one of: {', '.join(fitting)}"
        )
    reason = spec.supports(shape)
    if reason is not None:
        raise ConfigError(
            f"model.name={name!r} ({spec.description}) does not fit the dataset's "
            f"input shape {_KIND_SHAPES[kind]}={shape}: {reason}"
        )
    return spec.factory(shape, classes)


def output_layer_name(model: nn.Module) -> str:
    """Name of the final Linear layer (K x h weight) whose rows define cwFedAvg's p-tilde.

    Reads the model's ``output_layer`` attribute ("fc" for every built-in model) and
    checks that it names an ``nn.Linear``; a model without the attribute falls back
    to its last ``nn.Linear`` in module order.
    """
    declared = getattr(model, "output_layer", None)
    if isinstance(declared, str):
        try:
            layer = model.get_submodule(declared)
        except AttributeError:
            layer = None
        if not isinstance(layer, nn.Linear):
            raise ConfigError(
                f"{type(model).__name__}.output_layer={declared!r} does not name an "
                f"nn.Linear submodule (found {type(layer).__name__})"
            )
        return declared
    last = None
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = module_name
    if last is None:
        raise ConfigError(
            f"{type(model).__name__} has no nn.Linear layer and no output_layer attribute, "
            "so its output layer is unknown"
        )
    return last


def block_names(model: nn.Module) -> list[str]:
    """Top-level children that hold parameters or buffers, in forward order.

    These are the blocks cwFedAvg's selective application counts: with ``-ncw m``
    the last ``m`` are class-wise (cwFedAvg, ICCV 2025, §4.3). Parameter-free children such as a
    top-level ReLU or pooling layer (torchvision's ResNet has them) are skipped.

    >>> block_names(FedAvgCNN((3, 32, 32), 10))
    ['conv1', 'conv2', 'last_feat', 'fc']
    """
    return [
        name
        for name, child in model.named_children()
        if any(True for _ in child.parameters()) or any(True for _ in child.buffers())
    ]
