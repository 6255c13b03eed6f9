"""What ``rayfed list`` prints, without importing torch when nothing changed.

The registries (algorithms, datasets, models) fill up as their modules are imported, and
those modules import torch, which alone takes about 2 s on a 2-core machine. The listing
is a pure function of the package's source, so it is computed once from the live
registries and cached under the user's cache directory, keyed by a fingerprint of every
source file of the package (path, size, modification time), one cache file per installed
copy of the package. Any edit, install or upgrade changes the fingerprint, so a stale
listing is never shown; the first call after one imports the registries as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rayfed.util.documented import reference

if TYPE_CHECKING:
    from rayfed.algorithms import Algorithm

__all__ = ["Catalogue", "catalogue", "fast_path", "params_reference", "source_fingerprint", "cache_dir"]

_PACKAGE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Catalogue:
    """The registered names: algorithms with their summaries and params reference, datasets, models."""

    algorithms: dict[str, str]
    """name -> one-line summary."""
    fast_path: dict[str, str]
    """name -> what the fast path does with its clients (:class:`~rayfed.algorithms.registry.Capabilities`)."""
    params: dict[str, str]
    """name -> the ``rayfed list ALGORITHM`` text."""
    datasets: list[str]
    models: list[str]


def source_fingerprint(package: Path = _PACKAGE) -> str:
    """A hash of (relative path, size, mtime) of every ``.py`` file under ``package``."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rayfed`` (``~/.cache/rayfed`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rayfed"


def fast_path(algorithm: Algorithm) -> str:
    """What the fast path does with the algorithm's clients: ``stacks, replays``, or what it does not and why."""
    capabilities = algorithm.capabilities
    if capabilities.stacks and capabilities.replays:
        return "stacks, replays"
    missing = "stacked" if not capabilities.stacks else "replayed"
    return f"{capabilities.summary()} (not {missing}: {capabilities.reason})"


def params_reference(algorithm: Algorithm) -> str:
    """``rayfed list ALGORITHM``: summary, display label, the fast path, and every ``algorithm.params`` field."""
    fields = reference(algorithm.params_type)
    capabilities = algorithm.capabilities
    lines = [
        f"{algorithm.name}: {algorithm.summary}",
        f"label in figures with the defaults: {algorithm.label(algorithm.params_type())}",
        "fast path: "
        + (
            "a call's clients train as one stack (engine.vectorize) and their steps replay from CUDA "
            "graphs (engine.cuda_graphs)"
            if capabilities.stacks and capabilities.replays
            else fast_path(algorithm)
        ),
        "",
        "algorithm.params (path = default), set as algorithm.params.NAME=value:" if fields else "takes no params",
    ]
    return "\n".join(lines + (["", fields] if fields else []))


def _from_registries() -> Catalogue:
    """Import the registries (this is what imports torch) and read rayfed's own registrations (what the cache's
    fingerprint covers; a plugin registered in this process is not part of this source tree)."""
    from rayfed.algorithms import ALGORITHMS
    from rayfed.data import DATASETS
    from rayfed.models import MODELS

    algorithms = {name: ALGORITHMS.get(name) for name in ALGORITHMS.shipped()}
    return Catalogue(
        algorithms={name: algorithm.summary for name, algorithm in algorithms.items()},
        fast_path={name: fast_path(algorithm) for name, algorithm in algorithms.items()},
        params={name: params_reference(algorithm) for name, algorithm in algorithms.items()},
        datasets=DATASETS.shipped(),
        models=MODELS.shipped(),
    )


def catalogue(cache: Path | None = None) -> Catalogue:
    """The catalogue of this source tree: read from the cache if fresh, else built and cached.

    A cache that cannot be read or written (read-only home, damaged file) is ignored: the
    catalogue is then built from the registries, which is only slower.
    """
    installed = hashlib.sha256(str(_PACKAGE).encode()).hexdigest()[:12]
    path = (cache or cache_dir()) / f"catalogue-{installed}.json"
    fingerprint = source_fingerprint()
    try:
        saved = json.loads(path.read_text())
        if saved.pop("fingerprint") == fingerprint:
            return Catalogue(**saved)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    built = _from_registries()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"fingerprint": fingerprint, **asdict(built)}))
        tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass
    return built
