"""Where a plugin's code lives, found without running it, and how every process imports it by name.

A *plugin source* is one file of code outside rayfed that a run depends on: a module that registered a name the
config uses (``my_methods``, found on the path as ``.../my_methods.py``), a ``.py`` file that ``plugins`` names, or
the script whose ``__main__`` registered. :class:`PluginSource` holds it as data: the entry as ``plugins`` writes
it, the module name it is imported under, its absolute file and the SHA-256 of the file's bytes (its *digest*).
Nothing here runs a plugin until :func:`load_source` is called: :func:`locate` finds an entry's file by walking the
import path with ``importlib.machinery.PathFinder``, which reads folders and runs no package's code, so what a run
directory names can be compared with what its run was sealed with before any of it runs.

Every process imports a source the same way, so its top level runs in each (a cuDNN flag, a registration into
another library, a monkey-patch): by its name where that name finds the same bytes on the process's path (Ray puts
a driver's script folder and working directory on its workers' path, and a job's ``working_dir`` or a runtime
environment's ``py_modules`` on every node's), or from its recorded file under the same name. A file whose bytes
differ from those recorded is never imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from rayfed.util.errors import PluginError, raised_at

__all__ = [
    "FILE_MODULE",
    "PluginSource",
    "file_digest",
    "locate",
    "source_of_module",
    "load_source",
    "loaded_source",
    "import_plugins",
    "importing_plugins",
    "refuse_run_while_importing",
]

FILE_MODULE = "rayfed_plugin_"
"""The prefix of the module name a ``plugins`` file is imported under (its stem and a hash of its path follow)."""
Kind = Literal["name", "file", "script"]

_loaded: dict[str, PluginSource] = {}
"""The sources this process imported through rayfed (:func:`load_source`), by file."""
_importing: list[str] = []
"""The ``plugins`` entries being imported now (a run started by one of them is refused)."""


@dataclass(frozen=True)
class PluginSource:
    """One file of a run's code outside rayfed (module docstring)."""

    entry: str
    """How ``plugins`` names it: a module name, or the file's path."""
    module: str
    """The name it is imported under (``__main__`` for a script, whose registrations travel by value)."""
    file: str
    """Its absolute path where it was found."""
    sha256: str
    """The SHA-256 of the file's bytes."""
    kind: Kind
    """``name``: importable by :attr:`module` from the folder above it; ``file``: imported from its file under
    :attr:`module`; ``script``: the script run as ``__main__``."""

    def record(self) -> dict[str, str]:
        """The source as plain data (a run marker's entry, a pickled config's)."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PluginSource:
        """A source from :meth:`record`'s data; ValueError naming what is missing or wrong."""
        try:
            values = {key: str(record[key]) for key in ("entry", "module", "file", "sha256", "kind")}
        except (KeyError, TypeError) as error:
            raise ValueError(f"a plugin record must hold entry, module, file, sha256 and kind: {record!r}") from error
        if values["kind"] not in ("name", "file", "script"):
            raise ValueError(f"a plugin record's kind is name, file or script, not {values['kind']!r}")
        return cls(**values)  # type: ignore[arg-type]

    @property
    def short(self) -> str:
        """The digest's first 16 hex digits, as messages and ``--accept-plugin`` write it."""
        return self.sha256[:16]


def file_digest(path: str | Path) -> str:
    """The SHA-256 of the file's bytes (cached while its size and modification time stay)."""
    stat = os.stat(path)
    return _digest(str(path), stat.st_size, stat.st_mtime_ns)


@cache
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _file_alias(path: Path) -> str:
    return f"{FILE_MODULE}{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"


def _find_on_path(name: str, search: Sequence[str] | None = None) -> Path | None:
    """The file module ``name`` would be imported from on ``search`` (default: this process's path and its
    working directory), found without importing anything; None if it is not there."""
    paths: list[str] | None = list(search) if search is not None else [*sys.path, os.getcwd()]
    spec = None
    for depth, part in enumerate(name.split(".")):
        spec = importlib.machinery.PathFinder.find_spec(part, paths)
        if spec is None:
            return None
        if depth < name.count("."):
            if spec.submodule_search_locations is None:
                return None
            paths = list(spec.submodule_search_locations)
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return Path(spec.origin).resolve()


def _root(module: str, file: Path) -> Path:
    """The folder on the path from which ``import module`` finds ``file``."""
    base = file.parent if file.name == "__init__.py" else file.with_suffix("")
    return base.parents[module.count(".")]


def locate(entry: object, where: str = "plugins") -> PluginSource:
    """The source a ``plugins`` entry names (a ``.py`` file, relative to the working directory, or a module
    name on the path or in the working directory), found without importing it; PluginError naming ``where``."""
    if not isinstance(entry, str) or not entry:
        raise PluginError(f"{where}={entry!r} must be a module name (my_methods) or a .py file")
    if entry.endswith(".py"):
        path = Path(entry).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"{where}: no file {str(path)!r}; give the path of the .py file that registers plugins")
        return PluginSource(entry, _file_alias(path), str(path), file_digest(path), "file")
    if not all(part.isidentifier() for part in entry.split(".")):
        raise PluginError(f"{where}={entry!r} is neither a module name (my_methods, my_pkg.methods) nor a .py file")
    found = _find_on_path(entry)
    if found is None:
        raise PluginError(
            f"{where}: no module named {entry!r} on this process's path ({', '.join(sys.path[:3])}, ...) or in the "
            f"working directory {os.getcwd()!r}; run from the folder that holds it, add that folder to PYTHONPATH, "
            "or name its .py file"
        )
    return PluginSource(entry, entry, str(found), file_digest(found), "name")


