"""What every part of a run knows about the problem before it starts: :class:`ProblemSpec`.

The spec is plain data (no torch), so a server half that needs nothing else runs in a
process without torch; :func:`rayfed.engine.problem_build.build_problem` makes it from the models.
Nothing client-private is in the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rayfed.train.layout import ParamLayout

if TYPE_CHECKING:
    import numpy as np

    from rayfed.data.held_out import HeldOutSet
    from rayfed.models import InputShape

__all__ = ["ProblemSpec"]


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
    train_sizes: np.ndarray | None = field(default=None, compare=False, repr=False)
    """n_i, every client's training-set size (M,), set by the engine from the partition: what a
    server learns from the uploads, for a server half that needs every client's before they upload
    (APPLE's p⁽⁰⁾). Workers do not get it (:meth:`for_clients`)."""

    def for_clients(self) -> ProblemSpec:
        """The spec the workers get: without the clients' sizes, and without the held-out set
        unless the clients may see it."""
        held_out = self.held_out if self.held_out is not None and self.held_out.shared else None
        if held_out is self.held_out and self.train_sizes is None:
            return self
        return replace(self, held_out=held_out, train_sizes=None)

    def architecture_of(self, client_id: int) -> str:
        if self.client_architectures:
            return self.client_architectures[client_id % len(self.client_architectures)]
        return self.default_architecture

    @property
    def homogeneous(self) -> bool:
        return len(self.layouts) == 1
