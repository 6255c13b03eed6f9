"""Building a run's problem: each architecture once, its :class:`~rayfed.train.problem.ProblemSpec` and
the common initial parameters (all clients of an architecture start from one initialisation,
drawn from the run seed, as in the papers' code).

The same builder runs on PyTorch's ``meta`` device where only the spec is wanted (the memory
estimate before a run starts, ``rayfed plot``): the models are laid out exactly, nothing is allocated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from rayfed.models import MODELS, InputShape, block_names, build_model, input_kind, output_layer_name, seeded_init
from rayfed.train.flat import FlatModel
from rayfed.train.problem import ProblemSpec
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check_choice

if TYPE_CHECKING:
    from rayfed.config import RunConfig

__all__ = ["DataShape", "ShapeOnly", "build_problem"]


class DataShape(Protocol):
    """What the models of a run need to know of its dataset (an ``ArrayDataset`` has it)."""

    @property
    def input_shape(self) -> InputShape: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def mean(self) -> Sequence[float]: ...
    @property
    def std(self) -> Sequence[float]: ...


@dataclass(frozen=True)
class ShapeOnly:
    """A dataset's shape without its samples: what the memory estimate and ``rayfed plot`` know."""

    input_shape: InputShape
    num_classes: int
    mean: Sequence[float] = ()
    std: Sequence[float] = ()


def build_problem(
    config: RunConfig, data: DataShape, *, device: str = "cpu"
) -> tuple[ProblemSpec, dict[str, np.ndarray]]:
    """Build every architecture once: the shared :class:`ProblemSpec` and the initial parameters.

    All clients of an architecture start from one common initialisation (as in the
    papers' code), drawn from the run seed: from its own stream (``model.init="derived"``), or,
    with ``model.init="torch_seed"``, right after ``torch.manual_seed(seed)``, where the cwFedAvg
    authors' code draws it. On ``device="meta"`` nothing is allocated: the
    spec is the same and the initial parameters are not drawn (the mapping is empty).
    """
    for name in config.model.client_models:  # named as the field they come from, not as model.name
        check_choice("model.client_models", name, MODELS.names())
    layouts, blocks, outputs, initial, buffer_layouts = {}, {}, {}, {}, {}
    for index, name in enumerate(config.model.architectures()):
        seed = config.seed if config.model.init == "torch_seed" else init_seed(config.seed, index)
        with seeded_init(seed), torch.device(device):
            module = build_model(name, data.input_shape, data.num_classes)
        flat = FlatModel(module)
        layouts[name], buffer_layouts[name] = flat.layout, flat.buffer_layout
        blocks[name], outputs[name] = tuple(block_names(module)), output_layer_name(module)
        if device != "meta":
            initial[name] = flat.state_numpy()
    spec = ProblemSpec(
        num_clients=config.data.num_clients,
        num_classes=data.num_classes,
        input_shape=data.input_shape,
        layouts=layouts,
        blocks=blocks,
        output_layer=outputs,
        client_architectures=config.model.client_models,
        default_architecture=config.model.name,
        seed=config.seed,
        mean=tuple(data.mean),
        std=tuple(data.std),
        input_kind=input_kind(data.input_shape),
        buffer_layouts=buffer_layouts,
        algorithm=config.algorithm.name,
        join_ratio=config.engine.join_ratio,
    )
    return spec, initial
