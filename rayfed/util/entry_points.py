"""Installed plugins: the modules that distributions declare in the entry-point group :data:`ENTRY_POINTS`.

A package that registers methods, models or datasets of its own declares
``[project.entry-points."rayfed.plugins"] mine = "my_package.methods"``; every process that has it installed imports
it the first time a name is looked up and missing (:meth:`rayfed.util.registry.Registry.get` calls
:func:`load_installed_plugins`). Installed code is the environment's, as trusted as rayfed itself: nothing of it
travels with a run, and a run directory cannot name it. A package whose module fails to import is named in a
warning (its entry point, the file and line that raised) and left out: ``rayfed list`` and the runs that do not
use its names go on, and a run that does is told that the name may be that package's (:func:`broken_plugins`).
"""

from __future__ import annotations

import importlib.metadata
import logging

from rayfed.util.errors import raised_at

__all__ = ["ENTRY_POINTS", "load_installed_plugins", "is_installed_plugin", "broken_plugins"]

logger = logging.getLogger(__name__)

ENTRY_POINTS = "rayfed.plugins"
"""The entry-point group of installed plugin packages: each entry point names a module that registers."""

_installed: set[str] = set()
"""Modules imported from :data:`ENTRY_POINTS` (every process that has the package imports them itself)."""
_broken: list[str] = []
"""What each installed plugin that failed to import said (:func:`broken_plugins`)."""
_loaded = False


def load_installed_plugins() -> None:
    """Import every installed plugin module, once per process; one that fails to import is named in a warning and
    left out (:func:`broken_plugins`), so that what does not need it goes on."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            module = point.load()
        except Exception as error:  # noqa: BLE001 (a broken plugin is named, whatever it raised)
            package = getattr(point.dist, "name", None) or "unknown"
            said = (
                f"the installed plugin {point.name!r} (module {point.value}, package {package!r}, entry point group "
                f"{ENTRY_POINTS!r}) failed to import at {raised_at(error)}: {type(error).__name__}: {error}"
            )
            _broken.append(said)
            logger.warning("%s; left out: fix or uninstall its package (pip uninstall %s)", said, package)
            continue
        _installed.add(getattr(module, "__name__", point.value))


def broken_plugins() -> list[str]:
    """What each installed plugin that failed to import said (none if every one imported)."""
    return list(_broken)


def is_installed_plugin(origin: str) -> bool:
    """Whether module ``origin`` is (inside) an installed plugin's module."""
    return any(origin == m or origin.startswith(m + ".") for m in _installed)
