"""Installed plugins: the modules that distributions declare in the entry-point group :data:`ENTRY_POINTS`.

A package that registers methods, models or datasets of its own declares
``[project.entry-points."rayfed.plugins"] mine = "my_package.methods"``; every process that has it installed imports
it the first time a name is looked up and missing (:meth:`rayfed.util.registry.Registry.get` calls
:func:`load_installed_plugins`). Installed code is the environment's, as trusted as rayfed itself: nothing of it
travels with a run, and a run directory cannot name it.
"""

from __future__ import annotations

import importlib.metadata

from rayfed.util.errors import PluginError

__all__ = ["ENTRY_POINTS", "load_installed_plugins", "is_installed_plugin"]

ENTRY_POINTS = "rayfed.plugins"
"""The entry-point group of installed plugin packages: each entry point names a module that registers."""

_installed: set[str] = set()
"""Modules imported from :data:`ENTRY_POINTS` (every process that has the package imports them itself)."""
_loaded = False


def load_installed_plugins() -> None:
    """Import every installed plugin module, once per process; PluginError naming one that fails to import."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            module = point.load()
        except Exception as error:  # noqa: BLE001 (a broken plugin is named, whatever it raised)
            raise PluginError(
                f"the installed plugin {point.name!r} ({point.value}, entry point group {ENTRY_POINTS!r}) failed to "
                f"import: {type(error).__name__}: {error}; fix or uninstall its package"
            ) from error
        _installed.add(getattr(module, "__name__", point.value))


def is_installed_plugin(origin: str) -> bool:
    """Whether module ``origin`` is (inside) an installed plugin's module."""
    return any(origin == m or origin.startswith(m + ".") for m in _installed)
