"""What a method declares about its local training: phases, their optimiser, and a few hooks.

A client's local work in one round is a short list of :class:`Phase` objects. FedAvg's is one phase of
``train.local_epochs`` epochs of SGD on cross-entropy; FedRep's a phase on the head and one on the body;
Ditto's a phase on the personal model and one on the global model; KT-pFL's a distillation on the
public set, then local training. The one loop (:mod:`rayfed.train.loop`) runs every phase of every
method, one client at a time or many clients stacked, and replays its steps from CUDA graphs: a method
written as phases is on the fast path without code of its own for it.

A phase names what it trains (all parameters, a contiguous range such as a head or a body, or none), for
how many epochs of which samples (:class:`Samples`: the client's training split, or inputs it brings, a
public set; their batches and random views), with which optimiser (:class:`SGD`, :class:`Adam`, or
:class:`NoStep`), which model (the round's, or one the client keeps in its state: :class:`Kept`), and the
extra tensors it trains beside the model's parameters (:class:`Trainable`: FedNH's scale, APPLE's core model
and mixing vector), which the same optimiser updates, and whether a deadline's step budget covers it (``budgeted``:
by default the phase whose result is uploaded, so that a partial client trains what the server receives). Its
hooks are pure functions of *one* client's tensors, named as in PyTorch Lightning:

* ``loss(out, batch, params, constants)``: a term added to the cross-entropy of the logits (or, with
  ``cross_entropy=False``, the whole loss), from the logits and the features the output layer reads
  (:class:`Outputs`), the batch's targets (:class:`Batch`), the parameters and the
  client's constants. ``constants["start"]`` is the round's starting parameters, flattened in logical
  order (the anchor of a proximal term), in every phase that has a loss or a hook;
* ``on_train_batch_start(params, constants, extra)``: edits before a step's forward;
* ``on_after_backward(params, grads, constants, extra)``: edits of the gradients before the optimiser
  steps; it gives every :class:`Trainable` its gradient, under its name;
* ``on_train_end(params, constants, extra)``: edits when the phase ends.

``params`` are the model's parameter tensors in layout order, in their logical shapes (``torch.func``'s
``functional_call`` order), ``extra`` the trainables' current values by name. A hook returns its edits
(:data:`Edits`): new values by a parameter's index (a gradient's, after backward) or a trainable's name
(its gradient, after backward). Since the hooks see one client, stacked training runs them for all
clients at once under ``torch.func.vmap``: they must be free of host reads (no ``.item()``, no
data-dependent shapes), which also lets a CUDA graph replay them. :mod:`rayfed.train.phase_checks` checks
every phase a method declares before it trains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rayfed.data.augment import AugmentConfig

__all__ = [
    "SGD",
    "Adam",
    "NoStep",
    "Optimizer",
    "OPTIMIZERS",
    "Samples",
    "Kept",
    "Trainable",
    "Outputs",
    "Batch",
    "Phase",
    "Loss",
    "EditHook",
    "GradHook",
    "Forward",
    "Edits",
    "Constants",
    "Params",
    "Grads",
    "Extra",
    "NO_PARAMETERS",
    "with_budget_cover",
]

Params = Sequence[torch.Tensor]
"""A model's parameter tensors in layout order, in their logical shapes."""
Grads = Sequence[torch.Tensor | None]
"""The parameters' gradients after backward, in layout order; None where a parameter does not train."""
Extra = Mapping[str, torch.Tensor]
"""A phase's trainables' current values by name (:class:`Trainable`)."""
Constants = Mapping[str, torch.Tensor]
"""Per-client tensors a phase's hooks read and never change (FedProx's anchor, WDR's p_i)."""
Edits = dict[int | str, torch.Tensor]
"""New values by a parameter's index in the layout, or a trainable's name (after backward: their gradients)."""

NO_PARAMETERS = (0, 0)
"""``Phase.trains`` of a phase that trains no model parameter, only its :class:`Trainable` tensors (APPLE)."""


@dataclass(frozen=True)
class SGD:
    """``torch.optim.SGD``'s update (dampening 0, no Nesterov) on the trained parameters and trainables.

    ``momentum`` and ``weight_decay`` default (None) to the run's ``train.momentum`` / ``train.weight_decay``.
    ``keep_momentum`` names the client-state key under which the parameters' momentum buffer persists from one
    of the client's rounds to its next (FedAWA's clients create their optimiser once); None starts every phase
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
    """No optimiser: nothing the phase trains moves but by its hooks' edits."""


Optimizer = SGD | Adam | NoStep
OPTIMIZERS = (SGD, Adam, NoStep)


