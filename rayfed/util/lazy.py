"""Names a package exports but imports on first use (PEP 562), so importing the package stays light.

``import rayfed`` and the command line (``rayfed --help``, ``rayfed list``) must not import
torch, Ray or Optuna: the package ``__init__`` modules map each public name to the module
that defines it, and the name is imported when it is first read.

>>> exports, getattr_, dir_ = lazy_exports("rayfed", {"rayfed.util.errors": ("ConfigError",)})
>>> exports, getattr_("ConfigError").__name__
(['ConfigError'], 'ConfigError')
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, Sequence[str]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package``, whose names live in ``homes`` (module -> names).

    A name read once is stored in the package, so later reads are plain attribute lookups.
    """
    home = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        try:
            module = home[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return list(home), __getattr__, __dir__
