"""The checks of what a method declares, before any of it trains: its phases, and what its hooks return.

A method's mistakes are a user's mistakes in their own code, so each gets one line that names the method, the
phase, the field, the value received and the fix (:class:`~rayfed.util.errors.MethodError`), never a silent
fallback and never an error from deep inside the loop. :func:`check_phases` runs on every list a client half's
``phases`` (or ``fine_tuning``) returns, before the loop trains any of it; :class:`HookResults` checks, at a step,
what a loss or an edit hook returned (shapes and keys only: no value is read, so the step never waits for a
device).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfed.data.augment import AugmentConfig
from rayfed.train.flat import FlatModel
from rayfed.train.phase import NO_PARAMETERS, OPTIMIZERS, SGD, Adam, Kept, Phase, Samples, Trainable
from rayfed.util.errors import MethodError

__all__ = ["PhaseContext", "check_phases", "HookResults", "RESERVED_CONSTANTS"]

RESERVED_CONSTANTS = frozenset({"start"})
"""Constant names the loop sets itself: ``start``, the round's starting parameters."""

_OPTIMIZER_NAMES = "SGD(), Adam() or NoStep() (rayfed.train.phase)"


@dataclass(frozen=True)
class PhaseContext:
    """Where phases are checked: the method, the hook that returned them, the client, its model, and whether the
    method keeps client state (a :class:`~rayfed.train.phase.Kept` model needs it)."""

    method: str
    hook: str
    client_id: int
    flat: FlatModel
    keeps_state: bool
    may_be_empty: bool = False
    """Whether no phase at all is a valid answer (``fine_tuning``: no fine-tuning)."""


def check_phases(phases: Any, where: PhaseContext) -> list[Phase]:
    """``phases`` as a list, after checking it and every phase in it (module docstring); raises MethodError."""
    head = f"algorithm {where.method!r}: {where.hook}() of client {where.client_id}"
    if isinstance(phases, Phase) or not isinstance(phases, list | tuple):
        raise MethodError(
            f"{head} returned {_short(phases)}, not a list of Phase; return a list, e.g. [Phase(epochs=1)]"
        )
    if not phases and not where.may_be_empty:
        raise MethodError(
            f"{head} returned no phase, so the client would train nothing; return at least one Phase "
            "(a phase that should not train is left out of a list that keeps the others)"
        )
    for index, phase in enumerate(phases):
        name = f"{head}, phase {index} of {len(phases)}"
        if not isinstance(phase, Phase):
            raise MethodError(f"{name} is {_short(phase)}, not a Phase; build it as Phase(epochs=..., ...)")
        for field, value, why in _problems(phase, where):
            raise MethodError(f"{name}: Phase.{field}={_short(value)} {why}")
    return list(phases)


def _problems(phase: Phase, where: PhaseContext) -> list[tuple[str, Any, str]]:
    """(field, value, what is wrong and the fix) of every mistake in ``phase``, in field order."""
    flat = where.flat
    out: list[tuple[str, Any, str]] = []
    if isinstance(phase.epochs, bool) or not isinstance(phase.epochs, int) or phase.epochs < 1:
        out.append(("epochs", phase.epochs, "must be a whole number >= 1; leave a phase out to train nothing in it"))
    for field in ("loss", "forward", "on_train_batch_start", "on_after_backward", "on_train_end"):
        value = getattr(phase, field)
        if value is not None and not callable(value):
            out.append((field, value, "must be a function (or None)"))
    for field in ("cross_entropy", "reports"):
        if not isinstance(getattr(phase, field), bool):
            out.append((field, getattr(phase, field), "must be True or False"))
    if phase.budgeted is not None and not isinstance(phase.budgeted, bool):
        out.append(("budgeted", phase.budgeted, "must be True, False or None (the phase whose result is uploaded)"))
    if phase.cross_entropy is False and phase.loss is None:
        out.append(("loss", None, "leaves the phase without a loss (cross_entropy=False); give a loss, or keep CE"))
    out.extend(_optimizer_problems(phase))
    out.extend(_range_problems(phase, flat))
    out.extend(_samples_problems(phase.samples))
    out.extend(_model_problems(phase, where))
    out.extend(_value_problems(phase, flat))
    return out