@dataclass(frozen=True)
class Samples:
    """What a phase's steps see, where it is not the client's training split in the run's batches: ``inputs``,
    (inputs, targets) on the job's device that it trains on instead (KT-pFL's public set: this client's values);
    ``batch_size`` and ``drop_last`` (None: ``train.batch_size``, ``train.drop_last``); and ``views`` random views of
    each batch drawn with ``augment``, which the forward sees one after the other (FedClassAvg's two)."""

    inputs: tuple[torch.Tensor, torch.Tensor] | None = None
    batch_size: int | None = None
    """Samples per step; None = ``train.batch_size``."""
    drop_last: bool | None = None
    """Skip an epoch's short last batch; None = ``train.drop_last``."""
    augment: AugmentConfig | None = None
    """How each view is drawn; None: the batch itself."""
    views: int = 1
    """Views of each batch the forward sees (more than one needs ``augment``)."""


@dataclass(frozen=True)
class Kept:
    """A model the client keeps in its state under ``key`` (Ditto's personal model): it starts from the state's
    value, else from ``initial`` (the state as a numpy array or a tensor on the job's device; None = the round's
    starting model), and is stored back when training ends."""

    key: str
    initial: Any = None


@dataclass(frozen=True)
class Trainable:
    """A tensor of one client that a phase trains beside the model's parameters, with the phase's optimiser
    (its momentum, weight decay, Adam moments), from the gradient ``on_after_backward`` gives it; ``lr`` is its
    learning rate, None = the round's. Its final value reaches the client half as ``job.extra[name]``."""

    value: torch.Tensor
    lr: float | None = None


@dataclass(frozen=True)
class Outputs:
    """What a step's forward produced for one client: logits, and the features its output layer read (in a phase
    with a loss and the module's own forward; a phase's own forward gives what it gives)."""

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
EditHook = Callable[[Params, Constants, Extra], Edits]
GradHook = Callable[[Params, Grads, Constants, Extra], Edits]
Forward = Callable[[torch.nn.Module, torch.Tensor], Outputs]
"""A phase's own forward, from the module and the step's inputs (every view of the batch, one after the
other) to its outputs (FedClassAvg's extractor features and its classifier's logits of the first view)."""


@dataclass(frozen=True, eq=False)
class Phase:
    """One stretch of a client's local training (module docstring).

    The fields up to ``on_train_end`` describe the phase and are the same for every client of a stack (but the
    ``inputs`` of its ``samples``); ``constants``, ``extra`` and ``load`` are this client's values.
    """

    epochs: int
    """Passes over the phase's samples, at least one (a phase that should not train is left out)."""
    loss: Loss | None = None
    """The term added to cross-entropy (the whole loss with ``cross_entropy=False``); None adds nothing."""
    cross_entropy: bool = True
    """Whether the loss includes the (sample-weighted) mean cross-entropy of the logits; it is the loss the
    phase reports."""
    optimizer: Optimizer = SGD()
    trains: tuple[int, int] | None = None
    """The range of the parameter vector that trains, on parameter boundaries; None = every parameter;
    :data:`NO_PARAMETERS` = none (only the trainables). The rest stays exactly as it is (no step, no weight
    decay) and backward skips it. A phase that trains the output layer alone of a model without BatchNorm or
    active dropout computes the features it reads once, not at every step (FedRep's head epochs)."""
    samples: Samples = Samples()
    """What its steps see (:class:`Samples`): by default the client's training split in ``train.batch_size``
    batches."""
    forward: Forward | None = None
    """The phase's own forward (``Outputs``); None = the module's forward, with (in a phase with a loss) the
    input of its output layer as ``Outputs.features``."""
    model: Kept | None = None
    """None: the round's model (started from the client half's ``start``, then uploaded); else a model the
    client keeps in its state."""
    reports: bool = True
    """Whether the phase's steps and cross-entropy count in the client's reported loss and step count."""
    budgeted: bool | None = None
    """Whether a deadline's step budget covers the phase (a partial client's steps, ``RoundFacts.step_budget``:
    the budgeted phases share it in order, the others train whole); None = the default, the phase whose result is
    uploaded: the last one that trains the round's model (:func:`with_budget_cover`)."""
    on_train_batch_start: EditHook | None = None
    on_after_backward: GradHook | None = None
    on_train_end: EditHook | None = None
    # --- this client's values -----------------------------------------------------------------------------
    constants: Constants = field(default_factory=dict)
    extra: Mapping[str, Trainable] = field(default_factory=dict)
    """The tensors this phase trains beside the model's parameters, by name."""
    load: tuple[tuple[int, int], torch.Tensor] | None = None
    """A range of the parameter vector and the values loaded into it when the phase starts (FedClassAvg's
    warm-up loads the client's own classifier)."""


def with_budget_cover(phases: Sequence[Phase]) -> list[Phase]:
    """``phases`` with ``budgeted`` decided for each: as declared, or by default (None) the last phase that trains
    the round's model (``model`` None), whose result the client uploads (FedRep's body, Ditto's global model), so
    that a partial client spends its steps on what the server receives (docs/system.md)."""
    uploaded = max((i for i, p in enumerate(phases) if p.model is None), default=-1)
    return [p if p.budgeted is not None else replace(p, budgeted=i == uploaded) for i, p in enumerate(phases)]
