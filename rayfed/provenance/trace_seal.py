"""The bytes of a run's trace files, sealed with it: a resumed run reads the traces its run read, or says so.

A run whose system model reads trace files (``system.device_trace``, ``system.availability_trace``:
docs/system.md) records each one's SHA-256 in its run marker, which the run's seal covers
(:mod:`rayfed.provenance.run_seal`). A continuation compares the files its config names with those digests before
anything runs, and refuses, in one line naming the field, the file and both digests, a trace whose bytes changed
(an edited device table would mix two clocks in one run, where docs/system.md promises the uninterrupted run's
numbers). A change is accepted as a plugin's is, by its new digest (``--accept-plugin DIGEST``; in Python,
:func:`rayfed.accept_plugins`), and recorded in the marker's ``accepted``. A marker written before traces were
sealed records none, and is sealed with the traces of its next continuation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rayfed.config import RunConfig
from rayfed.util.errors import PluginError
from rayfed.util.plugin_check import accept_hint, is_accepted, now
from rayfed.util.plugin_sources import file_digest

__all__ = ["TRACE_FIELDS", "trace_records", "check_traces"]

TRACE_FIELDS = ("device_trace", "availability_trace")
"""The ``system`` fields that name a trace file."""


def trace_records(config: RunConfig) -> list[dict[str, str]]:
    """The trace files ``config``'s system model reads, each as ``{"field", "file", "sha256"}`` (a file that cannot
    be read is left out: reading it refuses the run, naming the field)."""
    records = []
    for name in TRACE_FIELDS:
        path = getattr(config.system, name)
        if path is None or not Path(path).is_file():
            continue
        records.append({"field": f"system.{name}", "file": str(Path(path).resolve()), "sha256": file_digest(path)})
    return records


def check_traces(
    where: str, sealed: Sequence[Mapping[str, Any]] | None, current: Sequence[Mapping[str, str]]
) -> list[dict[str, Any]]:
    """Refuse ``current`` (the traces a continuation of ``where`` reads) unless each field's trace holds the bytes
    ``sealed`` records for it, or its new digest is accepted; returns the accepted changes, which the marker
    records. ``sealed`` None: a marker from before traces were sealed, which any trace continues."""
    if sealed is None:
        return []
    recorded = {str(record["field"]): record for record in sealed}
    changes: list[dict[str, Any]] = []
    for trace in current:
        before = recorded.get(trace["field"])
        if before is not None and before["sha256"] == trace["sha256"]:
            continue
        short = trace["sha256"][:16]
        if is_accepted(trace["sha256"]):
            sealed_digest = None if before is None else before["sha256"]
            changes.append({"file": trace["file"], "sealed": sealed_digest, "now": trace["sha256"], "at": now()})
            continue
        was = (
            f"was sealed with {trace['field']}={before['file']!r} of sha256 {str(before['sha256'])[:16]}, and "
            f"{trace['file']!r} holds sha256 {short}"
            if before is not None
            else f"was sealed without {trace['field']}, which now names {trace['file']!r} of sha256 {short}"
        )
        raise PluginError(
            f"{where} {was}: not the trace its run read, so a resume would mix two clocks; restore that file, or "
            f"{accept_hint(short)}"
        )
    return changes