def _optimizer_problems(phase: Phase) -> list[tuple[str, Any, str]]:
    optimizer = phase.optimizer
    if not isinstance(optimizer, OPTIMIZERS):
        hint = f"{optimizer.__name__}()" if isinstance(optimizer, type) and optimizer in OPTIMIZERS else None
        fix = f"pass an instance: {hint}" if hint else f"use {_OPTIMIZER_NAMES}"
        return [("optimizer", optimizer, f"is not an optimiser rayfed runs; {fix}")]
    if isinstance(optimizer, SGD):
        for name in ("momentum", "weight_decay"):
            value = getattr(optimizer, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
                return [("optimizer", optimizer, f"has {name}={value!r}; it must be a number >= 0, or None (train.*)")]
        if optimizer.keep_momentum is not None and (
            not isinstance(optimizer.keep_momentum, str) or not optimizer.keep_momentum
        ):
            return [("optimizer", optimizer, "has keep_momentum that is not a state key; give a non-empty str")]
    if isinstance(optimizer, Adam):
        b1, b2 = optimizer.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1) or not optimizer.eps > 0:
            return [("optimizer", optimizer, "needs betas in [0, 1) and eps > 0")]
    return []


def _range_problems(phase: Phase, flat: FlatModel) -> list[tuple[str, Any, str]]:
    out: list[tuple[str, Any, str]] = []
    if phase.trains is not None and tuple(phase.trains) != NO_PARAMETERS:
        lo_hi = phase.trains
        bounds = flat.layout.offsets
        if not (isinstance(lo_hi, tuple) and len(lo_hi) == 2 and lo_hi[0] in bounds and lo_hi[1] in bounds):
            out.append(("trains", lo_hi, f"must be a range (lo, hi) on parameter boundaries {bounds}, or None"))
        elif not lo_hi[0] < lo_hi[1]:
            out.append(("trains", lo_hi, "is empty; use NO_PARAMETERS to train only the phase's Trainable tensors"))
    if phase.trains is not None and tuple(phase.trains) == NO_PARAMETERS and not phase.extra:
        out.append(
            ("trains", phase.trains, "trains no parameter and the phase has no Trainable (extra): nothing trains")
        )
    if phase.load is not None:
        try:
            (a, b), values = phase.load
            ok = a in flat.layout.offsets and b in flat.layout.offsets and a < b and values.numel() == b - a
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            out.append(("load", phase.load, "must be ((lo, hi) on parameter boundaries, a tensor of hi - lo values)"))
    return out


def _model_problems(phase: Phase, where: PhaseContext) -> list[tuple[str, Any, str]]:
    model = phase.model
    if model is None:
        return []
    if not isinstance(model, Kept) or not isinstance(model.key, str) or not model.key:
        return [("model", model, "must be Kept('<state key>') for a model the client keeps, or None")]
    if not where.keeps_state:
        return [
            (
                "model",
                model,
                f"keeps a model in the client's state, but algorithm {where.method!r} keeps no client state, so it "
                "would be thrown away; register the algorithm with keeps_client_state=True",
            )
        ]
    size = where.flat.state_size
    if model.initial is not None and tuple(getattr(model.initial, "shape", ())) != (size,):
        return [("model", model, f"has an initial state of shape {_shape(model.initial)}; it must be ({size},)")]
    return []


def _value_problems(phase: Phase, flat: FlatModel) -> list[tuple[str, Any, str]]:
    out: list[tuple[str, Any, str]] = []
    if not isinstance(phase.constants, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in phase.constants.items()
    ):
        out.append(("constants", phase.constants, "must map names to tensors on the job's device"))
    elif RESERVED_CONSTANTS & set(phase.constants):
        out.append(("constants", sorted(phase.constants), "names 'start', which the loop sets; choose another name"))
    if not isinstance(phase.extra, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Trainable) and isinstance(v.value, torch.Tensor)
        for k, v in phase.extra.items()
    ):
        out.append(("extra", phase.extra, "must map names to Trainable(tensor) values"))
        return out
    if phase.extra and phase.on_after_backward is None:
        names = ", ".join(sorted(phase.extra))
        out.append(("extra", names, "is trained but nothing gives it a gradient; add on_after_backward returning it"))
    for name, trainable in phase.extra.items():
        if trainable.lr is not None and (not isinstance(trainable.lr, int | float) or trainable.lr < 0):
            out.append(("extra", f"{name}: lr={trainable.lr!r}", "needs a learning rate >= 0, or None (the round's)"))
        if trainable.lr is not None and not isinstance(phase.optimizer, SGD):
            out.append(("extra", f"{name}: lr={trainable.lr!r}", "sets its own lr, which only SGD takes"))
    return out


