"""Body/head splits: the shared machinery of FedPer, FedRep, FedBABU and LG-FedAvg.

These methods cut a model into a *body* (the feature extractor, its first top-level
blocks) and a *head* (its last ``head_blocks`` top-level blocks; 1 = the output layer)
and treat the two parts differently: one part is averaged by the server as FedAvg
averages whole models, the other stays with the client (FedPer, FedRep: the head;
LG-FedAvg: the body) or stays fixed at the common initialisation (FedBABU: the head).
See docs/algorithms.md, FedPer, FedRep, FedBABU and LG-FedAvg sections.

The cut goes through :func:`trailing_blocks`, the same block slicing that selects
cwFedAvg's class-wise blocks (:mod:`rayfed.algorithms.cwfedavg_params`), so "the last m
blocks" means one thing in every algorithm. Floating-point buffers (BatchNorm
statistics) follow the block they belong to.

* :class:`BodyHead`: where body and head lie in the state vector (parameters, then buffers).
* :func:`part_phase`: a phase of local SGD on one part with the other frozen (FedRep, FedBABU); on the head
  alone, when it is the output layer, the loop trains it on features computed once.
* :class:`PartialModels` / :class:`PartialClient` / :class:`PartialServer`: the message, the client and the
  server half of "average one part, keep the other".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture, trailing_blocks
from rayfed.algorithms.contributions import WeightedState, WeightedSum
from rayfed.algorithms.declarations import SharedBody, SharedBodyEvaluation
from rayfed.algorithms.hooks import HELD_BY_CLIENTS, ClientHalf, RoundContext, ServerHalf, Start
from rayfed.algorithms.private_uploads import ModelUpload
from rayfed.algorithms.sizing import StateSizes
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.phase import Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented
from rayfed.util.validation import check_int, fail

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = [
    "BodyHeadParams",
    "BodyHead",
    "split_body_head",
    "part_phase",
    "PartialModels",
    "PartialClient",
    "PartialServer",
]

HEAD_BLOCKS = "algorithm.params.head_blocks"
LOCAL_KEY = "local"
"""Key of a client's own part (its head, or its body for LG-FedAvg) in its state."""


def _trailing_buffers(layout: ParamLayout, head: Sequence[str]) -> slice:
    """The buffers of the ``head`` blocks, which follow every body buffer (empty when none)."""
    owned = [i for i, n in enumerate(layout.names) if any(n.startswith(b + ".") for b in head)]
    start = layout.offsets[owned[0]] if owned else layout.size
    return slice(start, layout.size)


@dataclass(frozen=True)
class BodyHeadParams:
    """The split every body/head method shares: how many trailing blocks form the head."""

    head_blocks: int = documented(
        1,
        "How many of the model's last top-level blocks form the head (1 = the output layer, the split FedRep "
        "and FedBABU use and PFLlib uses for all four methods); the other blocks form the body. Both must be "
        "non-empty.",
    )

    def __post_init__(self) -> None:
        check_int(HEAD_BLOCKS, self.head_blocks, low=1)


@dataclass(frozen=True)
class BodyHead:
    """Body and head of one architecture as slices of its state vector (parameters, then buffers)."""

    body: tuple[slice, ...]
    head: tuple[slice, ...]
    head_params: slice
    """The head's parameters, in parameter-vector coordinates (for freezing)."""
    body_params: slice
    output_params: slice
    """The output layer's weight and bias, in parameter-vector coordinates."""
    output_shape: tuple[int, int]
    state_size: int

    def part(self, name: str) -> tuple[slice, ...]:
        """``"body"`` or ``"head"``."""
        return self.body if name == "body" else self.head

    @staticmethod
    def size(part: tuple[slice, ...]) -> int:
        return sum(s.stop - s.start for s in part)

    @staticmethod
    def gather(state: Any, part: tuple[slice, ...]) -> Any:
        """The values of ``part`` in ``state`` (a numpy array, or a tensor on a worker's device), concatenated."""
        if isinstance(state, torch.Tensor):
            return torch.cat([state[s] for s in part])
        return np.concatenate([np.asarray(state[s], dtype=np.float32) for s in part])

    @staticmethod
    def scatter(state: np.ndarray, part: tuple[slice, ...], values: np.ndarray) -> None:
        """Write ``values`` (as :meth:`gather` returns them) into ``part`` of ``state``, in place."""
        offset = 0
        for s in part:
            size = s.stop - s.start
            state[s] = values[offset : offset + size]
            offset += size

    @property
    def head_is_output_layer(self) -> bool:
        """True if the head holds exactly the output layer's weight and bias and no buffers."""
        return self.head == (self.output_params,)


