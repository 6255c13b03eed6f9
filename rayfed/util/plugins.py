"""Methods, models, datasets and partitioners registered outside rayfed, known to every process of a run.

A researcher adds a method by registering it in their own module or script (``register_algorithm(...)`` at its
bottom), a model, dataset or partitioner likewise, and runs it: rayfed need not be forked. The run's other
processes (Ray's ClientWorkers, NodeAgents and ServerActor, a ``ray job submit`` cluster's nodes, ``rayfed
reproduce``'s tasks) receive the run's :class:`~rayfed.config.RunConfig`, which is plain data, in a
:class:`WithCode` that what ships it wraps it in, and rayfed brings its code beside it as Ray brings code:

* **By name.** A module that registered a name the config uses, and each ``plugins`` entry this process imported,
  is one of the run's *sources* (:func:`run_sources`, :mod:`rayfed.util.plugin_sources`): the pickled config
  carries each as data (module name, file, SHA-256), and :func:`unpack` imports it in the receiving process before
  anything else is unpickled, by name where its path finds those bytes (Ray's workers have the driver's script
  folder and working directory on their path, a job its ``working_dir``, a runtime environment its
  ``py_modules``), else from its file. Every process thus runs the module's top level, tracebacks name its file,
  line and source line, and its classes (messages, uploads) travel by reference. The module's globals never
  travel.
* **By value, for what has no importable home.** What a script's ``__main__`` or a notebook registered is pickled
  with cloudpickle (:func:`pack`, code with its file name kept) and installed by :func:`unpack`; a payload over
  :data:`LARGE_PAYLOAD` bytes is named in a warning with the global that makes it large
  (:func:`largest_global`), and one that cannot be pickled is refused before a run writes anything
  (:func:`check_shippable`).
* **As an installed package** (:mod:`rayfed.util.entry_points`): imported by every process that has it.

A run records its sources' entries in its saved config (:func:`plugin_sources`) and their digests in its sealed
marker (:mod:`rayfed.provenance.run_seal`), so ``rayfed run --resume`` imports the code it ran, and no other.
"""

from __future__ import annotations

import importlib
import io
import logging
import pickle
import sys
import types
from collections import ChainMap
from collections.abc import Iterator, Sequence
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as cloudpickle_internals

from rayfed.util.config_tree import get_path
from rayfed.util.entry_points import is_installed_plugin
from rayfed.util.errors import PluginError
from rayfed.util.plugin_sources import PluginSource, load_source, loaded_source, source_of_module
from rayfed.util.registry import Registry

logger = logging.getLogger(__name__)

__all__ = [
    "LARGE_PAYLOAD",
    "Registration",
    "plugin_registrations",
    "run_sources",
    "plugin_sources",
    "pack",
    "unpack",
    "WithCode",
    "check_shippable",
    "largest_global",
]

LARGE_PAYLOAD = 1 << 20
"""Bytes of code and data pickled by value above which a run is warned (:func:`pack`)."""

Registration = tuple[str, str, Any, str]
"""(the registry's module and kind, name, registered object, origin module)."""

_warned: set[tuple[str, str]] = set()
"""(module, global) pairs already named in a warning by this process."""


def _is_plugin(origin: str) -> bool:
    """Whether a registration of ``origin`` must travel: not rayfed's, not an installed plugin's."""
    return origin.split(".")[0] != "rayfed" and not is_installed_plugin(origin)


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


def _source_of(origin: str) -> PluginSource | None:
    module = sys.modules.get(origin)
    return None if module is None else source_of_module(module)


def run_sources(config: Any) -> list[PluginSource]:
    """The files of ``config``'s code outside rayfed: each of its ``plugins`` entries that this process imported
    (as the entry is written: a relative path stays relative), and the modules (and script) that registered the
    names it uses; one source per file."""
    sources: dict[str, PluginSource] = {}
    for entry in get_path(config, "plugins") or ():
        source = loaded_source(str(entry))
        if source is not None:
            sources.setdefault(source.file, source)
    for *_, origin in plugin_registrations(config):
        source = _source_of(origin)
        if source is not None:
            sources.setdefault(source.file, source)
    return list(sources.values())


def plugin_sources(config: Any) -> tuple[str, ...]:
    """What a later process imports to load ``config``'s code again, whatever its working directory: each
    source's module name where it is imported by name, else its file's absolute path (a script's for what
    ``__main__`` registered)."""
    return tuple(dict.fromkeys(s.module if s.kind == "name" else s.file for s in run_sources(config)))


def _by_value(origin: str) -> bool:
    """Whether ``origin``'s registrations travel by value: a script's or a notebook's ``__main__``, which no other
    process can import (a module made in memory is refused: :func:`check_shippable`)."""
    return origin == "__main__"


def _code_keeping_its_file(code: types.CodeType) -> tuple[Any, ...]:
    """cloudpickle's reduction of a code object, with the file name kept (cloudpickle writes ``<dynamic-code>``):
    a traceback on another process names the file and line, and shows the line where the file is there."""
    constructor, args = cloudpickle_internals._code_reduce(code)
    at = args.index("<dynamic-code>")
    return constructor, (*args[:at], code.co_filename, *args[at + 1 :])


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_keeping_its_file}, cloudpickle.Pickler.dispatch_table)


