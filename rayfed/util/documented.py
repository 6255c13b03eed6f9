"""Config fields that carry their own meaning, so ``help()``, ``rayfed run --help`` and ``rayfed list`` show it.

Attribute docstrings are invisible to ``help()`` and to the command line, so each field of
a config section, and of an algorithm's params dataclass (``algorithm.params.*``), is
declared with :func:`documented`, which keeps its one-line meaning in the field's metadata,
and the :func:`section` decorator appends a generated "Fields" list (dotted path, default,
allowed values of a ``Literal`` field, meaning) to the class's ``__doc__``.
:func:`reference` lists the same entries for a whole tree of sections. The meaning is
written once, next to the field.

>>> from dataclasses import dataclass
>>> @section("demo")
... @dataclass(frozen=True)
... class Demo:
...     '''A demo section.'''
...     lr: float = documented(0.1, "Step size.")
...     rule: Literal["sgd", "adam"] = documented("sgd", "Optimiser.")
>>> print(reference(Demo))
demo.lr = 0.1
    Step size.
demo.rule = "sgd"  (one of "sgd", "adam")
    Optimiser.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import textwrap
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

from rayfed.util.validation import check_field_types

__all__ = ["documented", "section", "reference", "meaning"]

T = TypeVar("T", bound=type)

_DOC = "doc"
_PREFIX = "__config_prefix__"


def documented(default: Any, meaning: str) -> Any:
    """A dataclass field with its ``default`` and its one-line ``meaning``.

    A mutable default (dict, list) is copied for each instance, and a dataclass type
    (a nested section) is instantiated for each, as ``default_factory`` would.
    """
    metadata = {_DOC: meaning}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def meaning(field: dataclasses.Field[Any]) -> str:
    """The meaning given to :func:`documented`."""
    return str(field.metadata[_DOC])


def section(prefix: str) -> Callable[[T], T]:
    """Class decorator for a config section whose fields are addressed as ``prefix.name``.

    Appends the "Fields" list to the class docstring, and checks every field's type
    (:func:`~rayfed.util.validation.check_field_types`) after the section's own
    ``__post_init__`` checked its values (or failed to compare one of another type). A field
    declared without :func:`documented` is a programming error, caught at import.
    """

    def decorate(cls: T) -> T:
        for field in dataclasses.fields(cls):
            if _DOC not in field.metadata:
                raise TypeError(f"{cls.__name__}.{field.name} has no meaning: declare it with documented()")
        setattr(cls, _PREFIX, prefix)
        checks = getattr(cls, "__post_init__", None)

        def __post_init__(self: Any) -> None:
            try:
                if checks is not None:
                    checks(self)
            except TypeError:  # a check compared a value of another type: name it instead
                check_field_types(self, prefix)
                raise
            check_field_types(self, prefix)

        cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
        fields = "\n".join(_entries(cls, prefix, recurse=False))
        cls.__doc__ = f"{(cls.__doc__ or '').rstrip()}\n\nFields (path = default):\n\n{fields}\n"
        return cls

    return decorate


def reference(cls: type) -> str:
    """Every field of ``cls`` and of the sections nested in it: path, default, allowed values and meaning."""
    return "\n".join(_entries(cls, getattr(cls, _PREFIX, ""), recurse=True))


def _entries(cls: type, prefix: str, *, recurse: bool) -> Iterator[str]:
    nested: list[tuple[type, str]] = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        path = f"{prefix}.{field.name}" if prefix else field.name
        if isinstance(field.default_factory, type) and dataclasses.is_dataclass(field.default_factory):
            nested.append((field.default_factory, path))
            if recurse:
                continue
            yield f"{path}.*\n{_indented(meaning(field))}"
        else:
            yield f"{path} = {_default(field)}{_choices(hints[field.name])}\n{_indented(meaning(field))}"
    if recurse:
        for section_cls, path in nested:
            yield ""
            yield from _entries(section_cls, path, recurse=True)


def _indented(text: str) -> str:
    return textwrap.fill(text, width=100, initial_indent="    ", subsequent_indent="    ")


def _choices(hint: Any) -> str:
    """``  (one of "a", "b")`` for a ``Literal["a", "b"]`` field (also inside ``Optional``), else nothing."""
    options = [hint, *typing.get_args(hint)]
    literal = next((o for o in options if typing.get_origin(o) is Literal), None)
    if literal is None:
        return ""
    return f"  (one of {', '.join(json.dumps(value) for value in typing.get_args(literal))})"


def _default(field: dataclasses.Field[Any]) -> str:
    """The default as a config file or an override writes it (JSON: true, null, "ray", [])."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    return json.dumps(list(value) if isinstance(value, tuple) else value)
