"""Which clients train in one stack: those whose phases are equal in everything but their values.

Two clients' phases stack when every field that describes a phase is equal, and their values (constants,
trainables, inputs, loads) have equal shapes (:func:`stack_key`). Hooks are functions, and a method may make
them anew for every client (a lambda or a closure inside ``phases``): such functions are compared by what they
are, their code and the values they capture (:func:`function_key`), so a method whose hooks capture the same
values keeps stacking; one whose hooks capture per-client values (a tensor) falls into stacks of one, and the
reason is logged once per worker (:func:`stack_groups`).
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rayfed.train.phase import Kept, Phase, Samples

logger = logging.getLogger(__name__)

__all__ = ["stack_key", "function_key", "stack_groups", "split_reason"]

_DESCRIPTION = (
    "epochs",
    "loss",
    "cross_entropy",
    "optimizer",
    "trains",
    "forward",
    "samples",
    "model",
    "reports",
    "budgeted",
    "on_train_batch_start",
    "on_after_backward",
    "on_train_end",
)
"""The fields that describe a phase (its values aside)."""
_FUNCTIONS = frozenset({"loss", "forward", "on_train_batch_start", "on_after_backward", "on_train_end"})
_logged: set[tuple[str, str]] = set()


def function_key(fn: Any) -> Hashable:
    """What makes two functions the same hook: a bound method's function and object, a partial's function and
    arguments, a plain function's code, defaults and captured values (each by value where it is a number or a
    string, else by identity: two clients' tensors are two values)."""
    if fn is None:
        return None
    if isinstance(fn, types.MethodType):
        return ("method", function_key(fn.__func__), id(fn.__self__))
    if isinstance(fn, functools.partial):
        keywords = tuple(sorted((k, _value_key(v)) for k, v in fn.keywords.items()))
        return ("partial", function_key(fn.func), tuple(_value_key(a) for a in fn.args), keywords)
    if isinstance(fn, types.FunctionType):
        cells = tuple(_value_key(cell.cell_contents) for cell in fn.__closure__ or ())
        defaults = tuple(_value_key(d) for d in fn.__defaults__ or ())
        return ("function", fn.__code__, defaults, cells)
    return ("object", id(fn))


def _value_key(value: Any) -> Hashable:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return (type(value).__name__, value)
    if isinstance(value, types.FunctionType | types.MethodType | functools.partial):
        return function_key(value)
    if isinstance(value, tuple):
        return tuple(_value_key(v) for v in value)
    return ("id", id(value))


def _shapes(values: Mapping[str, Any]) -> tuple[Any, ...]:
    def shape(value: Any) -> Any:
        tensor = getattr(value, "value", value)  # a Trainable's tensor
        if isinstance(tensor, torch.Tensor | np.ndarray):
            return (tuple(tensor.shape), str(tensor.dtype), getattr(value, "lr", None))
        return type(value).__name__

    return tuple((k, shape(v)) for k, v in sorted(values.items()))


def _field_key(phase: Phase, name: str) -> Hashable:
    value = getattr(phase, name)
    if name in _FUNCTIONS:
        return function_key(value)
    if isinstance(value, Kept):  # its initial state is a value of the client's: only its shape must agree
        return ("kept", value.key, tuple(getattr(value.initial, "shape", ())))
    if isinstance(value, Samples):  # its inputs are the client's values: whether it has any must agree
        return ("samples", value.batch_size, value.drop_last, value.augment, value.views, value.inputs is None)
    return value


def stack_key(phase: Phase) -> tuple[Any, ...]:
    """What must be equal for clients to train ``phase`` in one stack: everything but their values, and their
    values' shapes."""
    return (
        *(_field_key(phase, name) for name in _DESCRIPTION),
        _shapes(phase.constants),
        _shapes(phase.extra),
        phase.load[0] if phase.load is not None else None,
    )


def _difference(a: Sequence[Phase], b: Sequence[Phase]) -> str:
    """The first thing that keeps two clients' phases out of one stack, in words."""
    if len(a) != len(b):
        return f"clients declare {len(a)} and {len(b)} phases"
    for index, (one, other) in enumerate(zip(a, b)):
        for name in _DESCRIPTION:
            if _field_key(one, name) != _field_key(other, name):
                if name in _FUNCTIONS:
                    return (
                        f"phase {index}'s {name} is a different function for each client (made per client, or "
                        "capturing per-client values); make it one function and pass per-client values as constants"
                    )
                return f"phase {index}'s {name} differs between clients"
        if stack_key(one) != stack_key(other):
            return f"phase {index}'s per-client values (constants, extra, inputs or load) differ in shape"
    return ""


def _groups(phases: Sequence[Sequence[Phase]]) -> list[list[int]]:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, own in enumerate(phases):
        groups.setdefault(tuple(stack_key(p) for p in own), []).append(i)
    return list(groups.values())


def split_reason(phases: Sequence[Sequence[Phase]]) -> str:
    """Why clients with these phases do not all train in one stack, in words ("" when they do): the first thing
    that keeps the first two groups apart."""
    groups = _groups(phases)
    return _difference(phases[groups[0][0]], phases[groups[1][0]]) if len(groups) > 1 else ""


def stack_groups(method: str, phases: Sequence[Sequence[Phase]]) -> list[list[int]]:
    """The positions of clients whose phases stack together, in order; the reason the first two groups differ
    (:func:`split_reason`) is logged once per worker and method."""
    groups = _groups(phases)
    if len(groups) > 1:
        reason = split_reason(phases)
        if (method, reason) not in _logged:
            _logged.add((method, reason))
            logger.warning("algorithm %r: its clients train in %d stacks, not one: %s", method, len(groups), reason)
    return groups
