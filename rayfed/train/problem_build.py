"""Building a run's problem: each architecture once, its :class:`~rayfed.train.problem.ProblemSpec` and
the common initial parameters (all clients of an architecture start from one initialisation,
drawn from the run seed, as in the papers' code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rayfed.models import block_names, build_model, input_kind, output_layer_name, seeded_init
from rayfed.train.flat import FlatModel
from rayfed.train.problem import ProblemSpec
from rayfed.util.seeding import init_seed

if TYPE_CHECKING:
    from rayfed.config import RunConfig
    from rayfed.data import ArrayDataset

__all__ = ["build_problem"]


def build_problem(config: RunConfig, dataset: ArrayDataset) -> tuple[ProblemSpec, dict[str, np.ndarray]]:
    """Build every architecture once: the shared :class:`ProblemSpec` and the initial parameters.

    All clients of an architecture start from one common initialisation (as in the
    papers' code), drawn from the run seed.
    """
    layouts, blocks, outputs, initial, buffer_layouts = {}, {}, {}, {}, {}
    for index, name in enumerate(config.model.architectures()):
        with seeded_init(init_seed(config.seed, index)):
            module = build_model(name, dataset.input_shape, dataset.num_classes)
        flat = FlatModel(module)
        layouts[name], initial[name] = flat.layout, flat.state_numpy()
        buffer_layouts[name] = flat.buffer_layout
        blocks[name], outputs[name] = tuple(block_names(module)), output_layer_name(module)
    spec = ProblemSpec(
        num_clients=config.data.num_clients,
        num_classes=dataset.num_classes,
        input_shape=dataset.input_shape,
        layouts=layouts,
        blocks=blocks,
        output_layer=outputs,
        client_architectures=config.model.client_models,
        default_architecture=config.model.name,
        seed=config.seed,
        mean=tuple(dataset.mean),
        std=tuple(dataset.std),
        input_kind=input_kind(dataset.input_shape),
        buffer_layouts=buffer_layouts,
        algorithm=config.algorithm.name,
        join_ratio=config.engine.join_ratio,
    )
    return spec, initial
