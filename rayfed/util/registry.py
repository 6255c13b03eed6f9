"""Name -> object registries, so configs and the command line pick components by name.

Adding an algorithm, dataset or model is one module that calls ``register``;
no ``if name == ...`` chain exists anywhere in rayfed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from rayfed.util.errors import ConfigError

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

    def __init__(self, kind: str, *, field: str, load: Callable[[str | None], None] | None = None) -> None:
        """``load(name)``, if given, imports the module that should register ``name``, if there is
        one, and ``load(None)`` every module. A missing name is first looked for with ``load(name)``,
        then with ``load(None)``; a listing loads every module first. A process thus imports only
        the components it uses (the server process of FedAvg, for one, no torch)."""
        self.kind = kind
        self.field = field
        self._items: dict[str, T] = {}
        self._load = load
        self._complete = load is None

    def _load_all(self) -> None:
        if not self._complete and self._load is not None:
            self._load(None)
            self._complete = True

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
        if name not in self._items and self._load is not None:
            self._load(name)
            if name not in self._items:
                self._load_all()
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {self.field}={name!r}{closest(name, self.names())}; "
                f"known {self.kind}s: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        self._load_all()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self._load_all()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
