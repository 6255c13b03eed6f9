"""The one way rayfed checks a value: name the field, the value received and what is allowed.

Every config section, every algorithm's params dataclass and every dataset option
checks its fields with these helpers, so a bad value always reads the same way::

    train.lr must be a finite number > 0, but got train.lr=-0.1

>>> check_real("train.lr", 0.01, low=0, low_open=True)
>>> check_choice("engine.backend", "ray", ("ray", "local"))
>>> check_int("data.num_clients", 0, low=1)
Traceback (most recent call last):
...
rayfed.util.errors.ConfigError: data.num_clients must be an integer >= 1, but got data.num_clients=0
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from rayfed.util.errors import ConfigError
from rayfed.util.registry import closest

__all__ = ["fail", "check", "check_choice", "check_int", "check_real", "check_field_types", "is_int", "is_real"]


def fail(path: str, value: Any, allowed: str) -> typing.NoReturn:
    """Raise the standard ConfigError: ``{path} must be {allowed}, but got {path}={value!r}``."""
    raise ConfigError(f"{path} must be {allowed}, but got {path}={value!r}")


def check(ok: bool, path: str, value: Any, allowed: str) -> None:
    """:func:`fail` unless ``ok``."""
    if not ok:
        fail(path, value, allowed)


def check_choice(path: str, value: Any, choices: Sequence[str]) -> None:
    """``value`` must be one of ``choices``; a near miss suggests the closest."""
    if value not in choices:
        raise ConfigError(
            f"{path} must be one of {', '.join(map(repr, choices))}, but got {path}={value!r}"
            f"{closest(str(value), tuple(choices))}"
        )


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(path: str, value: Any, *, low: int | None = None, high: int | None = None) -> None:
    """``value`` must be an integer in [low, high] (either bound optional)."""
    ok = is_int(value) and (low is None or value >= low) and (high is None or value <= high)
    check(ok, path, value, f"an integer {_interval(low, high, False, False)}".rstrip())


def check_real(
    path: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """``value`` must be a finite number in the interval (open or closed at either end)."""
    ok = is_real(value) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    check(ok, path, value, f"a finite number {_interval(low, high, low_open, high_open)}".rstrip())


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return ""


def check_field_types(instance: Any, prefix: str) -> None:
    """Every field of the dataclass ``instance`` must hold its annotated type (an int for ``int``, a number
    for ``float``, ``True``/``False`` for ``bool``, a string for ``str``, a list for ``tuple[...]``, the
    section for a nested section, ``None`` where the annotation allows it), so that a value given as a
    string in Python, ``TrainConfig(lr="0.01")``, is named with the fix instead of failing a comparison."""
    for name, hint in _field_hints(type(instance)):
        value = getattr(instance, name)
        allowed = _allowed(hint, value)
        if allowed is not None:
            path = f"{prefix}.{name}" if prefix else name
            fix = ""
            if isinstance(value, str):
                fix = (
                    "; give the value itself in Python, or give strings to RunConfig().override(...), which "
                    "converts them as the command line does"
                )
            elif isinstance(value, Mapping):
                fix = "; build the config from tables with RunConfig.from_dict(...) or RunConfig().override(...)"
            raise ConfigError(f"{path} must be {allowed}, but got {path}={value!r}{fix}")


_HINTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _field_hints(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, annotation) of each field of the dataclass ``cls``, resolved once per class."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = tuple((field.name, hints[field.name]) for field in dataclasses.fields(cls))
    return _HINTS[cls]


def _allowed(hint: Any, value: Any) -> str | None:
    """What ``hint`` allows, if ``value`` is not one of it; None if it is (or ``hint`` is not checked here)."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    kinds = [o for o in options if o is not type(None)]
    if len(kinds) != 1:
        return None
    kind, origin = kinds[0], typing.get_origin(kinds[0])
    tests: dict[Any, tuple[bool, str]] = {
        int: (is_int(value), "an integer"),
        float: (is_real(value), "a number"),
        bool: (isinstance(value, bool), "true or false"),
        str: (isinstance(value, str), "a string"),
        tuple: (isinstance(value, (list, tuple)), "a list"),
    }
    if origin is tuple:
        kind = tuple
    elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return None if isinstance(value, kind) else f"a {kind.__name__}"
    ok, allowed = tests.get(kind, (True, ""))
    return None if ok else allowed
