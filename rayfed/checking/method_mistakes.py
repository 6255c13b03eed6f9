"""A method's mistake, found by running it, as one line that names what did it, where, and the fix
(``rayfed check``, :mod:`rayfed.checking.method_check`).

rayfed's own checks already say so in one line (a :class:`~rayfed.util.errors.RayfedError`: the phase checker's,
a config the method refuses). What a stack's ``torch.func.vmap`` refuses in a hook is torch's message about
vmap; :func:`explain` says instead which hook did it (the loss, the forward, an edit hook), on which line of the
method's code, and what to write instead. Any other error is named with the method's line that raised it.
"""

from __future__ import annotations

import functools
import traceback
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rayfed.train.phase import Phase
from rayfed.util.errors import RayfedError

__all__ = ["HOOKS", "explain"]

HOOKS = ("loss", "forward", "on_train_batch_start", "on_after_backward", "on_train_end")
"""The fields of a phase that hold the method's functions, which the loop calls inside a step."""

_STACK_RULES = (
    (
        ".item() on a Tensor",
        "calls .item() (or float() or int() of a tensor), which reads a value back to the host: a stack trains its "
        "clients under torch.func.vmap, which cannot, and on a GPU every step would wait for the device; keep the "
        "value a tensor (torch.where for a choice, .clamp for a bound)",
    ),
    (
        "dynamic shape",
        "makes a shape that depends on the data (indexing with a boolean mask, nonzero, unique), but every client "
        "of a stack has the same shapes; weigh by the mask instead (x * mask, torch.where)",
    ),
    (
        "data-dependent control flow",
        "branches in Python on a tensor's value (if value > 0: ...), but one function serves every client of a "
        "stack; compute both branches and choose with torch.where",
    ),
    (
        "random operation",
        "draws random numbers inside a step, which a stack's vmap refuses; draw them in phases() from job.generator "
        "and pass them as constants",
    ),
)
"""(what torch's vmap error says, what the method's hook does and what to write instead)."""

_TORCH = Path(torch.__file__).resolve().parent
_RAYFED = Path(__file__).resolve().parents[1]
_METHODS = _RAYFED / "algorithms"


def _code(fn: Any) -> types.CodeType | None:
    """The code a hook runs: a function's, a bound method's, a partial's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None)


def _is_method_code(filename: str) -> bool:
    """Code of the method (a user's file, or rayfed's algorithms), not torch's or the loop's."""
    path = Path(filename).resolve()
    if path.is_relative_to(_TORCH):
        return False
    return not path.is_relative_to(_RAYFED) or path.is_relative_to(_METHODS)


def _name(code: types.CodeType) -> str:
    """A function's qualified name (``Client.loss``; its bare name before Python 3.11)."""
    return str(getattr(code, "co_qualname", code.co_name))


def _where(error: BaseException, phases: Sequence[Sequence[Phase]]) -> str:
    """The hook of the method that raised ``error`` and the method's line that did, e.g. ``the loss Mine.loss
    (mine.py:12)``; "" when no code of the method raised it."""
    hooks = {
        code: name
        for own in phases
        for phase in own
        for name in HOOKS
        if (code := _code(getattr(phase, name))) is not None
    }
    trace = list(traceback.walk_tb(error.__traceback__))
    ours = [(frame, line) for frame, line in trace if _is_method_code(frame.f_code.co_filename)]
    if not ours:
        return ""
    frame, line = ours[-1]
    named = f"{_name(frame.f_code)} ({Path(frame.f_code.co_filename).name}:{line})"
    hook = next((f for f, _ in reversed(trace) if f.f_code in hooks), None)
    if hook is None:
        return named
    role = hooks[hook.f_code]
    kind = {"loss": "the loss", "forward": "the forward"}.get(role, f"the hook {role}")
    return f"{kind} {named}" if hook is frame else f"{kind} {_name(hook.f_code)}, in {named},"


def explain(method: str, error: BaseException, phases: Sequence[Sequence[Phase]] = ()) -> str:
    """``error``, raised while ``method`` trained clients with ``phases``, as one line naming the method, what of
    it raised it and the fix."""
    if isinstance(error, RayfedError):
        return str(error)
    where = _where(error, phases)
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    for marker, fix in _STACK_RULES:
        if marker in message:
            return f"algorithm {method!r}: {where or 'a hook'} {fix}"
    return f"algorithm {method!r}: {where or 'its code'} raised {type(error).__name__}: {message}"
