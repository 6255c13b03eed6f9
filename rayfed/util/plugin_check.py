"""Code provenance's comparator and acceptance: whether the files a process would run are those a record sealed.

A run's marker and a study record, sealed, each file of their code outside rayfed (the record type and the loader:
:mod:`rayfed.util.plugin_sources`). A continuation (``rayfed run --resume``, a ``rayfed reproduce`` cell over an
existing run directory, ``rayfed.run(config, resume=True)``, a resumed study) compares the files it would run with
those (:func:`check_sources`) before anything runs, and refuses, in one line naming the file and both digests, a
file whose bytes changed, one that is missing or not named, a module name or relative path that now resolves to
another file, and a file the run did not run before. A change is accepted by its new digest, as typed by the user
(``--accept-plugin DIGEST``; in Python, :func:`accept_plugins`), and recorded beside the seal.

It sits below every layer that keeps such a record (the engine's run directories, ``rayfed tune``'s studies,
``rayfed reproduce``'s cells), none of which imports another for it.
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any

from rayfed.util.errors import ConfigError, PluginError
from rayfed.util.plugin_sources import PluginSource, file_digest

__all__ = [
    "accept_plugins",
    "accept_hint",
    "accepted_digests",
    "is_accepted",
    "recorded_sources",
    "check_sources",
    "check_named",
    "now",
]

_ACCEPTED: ContextVar[frozenset[str]] = ContextVar("rayfed accepted plugin digests", default=frozenset())
_SHORTEST = 16
"""The fewest hex digits of a digest that accept a file (as refusals print them)."""


@contextmanager
def accept_plugins(*digests: str) -> Iterator[None]:
    """Within the block, a continuation accepts a plugin file whose SHA-256 starts with one of ``digests`` (the 16
    hex digits a refusal names, or more) in place of the file its run was sealed with; the marker records it."""
    for digest in digests:
        if len(digest) < _SHORTEST or set(digest.lower()) - set(string.hexdigits.lower()):
            raise ConfigError(
                f"--accept-plugin {digest!r} is not a digest: give the {_SHORTEST} (or more) hex digits of sha256 "
                "that the refusal names"
            )
    token = _ACCEPTED.set(_ACCEPTED.get() | {digest.lower() for digest in digests})
    try:
        yield
    finally:
        _ACCEPTED.reset(token)


def now() -> str:
    """The time a record of provenance (a marker's entry, an accepted change) records, to the second."""
    return datetime.now().isoformat(timespec="seconds")


def accepted_digests() -> tuple[str, ...]:
    """The digests :func:`accept_plugins` accepts here (to hand to another process)."""
    return tuple(sorted(_ACCEPTED.get()))


def is_accepted(sha256: str) -> bool:
    """Whether a file of this digest is accepted here (:func:`accept_plugins`): a plugin's, or a trace's
    (:mod:`rayfed.provenance.trace_seal`)."""
    return any(sha256.startswith(digest) for digest in _ACCEPTED.get())


def _accepted(source: PluginSource) -> bool:
    return is_accepted(source.sha256)


def accept_hint(short: str) -> str:
    """How to accept a file of the digest ``short`` (its first 16 hex digits)."""
    return f"accept it with --accept-plugin {short} (in Python: with rayfed.accept_plugins({short!r}))"


def _accept_hint(source: PluginSource) -> str:
    return accept_hint(source.short)


def recorded_sources(records: Sequence[Mapping[str, Any]], where: str) -> list[PluginSource]:
    """The sources of a marker's (or a study's) records; PluginError naming ``where`` if one cannot be read."""
    try:
        return [PluginSource.from_record(record) for record in records]
    except ValueError as error:
        raise PluginError(f"{where}: its record of its plugins cannot be read ({error})") from error


def check_sources(
    where: str, sealed_with: Sequence[PluginSource], current: Sequence[PluginSource], *, note: str = ""
) -> list[dict[str, Any]]:
    """Refuse ``current`` (the files a continuation of ``where`` runs) unless they are the files ``sealed_with``,
    byte for byte, or changes accepted by digest (:func:`accept_plugins`); returns the accepted changes, which the
    marker (or study) records. PluginError naming the file, both digests and how to accept; ``note`` says why the
    record may lack a file (a marker from before markers were sealed)."""
    changes: list[dict[str, Any]] = []
    matched: set[str] = set()
    for sealed in sealed_with:
        twin = next((c for c in current if c.sha256 == sealed.sha256), None)
        if twin is not None:  # the same bytes, where they were or moved
            matched.add(twin.file)
            continue
        other = next((c for c in current if c.file == sealed.file), None) or next(
            (c for c in current if sealed.entry in (c.entry, c.module) or c.module == sealed.module), None
        )
        if other is None:
            raise PluginError(_not_run_here(where, sealed))
        if not _accepted(other):
            now_at = "now holds" if other.file == sealed.file else f"resolves here to {other.file}, which holds"
            raise PluginError(
                f"{where} was sealed with plugin {sealed.entry!r} ({sealed.file}, sha256 {sealed.short}), which "
                f"{now_at} sha256 {other.short}: not the bytes sealed; restore that file, or "
                f"{_accept_hint(other)}"
            )
        matched.add(other.file)
        changes.append({"file": other.file, "sealed": sealed.sha256, "now": other.sha256, "at": now()})
    for source in current:
        if source.file in matched:
            continue
        if not _accepted(source):
            names = ", ".join(repr(s.entry) for s in sealed_with) or "no plugin"
            raise PluginError(
                f"{where}: plugin {source.entry!r} ({source.file}, sha256 {source.short}) is not code it was sealed "
                f"with ({names}{note}); drop it, or {_accept_hint(source)}"
            )
        changes.append({"file": source.file, "sealed": None, "now": source.sha256, "at": now()})
    return changes


def _not_run_here(where: str, sealed: PluginSource) -> str:
    """The refusal of a sealed file that the continuation does not run: missing, or there but neither named nor
    imported (then what it holds: the bytes sealed, or others)."""
    head = f"{where} was sealed with plugin {sealed.entry!r} ({sealed.file}, sha256 {sealed.short}), which"
    if not Path(sealed.file).is_file():
        return (
            f"{head} is missing here; restore it, or name where it is now with plugins=[...] (a file of other bytes "
            "is then refused naming its digest, which --accept-plugin accepts)"
        )
    there = file_digest(sealed.file)
    holds = "the bytes sealed" if there == sealed.sha256 else f"sha256 {there[:_SHORTEST]}, not the bytes sealed"
    return (
        f"{head} this continuation neither names nor imports, though the file is there and holds {holds}: name it "
        f"with plugins=[{sealed.entry!r}], or leave plugins out so that the run's own files are imported"
    )


def check_named(where: str, sealed_with: Sequence[PluginSource], named: Sequence[PluginSource]) -> None:
    """Before the files ``named`` are imported: refuse one that stands where the continuation of ``where`` (sealed
    with ``sealed_with``) ran a file, the same path or entry, but holds other bytes, unless its digest is accepted,
    so that a changed file's top level never runs. Files new to the run, and sealed files not named, are left to
    the continuation's own check (:func:`check_sources`), which also sees the modules that registered its methods."""
    pairs = [(s, n) for s in sealed_with for n in named if s.file == n.file or s.entry == n.entry]
    check_sources(where, [s for s, _ in pairs], [n for _, n in pairs])