def source_of_module(module: ModuleType) -> PluginSource | None:
    """Where an imported module's code lives; None for one without a file (a notebook's, made in memory)."""
    name, file = module.__name__, getattr(module, "__file__", None)
    if not file or not Path(file).is_file():
        return None
    path = Path(file).resolve()
    if name == "__main__":
        return PluginSource(str(path), name, str(path), file_digest(path), "script")
    if not name.startswith(FILE_MODULE) and _find_on_path(name) == path:
        return PluginSource(name, name, str(path), file_digest(path), "name")
    return PluginSource(str(path), name, str(path), file_digest(path), "file")


def loaded_source(entry: str) -> PluginSource | None:
    """The source this process imported for ``entry`` (a module name, or a ``.py`` path from here), if any."""
    if entry.endswith(".py"):
        return _loaded.get(str(Path(entry).expanduser().resolve()))
    return next((source for source in _loaded.values() if source.module == entry), None)


def load_source(source: PluginSource, where: str = "") -> ModuleType:
    """Import ``source`` in this process under its module name, once: by name where the path finds its bytes,
    else from its recorded file (its folder put on the path, for a module imported by name). PluginError, naming
    the file and its digest, when no file of those bytes is here or the code raised."""
    where = where or f"plugin {source.entry!r}"
    present = sys.modules.get(source.module)
    if present is not None:
        _loaded.setdefault(source.file, source)
        return present
    file = _file_with_bytes(source)
    with importing_plugins(source.entry):
        try:
            module = _import_name(source, file) if source.kind == "name" else _import_file(source.module, file)
        except PluginError:
            raise
        except Exception as error:  # noqa: BLE001 (the user's code raised: named with its error)
            raise PluginError(
                f"{where} ({file}) failed to import at {raised_at(error, str(file))}: {type(error).__name__}: {error}"
            ) from error
    _loaded.setdefault(source.file, source)
    return module


def _file_with_bytes(source: PluginSource) -> Path:
    """The recorded file if it holds the recorded bytes, else a copy of them that this process's path finds
    (a job's ``working_dir``, a ``py_modules`` package)."""
    recorded = Path(source.file)
    if recorded.is_file() and file_digest(recorded) == source.sha256:
        return recorded
    if source.kind == "name":
        found = _find_on_path(source.module)
        copies = [found] if found is not None else []
    else:
        copies = [Path(folder) / Path(source.file).name for folder in sys.path if folder]
    for copy in copies:
        if copy.is_file() and file_digest(copy) == source.sha256:
            return copy.resolve()
    seen = (
        f"{str(recorded)!r} holds sha256 {file_digest(recorded)[:16]}"
        if recorded.is_file()
        else f"there is no {str(recorded)!r}"
    )
    raise PluginError(
        f"plugin {source.entry!r} (module {source.module!r}, sha256 {source.short}) is not on {socket.gethostname()}: "
        f"{seen}, and no file of its bytes is on the path; send it with the job (ray job submit --working-dir, or "
        "runtime_env py_modules) or install it on every node"
    )


def _import_name(source: PluginSource, file: Path) -> ModuleType:
    """``import module`` with the folder above ``file`` on the path, checked to load ``file``."""
    root = str(_root(source.module, file))
    if _find_on_path(source.module, sys.path) != file:  # the working directory is not on a script's path
        sys.path.insert(0, root)
    module = importlib.import_module(source.module)
    loaded = Path(getattr(module, "__file__", "") or "").resolve()
    if loaded != file:
        raise PluginError(f"plugin {source.entry!r}: importing {source.module!r} loaded {loaded}, not {file}")
    return module


def _import_file(name: str, path: Path) -> ModuleType:
    """Execute ``path`` as module ``name`` (kept in ``sys.modules`` only if it ran to its end)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _imported_from(path: str) -> ModuleType | None:
    """A module this process imported from ``path`` already (the running script, a module of any name)."""
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and file.endswith(".py") and str(Path(file).resolve()) == path:
            return module
    return None


def import_plugins(entries: Sequence[object], field: str = "plugins") -> None:
    """Import each module name or ``.py`` file of ``entries``, as the user wrote them (once per process: a file
    this process runs or imported already, under any name, is not imported again); PluginError naming the entry."""
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]={entry!r}"
        source = locate(entry, where)
        if source.kind == "name" and source.module in sys.modules:
            _loaded.setdefault(source.file, source)
            continue
        present = _imported_from(source.file)
        if present is not None:
            _loaded.setdefault(source.file, source_of_module(present) or source)
            continue
        load_source(source, where)


@contextlib.contextmanager
def importing_plugins(entry: str) -> Iterator[None]:
    """Mark ``entry`` as being imported (:func:`refuse_run_while_importing`)."""
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