def other_part(name: str) -> str:
    """``"head"`` for ``"body"`` and ``"body"`` for ``"head"``: the part a client keeps when the other is averaged."""
    return "head" if name == "body" else "body"


def split_body_head(spec: ProblemSpec, architecture: str, head_blocks: int) -> BodyHead:
    """Cut ``architecture`` into body and the last ``head_blocks`` blocks; ConfigError naming
    ``algorithm.params.head_blocks`` if that leaves the body or the head empty."""
    layout, blocks = spec.layouts[architecture], tuple(spec.blocks[architecture])
    if not 1 <= head_blocks < len(blocks):
        fail(
            HEAD_BLOCKS,
            head_blocks,
            f"between 1 and {len(blocks) - 1} for {spec.algorithm or 'this algorithm'}, so that body and head are "
            f"both non-empty: model {architecture!r} has {len(blocks)} top-level blocks ({', '.join(blocks)})",
        )
    head_params = trailing_blocks(layout, blocks, head_blocks)
    buffers = spec.buffer_layouts.get(architecture, ParamLayout((), (), (0,)))
    head_buffers = _trailing_buffers(buffers, blocks[-head_blocks:])
    p = layout.size

    def shifted(s: slice) -> slice:
        return slice(p + s.start, p + s.stop)

    def nonempty(*parts: slice) -> tuple[slice, ...]:
        return tuple(s for s in parts if s.stop > s.start)

    body_params = slice(0, head_params.start)
    output = spec.output_layer[architecture]
    weight, bias = layout.index(f"{output}.weight"), layout.index(f"{output}.bias")
    shape = layout.shapes[layout.names.index(f"{output}.weight")]
    return BodyHead(
        body=nonempty(body_params, shifted(slice(0, head_buffers.start))),
        head=nonempty(head_params, shifted(head_buffers)),
        head_params=head_params,
        body_params=body_params,
        output_params=slice(weight.start, bias.stop),
        output_shape=(int(shape[0]), int(shape[-1])),
        state_size=p + buffers.size,
    )


# --- training one part with the other frozen ---------------------------------------------------


def part_phase(part: slice, epochs: int) -> Phase:
    """``epochs`` epochs of the run's local SGD on the parameters in ``part`` only; the rest stays exactly as
    it is (no gradient step, no weight decay). A fresh momentum buffer, as a new optimiser."""
    return Phase(epochs=epochs, trains=(part.start, part.stop))


# --- "average one part, keep the other": broadcast and server ------------------------------------


@dataclass(frozen=True)
class PartialModels:
    """The message of "average one part, keep the other": the averaged part (``shared``), the common initialisation
    of the other part, and the split. A client's model is ``shared`` in the averaged part and its own values in
    the other part (its persisted ones when ``keep_local``, else the initial ones: FedBABU's fixed head)."""

    shared: np.ndarray
    initial_local: np.ndarray = field(metadata=HELD_BY_CLIENTS)
    split: BodyHead
    shared_part: str
    """``"body"`` (FedPer, FedRep, FedBABU) or ``"head"`` (LG-FedAvg)."""
    keep_local: bool

    @property
    def local_part(self) -> str:
        return other_part(self.shared_part)

    def model_state(self, local: np.ndarray) -> np.ndarray:
        """The full state vector: ``shared`` in the averaged part, ``local`` in the other."""
        state = np.empty(self.split.state_size, dtype=np.float32)
        self.split.scatter(state, self.split.part(self.shared_part), self.shared)
        self.split.scatter(state, self.split.part(self.local_part), local)
        return state


