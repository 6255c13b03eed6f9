"""Name -> object registries, so configs and the command line pick components by name.

Adding an algorithm, dataset or model is one module that calls ``register``; no ``if name == ...`` chain exists
anywhere in rayfed. A registration remembers the module that made it (its *origin*): one made outside rayfed
(a user's script or module, an installed plugin) travels to every process of a run (:mod:`rayfed.util.plugins`).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

from rayfed.util.entry_points import broken_plugins, load_installed_plugins
from rayfed.util.errors import ConfigError

T = TypeVar("T")

__all__ = ["Registry", "closest", "caller_module"]


def closest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """Return a `` (did you mean 'x'?)`` hint for a mistyped name, or an empty string."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def caller_module(depth: int = 1) -> str:
    """The name of the module whose code called the function that calls this one (``depth`` frames further up)."""
    return str(sys._getframe(depth + 1).f_globals.get("__name__", "?"))


class Registry(Generic[T]):
    """A named collection of components of one kind.

    >>> sizes: Registry[int] = Registry("example size", field="example.size")
    >>> sizes.register("small")(4)
    4
    >>> sizes.get("small")
    4
    """

    every: ClassVar[dict[str, Registry[Any]]] = {}
    """Every registry, by its kind: where a run's plugin registrations are installed in another process."""

    def __init__(
        self,
        kind: str,
        *,
        field: str,
        also_named_by: tuple[str, ...] = (),
        load: Callable[[str | None], None] | None = None,
    ) -> None:
        """``field`` is the config path that names a component (``also_named_by``: other paths that may);
        ``load(name)``, if given, imports the module that should register ``name``, if there is
        one, and ``load(None)`` every module. A missing name is first looked for with ``load(name)``,
        then with ``load(None)``, then among the installed plugins (:mod:`rayfed.util.entry_points`); a listing
        loads every module first. A process thus imports only the components it uses (the server process of
        FedAvg, for one, no torch)."""
        self.kind = kind
        self.field = field
        self.fields = (field, *also_named_by)
        """Every config path whose value is a name in this registry."""
        self.home = caller_module()
        """The module that made this registry (where a process looks for it)."""
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._load = load
        self._complete = load is None
        Registry.every[kind] = self

    def _load_all(self) -> None:
        if not self._complete and self._load is not None:
            self._load(None)
            self._complete = True
        load_installed_plugins()

    def register(self, name: str, *, origin: str | None = None) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``; names are unique. ``origin`` is the module that
        registers it (by default the caller's); the same module registering a name again (a script or notebook
        cell run twice in one process) replaces its own registration."""
        module = origin or caller_module()

        def decorator(obj: T) -> T:
            if name in self._items and self._origins[name] != module:
                raise ValueError(
                    f"{self.kind} {name!r} is registered twice (by {self._origins[name]} and {module}); "
                    "choose another name"
                )
            self._items[name] = obj
            self._origins[name] = module
            return obj

        return decorator

    def adopt(self, name: str, obj: T, origin: str) -> None:
        """Register ``obj`` under ``name`` as sent from another process (:mod:`rayfed.util.plugins`): it replaces
        an earlier registration of that name from outside rayfed, never one of rayfed's own."""
        if name in self._items and self._origins[name].startswith("rayfed."):
            return
        self._items[name] = obj
        self._origins[name] = origin

    def origin(self, name: str) -> str:
        """The module that registered ``name``."""
        return self._origins[name]

    def registered(self) -> dict[str, tuple[T, str]]:
        """What is registered now, without loading anything: name -> (object, origin)."""
        return {name: (obj, self._origins[name]) for name, obj in self._items.items()}

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
                f"known {self.kind}s: {', '.join(self.names())}. A {self.kind} registered in your own module "
                "is known to a run whose config lists that module in plugins (rayfed docs/architecture.md)"
                + "".join(f"; it may be registered by {said}" for said in broken_plugins())
            ) from None

    def names(self) -> list[str]:
        self._load_all()
        return sorted(self._items)

    def shipped(self) -> list[str]:
        """The names rayfed's own modules registered (what this source tree ships, without plugins), sorted."""
        return [name for name in self.names() if self._origins[name].startswith("rayfed.")]

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self._load_all()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
