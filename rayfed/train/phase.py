"""What a method declares about its local training: phases, their optimiser, and a few hooks.

A client's local work in one round is a short list of :class:`Phase` objects. FedAvg's is one phase of
``train.local_epochs`` epochs of SGD on cross-entropy; FedRep's a phase on the head and one on the body;
Ditto's a phase on the personal model and one on the global model; KT-pFL's a distillation on the
public set, then local training. The one loop (:mod:`rayfed.train.loop`) runs every phase of every
method, one client at a time or many clients stacked, and replays its steps from CUDA graphs: a method
written as phases is on the fast path without code of its own for it.

A phase names what it trains (all parameters, or a contiguous range: a head, a body), on which samples
(the client's training split, or inputs it brings: a public set), for how many epochs of which batches,
with which optimiser (:class:`SGD`, :class:`Adam`, or :class:`NoStep` when its hooks move the model), and
which model (the round's, or one the client keeps in its state: Ditto's personal model). Its hooks are
pure functions of *one* client's tensors, named as in PyTorch Lightning:

* ``loss(out, batch, params, constants)``: a term added to the cross-entropy of the logits (or, with
  ``cross_entropy=False``, the whole loss), from the logits and, when the phase asks, the features the
  output layer reads (:class:`Outputs`), the batch's targets (:class:`Batch`), the parameters and the
  client's constants;
* ``on_train_batch_start(params, constants, carry)``: parameter edits before a step's forward;
* ``on_after_backward(params, grads, constants, carry)``: gradient edits before the optimiser steps;
* ``on_after_optimizer_step(params, constants, carry)``: parameter edits after it;
* ``on_train_end(params, constants, carry)``: parameter edits when the phase ends.

``params`` are the model's parameter tensors in layout order, in their logical shapes (``torch.func``'s
``functional_call`` order). An edit hook returns ``(edits, carry)``: ``edits`` maps a parameter's (or
gradient's) index to its new value, ``carry`` is the client's per-step state (FedNH's learned scale, APPLE's
core models and mixing vector), carried from step to step and read back when the phase ends. Since the
hooks see one client, stacked training runs them for all clients at once under ``torch.func.vmap``: they
must be free of host reads (no ``.item()``, no data-dependent shapes), which also lets a CUDA graph
replay them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rayfed.data.augment import AugmentConfig

__all__ = [
    "SGD",
    "Adam",
    "NoStep",
    "Optimizer",
    "Outputs",
    "Batch",
    "Phase",
    "Loss",
    "EditHook",
    "GradHook",
    "Forward",
    "Edits",
    "Carry",
    "Constants",
    "Params",
]

Params = Sequence[torch.Tensor]
"""A model's parameter tensors (or their gradients) in layout order, in their logical shapes."""
Constants = Mapping[str, torch.Tensor]
"""Per-client tensors a phase's hooks read and never change (FedProx's anchor, WDR's p_i)."""
Carry = dict[str, torch.Tensor]
"""Per-client tensors a phase's hooks change from step to step (FedNH's scale and its momentum)."""
Edits = dict[int, torch.Tensor]
"""New values of some parameters (or gradients), by their index in the layout."""


@dataclass(frozen=True)
class SGD:
    """``torch.optim.SGD``'s update (dampening 0, no Nesterov) on the trained parameters.

    ``momentum`` and ``weight_decay`` default (None) to the run's ``train.momentum`` / ``train.weight_decay``.
    ``keep_momentum`` names the client-state key under which the momentum buffer persists from one of the
    client's rounds to its next (FedAWA's clients create their optimiser once); None starts every phase
    from a zero buffer, as a new optimiser does.
    """

    momentum: float | None = None
    weight_decay: float | None = None
    keep_momentum: str | None = None


@dataclass(frozen=True)
class Adam:
    """``torch.optim.Adam`` (no weight decay, no amsgrad), created anew when the phase starts."""

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


@dataclass(frozen=True)
class NoStep:
    """No optimiser: the phase's hooks move the model (APPLE mixes it from the client's core models)."""


Optimizer = SGD | Adam | NoStep


@dataclass(frozen=True)
class Outputs:
    """What a step's forward produced for one client: logits, and the features the phase asked for."""

    logits: torch.Tensor
    features: torch.Tensor | None = None


@dataclass(frozen=True)
class Batch:
    """One client's targets in a step: labels (or soft targets), and sample weights where a stack padded
    a short last batch (None when every sample counts: a loss that depends on the batch must weigh its
    samples by ``weight`` when it is given). ``step`` is the step's index in the phase, a 0-d tensor."""

    y: torch.Tensor
    weight: torch.Tensor | None
    step: torch.Tensor


