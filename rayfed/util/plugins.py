"""Methods, models, datasets and partitioners registered outside rayfed, known to every process of a run.

A researcher adds a method by registering it in their own script or module (``register_algorithm(...)`` at its
bottom), a model, dataset or partitioner likewise, and runs it: rayfed need not be forked. The run's other
processes (Ray's ClientWorkers and ServerActor, a ``ray job submit`` cluster's nodes, ``rayfed tune``'s and
``rayfed reproduce``'s runs, a resumed run) import rayfed, not that code, so rayfed brings it to them, in the
three ways a Ray user expects:

* **By value, with the config.** A registration whose origin is not rayfed's (a *plugin registration*) travels
  inside a pickled :class:`~rayfed.config.RunConfig` when the config names it (its algorithm, client half, model,
  dataset, partitioner), with every other registration of the module that made it: :func:`pack` pickles them
  and the config together with cloudpickle, the registering modules' code by value (as Ray sends the functions of a
  driver script), and :func:`unpack` installs them in the receiving process before anything is looked up. Ray
  pickles the config to every actor and task of a run, so nothing else is needed there. A registration that
  cannot be pickled is refused before a run writes anything (:func:`check_shippable`), naming its module.
* **By name, in the config.** ``plugins`` lists modules (``my_methods``) or ``.py`` files to import before the
  config's names are looked up (:func:`import_plugins`): how a run started from the command line finds a user's
  method. A run records the modules that registered plugins in its saved config (:func:`plugin_sources`), so
  ``rayfed run --resume`` finds them again.
* **As an installed package.** A distribution that declares an entry point in the group :data:`ENTRY_POINTS`
  (``[project.entry-points."rayfed.plugins"] mine = "my_package.methods"``) is imported when a name is missing,
  in every process that has it installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from rayfed.util.config_tree import get_path
from rayfed.util.errors import PluginError
from rayfed.util.registry import Registry

__all__ = [
    "ENTRY_POINTS",
    "Registration",
    "plugin_registrations",
    "by_value_modules",
    "pack",
    "unpack",
    "check_shippable",
    "import_plugins",
    "plugin_sources",
    "importing_plugins",
    "refuse_run_while_importing",
]

ENTRY_POINTS = "rayfed.plugins"
"""The entry-point group of installed plugin packages: each entry point names a module that registers."""

Registration = tuple[str, str, Any, str]
"""(the registry's module and kind, name, registered object, origin module)."""

_FILE_MODULE = "rayfed_plugin_"
"""The prefix of the module name a ``plugins`` file is imported under."""
_installed: set[str] = set()
"""Modules imported from :data:`ENTRY_POINTS` (every process that has the package imports them itself)."""
_entry_points_loaded = False
_pickling = threading.Lock()
"""Held while modules are registered with cloudpickle by value (a process-wide setting): trials of a study pack
their configs from several threads."""
_importing: list[str] = []
"""The ``plugins`` entries being imported now (a run started by one of them is refused)."""


def _load_entry_points() -> None:
    """Import every installed plugin module once per process."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            module = point.load()
        except Exception as error:  # noqa: BLE001 (a broken plugin is named, whatever it raised)
            raise PluginError(
                f"the installed plugin {point.name!r} ({point.value}, entry point group {ENTRY_POINTS!r}) failed to "
                f"import: {type(error).__name__}: {error}; fix or uninstall its package"
            ) from error
        _installed.add(getattr(module, "__name__", point.value))


Registry.plugin_loader = _load_entry_points


def _is_plugin(origin: str) -> bool:
    """Whether a registration of ``origin`` must travel: not rayfed's, not an installed plugin's."""
    top = origin.split(".")[0]
    return top != "rayfed" and not any(origin == m or origin.startswith(m + ".") for m in _installed)


def plugin_registrations(config: Any = None) -> list[Registration]:
    """The registrations made in this process outside rayfed and installed plugins, in rayfed's registries; with
    ``config`` (a :class:`~rayfed.config.RunConfig` or its fields), those of the modules that registered a name the
    config uses, so a run carries its own method and no other code the process happens to hold."""
    every = [
        (f"{registry.home}:{kind}", name, obj, origin)
        for kind, registry in sorted(Registry.every.items())
        if registry.home.startswith("rayfed.")
        for name, (obj, origin) in registry.registered().items()
        if _is_plugin(origin)
    ]
    if config is None:
        return every
    used = {
        origin
        for where, name, _, origin in every
        if any(get_path(config, path) == name for path in Registry.every[where.split(":", 1)[1]].fields)
    }
    return [registration for registration in every if registration[3] in used]


def _by_value(origins: Sequence[str]) -> list[Any]:
    """The top-level modules of ``origins`` (other than ``__main__``, which cloudpickle sends by value anyway), to
    pickle by value: a node of the cluster may not have them."""
    modules = []
    for origin in dict.fromkeys(o.split(".")[0] for o in origins):
        module = sys.modules.get(origin)
        if origin != "__main__" and module is not None:
            modules.append(module)
    return modules


def by_value_modules(config: Any) -> list[Any]:
    """The modules whose classes Ray must send by value (messages and uploads of a plugin method are instances of
    them): the top-level modules of the origins of ``config``'s plugin registrations, other than ``__main__``."""
    return _by_value([origin for *_, origin in plugin_registrations(config)])


@contextlib.contextmanager
def _pickled_by_value(modules: Sequence[Any]) -> Iterator[None]:
    """cloudpickle sends ``modules``' code by value in the body (one thread at a time: the setting is global)."""
    with _pickling:
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
        try:
            yield
        finally:
            for module in modules:
                cloudpickle.unregister_pickle_by_value(module)


def pack(config: Any) -> bytes:
    """A config's fields with its plugin registrations, pickled by value (module docstring); :func:`unpack`
    reverses it."""
    registrations = plugin_registrations(config)
    with _pickled_by_value(_by_value([origin for *_, origin in registrations])):
        return cloudpickle.dumps((registrations, config))


def unpack(blob: bytes) -> Any:
    """The payload :func:`pack` pickled, after installing its registrations in this process's registries."""
    registrations, payload = cloudpickle.loads(blob)
    for where, name, obj, origin in registrations:
        home, kind = where.split(":", 1)
        importlib.import_module(home)  # the registry's module, which this process may not have imported yet
        Registry.every[kind].adopt(name, obj, origin)
    return payload


def check_shippable(config: Any) -> None:
    """Refuse ``config``'s plugin registrations that cannot reach another process (a lambda holding a lock, an
    open file), naming the module that made them and why; before a run on Ray writes anything."""
    for where, name, obj, origin in plugin_registrations(config):
        kind = where.split(":", 1)[1]
        try:
            with _pickled_by_value(_by_value([origin])):
                cloudpickle.dumps(obj)
        except Exception as error:  # noqa: BLE001 (pickling fails in many ways: each is named)
            raise PluginError(
                f"the {kind} {name!r} registered by module {origin!r} cannot be sent to the run's other processes "
                f"({type(error).__name__}: {error}); register objects defined at module level, holding no open "
                "files, locks or connections, or run with engine.backend=local"
            ) from error


def plugin_sources(config: Any) -> tuple[str, ...]:
    """What a later process imports to register ``config``'s plugins again: the registering modules by name, and
    a script's path for what ``__main__`` registered (none where ``__main__`` has no file: a notebook)."""
    sources = []
    for *_, origin in plugin_registrations(config):
        file = getattr(sys.modules.get(origin), "__file__", None)
        if origin != "__main__" and not origin.startswith(_FILE_MODULE):
            sources.append(origin)
        elif file:
            sources.append(str(Path(file).resolve()))
    return tuple(dict.fromkeys(sources))


@contextlib.contextmanager
def importing_plugins(entry: str) -> Iterator[None]:
    _importing.append(entry)
    try:
        yield
    finally:
        _importing.pop()


def refuse_run_while_importing() -> None:
    """Raise if a ``plugins`` entry is being imported: its module started a run at import."""
    if _importing:
        raise PluginError(
            f"plugins entry {_importing[-1]!r} started a run when it was imported; put the code that runs under "
            '`if __name__ == "__main__":` so that importing it only registers'
        )


def import_plugins(entries: Sequence[str], field: str = "plugins") -> None:
    """Import each module name or ``.py`` file of ``entries`` (once per process); PluginError naming the entry."""
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]={entry!r}"
        if not isinstance(entry, str) or not entry:
            raise PluginError(f"{where} must be a module name (my_methods) or a .py file")
        with importing_plugins(entry):
            if entry.endswith(".py"):
                _import_file(entry, where)
            else:
                _import_module(entry, where)


def _import_module(name: str, where: str) -> None:
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and name.startswith(error.name):
            raise PluginError(
                f"{where}: no module named {name!r} on this process's path ({', '.join(sys.path[:3])}, ...); run from "
                "the folder that holds it, add that folder to PYTHONPATH, or name its .py file"
            ) from error
        raise PluginError(f"{where} failed to import: {type(error).__name__}: {error}") from error
    except PluginError:
        raise
    except Exception as error:  # noqa: BLE001 (the user's module raised: named with its error)
        raise PluginError(f"{where} failed to import: {type(error).__name__}: {error}") from error


def _import_file(entry: str, where: str) -> None:
    path = Path(entry).expanduser().resolve()
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and Path(main).resolve() == path:  # the running script registered its plugins already
        return
    name = f"{_FILE_MODULE}{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return
    if not path.is_file():
        raise PluginError(f"{where}: no file {str(path)!r}; give the path of the .py file that registers the plugin")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except PluginError:
        del sys.modules[name]
        raise
    except Exception as error:  # noqa: BLE001 (the user's file raised: named with its error)
        del sys.modules[name]
        raise PluginError(f"{where} failed to import: {type(error).__name__}: {error}") from error