def _dumps(payload: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(payload)
    return buffer.getvalue()


def pack(fields: Any) -> bytes:
    """A config (or its fields) pickled with its code: its sources as data, what has no importable home by value
    (module docstring); :func:`unpack` reverses it."""
    carried = [registration for registration in plugin_registrations(fields) if _by_value(registration[3])]
    body = _dumps((carried, fields))
    if len(body) > LARGE_PAYLOAD and carried:
        _warn_large(len(body), carried)
    records = [source.record() for source in run_sources(fields) if source.kind != "script"]
    return pickle.dumps((records, body), protocol=pickle.HIGHEST_PROTOCOL)


def unpack(blob: bytes) -> Any:
    """The payload :func:`pack` pickled: its sources imported in this process first, then its by-value
    registrations installed in this process's registries."""
    records, body = pickle.loads(blob)
    for record in records:
        load_source(PluginSource.from_record(record))
    carried, payload = cloudpickle.loads(body)
    for where, name, obj, origin in carried:
        home, kind = where.split(":", 1)
        importlib.import_module(home)  # the registry's module, which this process may not have imported yet
        Registry.every[kind].adopt(name, obj, origin)
    return payload


class WithCode:
    """A run's config as another process receives it: pickled with the code it names beside it (:func:`pack`), and
    unpickled with that code imported and installed first (:func:`unpack`). The config is plain data, which pickles
    as one; what ships it to another process (the Ray executor to its actors and node agents, ``rayfed reproduce``
    to its tasks) wraps it in this, and the receiver reads :attr:`config`."""

    __slots__ = ("config",)

    def __init__(self, config: Any) -> None:
        self.config = config

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (_with_code, (pack(self.config),))


def _with_code(blob: bytes) -> WithCode:
    """A :class:`WithCode` unpickled: its code installed in this process, then its config."""
    return WithCode(unpack(blob))


def check_shippable(config: Any) -> None:
    """Refuse, naming the module and why, ``config``'s registrations that cannot reach another process: one that
    travels by value but does not pickle (a lambda holding a lock, an open file), and one of a module made in memory
    that is not ``__main__`` (no file for another process to import); before a run on Ray writes anything."""
    for where, name, obj, origin in plugin_registrations(config):
        kind = where.split(":", 1)[1]
        if origin != "__main__" and _source_of(origin) is None:
            raise PluginError(
                f"the {kind} {name!r} registered by module {origin!r} cannot be sent to the run's other processes: "
                "the module has no file for them to import (it was made in memory); register it from a module file "
                "or from the script or notebook itself (__main__), or run with engine.backend=local"
            )
        if origin != "__main__":
            continue
        try:
            _dumps(obj)
        except Exception as error:  # noqa: BLE001 (pickling fails in many ways: each is named)
            raise PluginError(
                f"the {kind} {name!r} registered by module {origin!r} cannot be sent to the run's other processes "
                f"({type(error).__name__}: {error}); register objects defined at module level, holding no open "
                "files, locks or connections (or move them to a module of their own, imported by name there), or "
                "run with engine.backend=local"
            ) from error


def _functions(obj: Any, origin: str) -> Iterator[types.FunctionType]:
    """The functions ``obj`` (a function, or a class and its bases from ``origin``) holds."""
    if isinstance(obj, types.FunctionType):
        yield obj
    elif isinstance(obj, type):
        for cls in obj.__mro__:
            if cls.__module__ != origin:
                continue
            for value in vars(cls).values():
                inner = getattr(value, "__func__", value)
                for part in (inner, getattr(value, "fget", None)):
                    if isinstance(part, types.FunctionType):
                        yield part
    elif hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            if isinstance(value, type | types.FunctionType) and getattr(value, "__module__", None) == origin:
                yield from _functions(value, origin)


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _global_names(constant)


def largest_global(carried: Sequence[Registration]) -> tuple[str, str, int] | None:
    """(module, global's name, its pickled bytes) of the largest module global that the by-value registrations'
    code refers to (the arrays, tables and models that ride along), or None if they refer to none."""
    sizes: dict[tuple[str, str], int] = {}
    for *_, obj, origin in carried:
        for function in _functions(obj, origin):
            for name in set(_global_names(function.__code__)):
                value = function.__globals__.get(name)
                if name in function.__globals__ and not isinstance(value, type | types.ModuleType | types.FunctionType):
                    sizes.setdefault((origin, name), len(_dumps(value)))
    if not sizes:
        return None
    (origin, name), size = max(sizes.items(), key=lambda item: item[1])
    return origin, name, size


def _warn_large(total: int, carried: Sequence[Registration]) -> None:
    largest = largest_global(carried)
    key = (largest[0], largest[1]) if largest else ("", "")
    if key in _warned:
        return
    _warned.add(key)
    origin = carried[0][3]
    culprit = (
        f"the global {largest[1]!r} of {largest[0]} ({largest[2] / 2**20:.1f} MB), which its code refers to"
        if largest
        else "its classes and functions"
    )
    logger.warning(
        "the run's config carries %.1f MB of code and data by value to every process, from module %s: %s travels "
        "with it; move the method to a module of its own (imported by name in every process, where its globals are "
        "made) or make that value inside the code that uses it",
        total / 2**20,
        origin,
        culprit,
    )