Loss = Callable[[Outputs, Batch, Params, Constants], torch.Tensor]
EditHook = Callable[[Params, Constants, Carry], tuple[Edits, Carry]]
GradHook = Callable[[Params, Params, Constants, Carry], tuple[Edits, Carry]]
Forward = Callable[[torch.nn.Module, torch.Tensor], Outputs]
"""A phase's own forward, from the module and the step's inputs (every view of the batch, one after the
other) to its outputs (FedClassAvg's extractor features and its classifier's logits of the first view)."""


@dataclass(frozen=True, eq=False)
class Phase:
    """One stretch of a client's local training (module docstring).

    The fields up to ``on_train_end`` describe the phase and are the same for every client of a stack;
    ``constants``, ``carry``, ``inputs``, ``load`` and ``start`` are this client's values.
    """

    epochs: int
    """Passes over the phase's samples."""
    loss: Loss | None = None
    """The term added to cross-entropy (the whole loss with ``cross_entropy=False``); None adds nothing."""
    cross_entropy: bool = True
    """Whether the loss includes the (sample-weighted) mean cross-entropy of the logits; it is the loss the
    phase reports."""
    optimizer: Optimizer = SGD()
    trains: tuple[int, int] | None = None
    """The range of the parameter vector that trains, on parameter boundaries; None = every parameter. The
    rest stays exactly as it is (no step, no weight decay) and backward skips it."""
    batch_size: int | None = None
    """Samples per step; None = ``train.batch_size``."""
    drop_last: bool | None = None
    """Skip an epoch's short last batch; None = ``train.drop_last``."""
    views: int = 1
    """Random views of each batch the forward sees, one after the other (FedClassAvg's two), drawn with
    ``augment``; 1 without ``augment`` is the batch itself."""
    augment: AugmentConfig | None = None
    features: str | None = None
    """The module whose input the loss reads as ``Outputs.features`` (the output layer: penultimate
    features); None when the loss reads none."""
    forward: Forward | None = None
    """The phase's own forward (``Outputs``), None = the module's forward, with the features captured."""
    cached_features: str | None = None
    """Train the layer of this name alone, on the features it reads computed once when the phase starts, not on
    the samples at every step (FedRep's head epochs cost one forward of the body). The layers before it must
    hold no trained parameter and map each sample alike at every step (no BatchNorm, no active dropout)."""
    model: str | None = None
    """None: the round's model (personalised, then contributed); else the key of a model the client keeps in
    its state (Ditto's personal model), which starts at ``start`` and is stored back when training ends."""
    reports: bool = True
    """Whether the phase's steps and cross-entropy count in the client's reported loss and step count."""
    on_train_batch_start: EditHook | None = None
    on_after_backward: GradHook | None = None
    on_after_optimizer_step: EditHook | None = None
    on_train_end: EditHook | None = None
    # --- this client's values -----------------------------------------------------------------------------
    constants: Constants = field(default_factory=dict)
    carry: Carry = field(default_factory=dict)
    """The carry when the phase starts; the loop leaves the final carry in the job's scratch
    (:data:`rayfed.train.loop.FINAL_CARRY`)."""
    inputs: tuple[torch.Tensor, torch.Tensor] | None = None
    """(inputs, targets) the phase trains on, on the job's device; None = the client's training split."""
    load: tuple[tuple[int, int], torch.Tensor] | None = None
    """A range of the parameter vector and the values loaded into it when the phase starts (FedClassAvg's
    warm-up loads the client's own classifier)."""
    start: Any = None
    """With ``model`` set: the state (parameters, then buffers) that model starts from when the client's state
    holds none yet, a numpy array or a tensor on the job's device; None = the round's starting model."""
    needs_start: bool = False
    """Whether ``constants["start"]`` is the round's starting parameters (the personalised model, before any
    phase), flattened in logical order: the anchor of a proximal term."""

    def signature(self) -> tuple[Any, ...]:
        """What must be equal for clients to train this phase in one stack: everything but their values, and
        their values' shapes."""

        def shapes(values: Mapping[str, torch.Tensor]) -> tuple[Any, ...]:
            return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(values.items()))

        return (
            self.epochs,
            self.loss,
            self.cross_entropy,
            self.optimizer,
            self.trains,
            self.batch_size,
            self.drop_last,
            self.views,
            self.augment,
            self.features,
            self.forward,
            self.cached_features,
            self.model,
            self.reports,
            self.on_train_batch_start,
            self.on_after_backward,
            self.on_after_optimizer_step,
            self.on_train_end,
            shapes(self.constants),
            shapes(self.carry),
            self.load[0] if self.load is not None else None,
            self.inputs is None,
            self.needs_start,
        )
