"""What every part of a run knows about the problem before it starts: :class:`ProblemSpec`.

:func:`build_problem` builds each architecture of the run once, records its parameter
layout, block names and output layer in the spec, and returns the common initial
parameters (all clients of an architecture start from one initialisation, drawn from the
run seed, as in the papers' code). Nothing client-private is in the spec.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from rayfed.flat import FlatModel, ParamLayout
from rayfed.models import InputShape, block_names, build_model, input_kind, output_layer_name
from rayfed.seeding import init_seed

if TYPE_CHECKING:
    from rayfed.config import RunConfig
    from rayfed.data import ArrayDataset
    from rayfed.data.held_out import HeldOutSet

__all__ = ["ProblemSpec", "build_problem"]

_INIT_LOCK = threading.Lock()


@dataclass(frozen=True)
class ProblemSpec:
    """What both halves know about the run before it starts; nothing client-private.

    ``layouts`` maps each architecture to its parameter layout; ``blocks`` to its
    top-level block names (for selective, per-layer algorithms); ``output_layer`` to
    the name of its final linear layer.
    """

    num_clients: int
    num_classes: int
    input_shape: InputShape
    """One sample's input shape: (C, H, W) of an image, or (L, V) of a token sequence."""
    layouts: Mapping[str, ParamLayout]
    blocks: Mapping[str, tuple[str, ...]]
    output_layer: Mapping[str, str]
    client_architectures: tuple[str, ...] = ()
    """Architecture per client; empty when every client has ``default_architecture``."""
    default_architecture: str = ""
    algorithm: str = ""
    """The run's ``algorithm.name``, so a half's errors name the algorithm the user chose."""
    seed: int = 0
    """The run's training seed (``RunConfig.seed``), e.g. for per-client initialisations."""
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    """Per-channel statistics the workers normalise inputs with (to undo before augmenting)."""
    input_kind: str = "image"
    """``"image"`` or ``"tokens"`` (:func:`rayfed.models.input_kind`): an algorithm that only
    makes sense for images (augmentations) refuses token sequences in its ``validate``."""
    buffer_layouts: Mapping[str, ParamLayout] = field(default_factory=dict)
    """Each architecture's floating-point buffers (BatchNorm statistics), laid out after its
    parameters in the state vector (``FlatModel.state_numpy``); empty if unknown."""
    join_ratio: float = 1.0
    """``engine.join_ratio``: below 1, only part of the clients train each round, so an
    algorithm that needs every client every round refuses it in its ``validate``."""
    held_out: HeldOutSet | None = field(default=None, compare=False, repr=False)
    """Server data no client owns (FedLAW's proxy set, KT-pFL's public set), carved out of the
    pool by the engine when the server half asks for it (:mod:`rayfed.data.held_out`)."""

    def for_clients(self) -> ProblemSpec:
        """The spec the workers get: without the held-out set unless the clients may see it."""
        if self.held_out is None or self.held_out.shared:
            return self
        return replace(self, held_out=None)

    def architecture_of(self, client_id: int) -> str:
        if self.client_architectures:
            return self.client_architectures[client_id % len(self.client_architectures)]
        return self.default_architecture

    @property
    def homogeneous(self) -> bool:
        return len(self.layouts) == 1



def build_problem(config: RunConfig, dataset: ArrayDataset) -> tuple[ProblemSpec, dict[str, np.ndarray]]:
    """Build every architecture once: the shared :class:`ProblemSpec` and the initial parameters.

    All clients of an architecture start from one common initialisation (as in the
    papers' code), drawn from the run seed.
    """
    layouts, blocks, outputs, initial, buffer_layouts = {}, {}, {}, {}, {}
    for index, name in enumerate(config.model.architectures()):
        with _INIT_LOCK, torch.random.fork_rng(devices=[]):  # trials may build models in parallel threads
            torch.manual_seed(init_seed(config.seed, index))
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