class PartialClient(ClientHalf[Any, PartialModels], SharedBodyEvaluation):
    """The client of "average one part, keep the other": it starts from the global part and its own part, trains
    both (FedPer, LG-FedAvg) and sends the averaged part, weighted by n_i, keeping the other (or dropping it:
    FedBABU)."""

    @staticmethod
    def local_values(message: PartialModels, job: ClientJob) -> np.ndarray:
        """The client's own part: persisted, or the common initialisation for a client that has not trained."""
        if message.keep_local and job.state is not None and LOCAL_KEY in job.state:
            return np.asarray(job.state[LOCAL_KEY])
        return message.initial_local

    def start(self, message: PartialModels, job: ClientJob) -> Start:
        """The global part from the server, the client's own part from its state."""
        return Start(message.model_state(self.local_values(message, job)))

    def upload(self, message: PartialModels, job: ClientJob) -> WeightedState:
        """The trained averaged part, weighted by n_i; the other part is kept (or dropped: FedBABU)."""
        split = message.split
        if message.keep_local:
            job.state = {LOCAL_KEY: split.gather(job.trained, split.part(message.local_part))}
        return WeightedState(split.part(message.shared_part))

    def shared_body(self, message: PartialModels, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """When the body is averaged and each client's own part is just the output layer, every evaluation model is
        one body with a client's output layer: evaluate the body once."""
        split = message.split
        if message.shared_part != "body" or not split.head_is_output_layer:
            return None
        k, h = split.output_shape
        state = message.model_state(message.initial_local)
        heads = np.stack([self.local_values(message, job) for job in jobs])
        return SharedBody(state, heads[:, : k * h].reshape(len(jobs), k, h), heads[:, k * h :])


class PartialServer(StateSizes, ModelUpload, ServerHalf[Any, WeightedSum]):
    """Keeps the averaged part of the one architecture; averages the uploads as FedAvg does. Its upload is that
    part of the model, which every client starts from (:class:`ModelUpload`): with privacy on it is clipped and
    noised whole; the part each client keeps never leaves it and needs no noise.

    Subclasses set :attr:`shared_part` and :attr:`keep_local`.
    """

    shared_part: ClassVar[str] = "body"
    keep_local: ClassVar[bool] = True

    @classmethod
    def validate(cls, params: Any, spec: ProblemSpec) -> None:
        """One architecture, with more top-level blocks than ``head_blocks``."""
        split_body_head(spec, require_homogeneous(spec), params.head_blocks)

    @classmethod
    def client_state_bytes(cls, params: Any, spec: ProblemSpec, train: TrainConfig) -> int:
        """The part each client keeps (the one not averaged), with ``keep_local``; else nothing."""
        if not cls.keep_local:
            return 0
        split = split_body_head(spec, require_homogeneous(spec), params.head_blocks)
        return 4 * split.size(split.part(other_part(cls.shared_part)))

    def __init__(self, params: Any, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        self.split = split_body_head(spec, sole_architecture(spec), params.head_blocks)
        state = np.asarray(initial[sole_architecture(spec)], dtype=np.float32)
        local_part = other_part(self.shared_part)
        self.shared = self.split.gather(state, self.split.part(self.shared_part))
        self.initial_local = self.split.gather(state, self.split.part(local_part))

    def privacy_reference(self) -> np.ndarray:
        """The averaged part the round's clients started from (:class:`ModelUpload`)."""
        return self.shared

    def broadcast(self) -> PartialModels:
        return PartialModels(self.shared, self.initial_local, self.split, self.shared_part, self.keep_local)

    def aggregate(self, ctx: RoundContext, contribution: WeightedSum) -> dict[str, float]:
        """The averaged part ← Σ_i n_i θ_i^part / Σ_i n_i over the clients that uploaded."""
        self.shared = contribution.average()
        return {"clients_aggregated": float(contribution.count)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"shared": self.shared}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.shared = np.array(state["shared"], dtype=np.float32)