def _samples_problems(samples: Any) -> list[tuple[str, Any, str]]:
    """What is wrong with a phase's ``samples`` (:class:`~rayfed.train.phase.Samples`)."""
    if not isinstance(samples, Samples):
        return [
            ("samples", samples, "must be Samples(inputs=..., batch_size=..., drop_last=..., augment=..., views=...)")
        ]
    out: list[tuple[str, Any, str]] = []
    inputs, size, views = samples.inputs, samples.batch_size, samples.views
    if inputs is not None and not (
        isinstance(inputs, tuple)
        and len(inputs) == 2
        and all(isinstance(t, torch.Tensor) for t in inputs)
        and len(inputs[0]) == len(inputs[1])
    ):
        out.append(("samples.inputs", inputs, "must be (inputs, targets) tensors of equal length, or None"))
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        out.append(("samples.batch_size", size, "must be a whole number >= 1, or None for train.batch_size"))
    if samples.drop_last is not None and not isinstance(samples.drop_last, bool):
        out.append(("samples.drop_last", samples.drop_last, "must be True, False or None (train.drop_last)"))
    if samples.augment is not None and not isinstance(samples.augment, AugmentConfig):
        out.append(("samples.augment", samples.augment, "must be an AugmentConfig (rayfed.data.augment), or None"))
    if isinstance(views, bool) or not isinstance(views, int) or views < 1:
        out.append(("samples.views", views, "must be a whole number >= 1"))
    elif views > 1 and samples.augment is None:
        out.append(("samples.views", views, "are copies of the same batch without augment; give augment=..."))
    return out


def _shape(value: Any) -> tuple[int, ...] | str:
    return tuple(value.shape) if hasattr(value, "shape") else type(value).__name__


def _short(value: Any) -> str:
    """A value as an error shows it: short, with tensors and arrays by their shape."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return f"<{type(value).__name__} of shape {tuple(value.shape)}>"
    if isinstance(value, type):
        return f"<class {value.__module__}.{value.__qualname__}>"
    if isinstance(value, tuple) and value and any(isinstance(v, torch.Tensor | np.ndarray) for v in value):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class HookResults:
    """Checks of what one phase's loss and edit hooks return at a step (shapes and keys, never values)."""

    def __init__(self, where: str, params: Sequence[tuple[int, ...]], extra: Mapping[str, tuple[int, ...]]) -> None:
        self.where = where
        self.params = list(params)
        self.extra = dict(extra)

    def loss(self, value: Any) -> torch.Tensor:
        """The loss term of one client: a 0-d tensor."""
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            shape = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else _short(value)
            raise MethodError(
                f"{self.where}: its loss returned {shape}; return one number for the batch, a 0-d tensor "
                "(the mean over the batch's samples, weighted by batch.weight when it is given)"
            )
        return value

    def edits(self, hook: str, value: Any, *, gradients: bool) -> Mapping[int | str, torch.Tensor]:
        """What an edit hook returned: a mapping of parameter indices (or trainable names) to tensors of their
        shapes; after backward, every trainable's gradient among them."""
        fix = "return a dict {parameter index or Trainable name: tensor of its shape}"
        if not isinstance(value, Mapping):
            raise MethodError(f"{self.where}: {hook} returned {_short(value)}; {fix}")
        for key, tensor in value.items():
            if isinstance(key, bool) or not (isinstance(key, int | str)):
                raise MethodError(f"{self.where}: {hook} returned an edit under {key!r}; {fix}")
            if isinstance(key, int):
                if not 0 <= key < len(self.params):
                    raise MethodError(
                        f"{self.where}: {hook} edits parameter {key}, but the model has {len(self.params)} "
                        f"(0-{len(self.params) - 1}); {fix}"
                    )
                shape = self.params[key]
            elif key not in self.extra:
                raise MethodError(
                    f"{self.where}: {hook} edits {key!r}, which is no Trainable of the phase "
                    f"({', '.join(sorted(self.extra)) or 'it has none'}); {fix}"
                )
            else:
                shape = self.extra[key]
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(shape):
                raise MethodError(
                    f"{self.where}: {hook} returned {_short(tensor)} for {key!r}, whose shape is {tuple(shape)}; {fix}"
                )
        missing = sorted(set(self.extra) - set(value)) if gradients else []
        if missing:
            raise MethodError(
                f"{self.where}: {hook} gave no gradient to the Trainable {', '.join(map(repr, missing))}; "
                "return each trainable's gradient under its name"
            )
        return value
