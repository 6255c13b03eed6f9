"""Name -> object registries, so configs and the command line pick components by name.

Adding an algorithm, dataset or model is one module that calls ``register``;
no ``if name == ...`` chain exists anywhere in rayfed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from rayfed.errors import ConfigError

T = TypeVar("T")

__all__ = ["Registry", "closest"]


def closest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """Return a `` (did you mean 'x'?)`` hint for a mistyped name, or an empty string."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


class Registry(Generic[T]):
    """A named collection of components of one kind.

    >>> models: Registry[int] = Registry("model", field="model.name")
    >>> models.register("cnn4")(4)
    4
    >>> models.get("cnn4")
    4
    """

    def __init__(self, kind: str, *, field: str) -> None:
        self.kind = kind
        self.field = field
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``; names are unique."""

        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Look ``name`` up; an unknown name raises ConfigError listing the known ones."""
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {self.field}={name!r}{closest(name, self.names())}; "
                f"known {self.kind}s: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
