"""What makes a run the run it is, and the marker that proves a directory holds one.

A run's **identity** is a digest of the config fields that define its results (every field
but :data:`CONTINUABLE`) and of its partition (:meth:`ClientPartition.digest`): two runs with
the same identity train the same models on the same client data. Every checkpoint records
the identity of the run that wrote it, so a checkpoint copied in from another run is refused
on resume (:mod:`rayfed.engine.checkpoint`).

The **run marker** ``<run_dir>/rayfed-run.json`` is the first file a run writes into its
directory. It proves that the directory is a rayfed run (rayfed writes only into an empty
folder or one with a marker: :func:`rayfed.provenance.run_dir.check_run_dir`), is sealed with the
checkpoint key (:mod:`rayfed.provenance.run_seal`) and records::

    {"format": 2, "identity": "<sha256>", "created": "2026-11-26T10:00:00",
     "train_rounds": [{"rounds": 3, "from_round": 0, "at": "..."},
                      {"rounds": 5, "from_round": 3, "at": "...", "change": "extended from 3 to 5"}],
     "rayfed": "0.1.0", "config": {... config.json as the run wrote it ...},
     "plugins": [{"entry": "my_methods", "module": "my_methods", "file": "/home/me/my_methods.py",
                  "sha256": "<sha256 of the file>", "kind": "name"}],
     "accepted": [{"file": "...", "sealed": "<sha256 or null>", "now": "<sha256>", "at": "..."}],
     "traces": [{"field": "system.device_trace", "file": "/home/me/devices.csv", "sha256": "<sha256>"}],
     "key_id": "<the key's id>", "seal": "<HMAC-SHA256 of every other field>"}

``train_rounds`` lists the run's ``train.rounds`` as first set and as every continuation
changed it (extended, or shortened to no fewer rounds than it holds); ``rayfed`` the version that last
wrote the marker; ``plugins`` the files of the run's code outside rayfed (:mod:`rayfed.util.plugin_sources`)
and ``accepted`` each change of them a continuation was told to accept (``--accept-plugin``); ``traces`` the
trace files its system model reads (:mod:`rayfed.provenance.trace_seal`; absent from a marker written before traces
were sealed). A marker of format 1 (before markers were sealed) holds the first three fields and no seal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfed.provenance.run_seal import check_seal, sealed
from rayfed.util.bounded import read_json
from rayfed.util.errors import CheckpointError
from rayfed.util.files import write_json
from rayfed.util.plugin_check import now
from rayfed.util.version import VERSION

if TYPE_CHECKING:
    from rayfed.config import RunConfig
    from rayfed.data import ClientPartition

__all__ = ["CONTINUABLE", "MARKER_FILE", "RunMarker", "run_identity"]

CONTINUABLE = ("train.rounds", "engine.", "run_dir", "plugins")
"""Config paths that may change when a run continues in its directory: they do not change its results."""
MARKER_FILE = "rayfed-run.json"
_MARKER_FORMAT = 2
_UNSEALED_FORMAT = 1


def run_identity(config: RunConfig, partition: ClientPartition) -> str:
    """SHA-256 of ``config`` without its :data:`CONTINUABLE` fields (and without the ``system`` section while it
    models no device), and of ``partition``'s digest."""
    defining = _without(config.to_dict(), CONTINUABLE)
    if not config.system.enabled:  # as before the section existed: runs without a system model keep their identity
        del defining["system"]
    text = json.dumps(defining, sort_keys=True, default=str) + partition.digest()
    return hashlib.sha256(text.encode()).hexdigest()


def _without(tree: Mapping[str, Any], prefixes: tuple[str, ...], path: str = "") -> dict[str, Any]:
    """``tree`` without the leaves whose dotted path starts with one of ``prefixes``."""
    kept: dict[str, Any] = {}
    for key, value in tree.items():
        here = f"{path}{key}"
        if isinstance(value, Mapping):
            kept[key] = _without(value, prefixes, f"{here}.")
        elif not here.startswith(prefixes):
            kept[key] = value
    return kept


@dataclass(frozen=True)
class RunMarker:
    """The content of ``rayfed-run.json`` (module docstring)."""

    identity: str
    created: str = field(default_factory=now)
    train_rounds: tuple[dict[str, Any], ...] = ()
    config: Mapping[str, Any] | None = None
    """The config that defines the run, as its ``config.json`` holds it (None in an unsealed marker)."""
    plugins: tuple[dict[str, str], ...] = ()
    """The run's sources outside rayfed (:meth:`rayfed.util.plugin_sources.PluginSource.record`)."""
    rayfed: str = VERSION
    accepted: tuple[dict[str, Any], ...] = ()
    traces: tuple[dict[str, str], ...] | None = ()
    """The trace files the run reads, with their digests (None: a marker from before traces were sealed)."""
    sealed: bool = True
    """False for a marker written before markers were sealed (format 1)."""

    @classmethod
    def new(cls, identity: str, rounds: int) -> RunMarker:
        return cls(identity, train_rounds=({"rounds": rounds, "from_round": 0, "at": now()},))

    @property
    def rounds(self) -> int | None:
        """The run's ``train.rounds`` as last recorded."""
        return int(self.train_rounds[-1]["rounds"]) if self.train_rounds else None

    def with_rounds(self, rounds: int, from_round: int) -> RunMarker:
        """This marker with ``train.rounds`` changed to ``rounds`` by a continuation starting at ``from_round``."""
        before = self.rounds
        if before is None or before == rounds:
            return self
        change = f"{'extended' if rounds > before else 'shortened'} from {before} to {rounds}"
        entry = {"rounds": rounds, "from_round": from_round, "at": now(), "change": change}
        return replace(self, train_rounds=(*self.train_rounds, entry))

    def recording(
        self,
        config: Mapping[str, Any],
        plugins: Sequence[Mapping[str, str]],
        accepted: Sequence[Mapping[str, Any]],
        traces: Sequence[Mapping[str, str]] = (),
    ) -> RunMarker:
        """This marker as the run now writes it: its config, sources and traces, this rayfed, the changes just
        accepted."""
        return replace(
            self,
            config=dict(config),
            plugins=tuple(dict(record) for record in plugins),
            rayfed=VERSION,
            accepted=(*self.accepted, *(dict(entry) for entry in accepted)),
            traces=tuple(dict(record) for record in traces),
            sealed=True,
        )

    def write(self, run_dir: Path) -> None:
        """Write the marker, sealed (:func:`rayfed.provenance.run_seal.sealed`)."""
        fields = {
            "format": _MARKER_FORMAT,
            "identity": self.identity,
            "created": self.created,
            "train_rounds": list(self.train_rounds),
            "rayfed": self.rayfed,
            "config": self.config,
            "plugins": list(self.plugins),
            "accepted": list(self.accepted),
            "traces": list(self.traces or ()),
        }
        write_json(run_dir / MARKER_FILE, sealed(fields))

    @classmethod
    def read(cls, run_dir: Path) -> RunMarker:
        """The marker of ``run_dir``, its seal checked (:func:`rayfed.provenance.run_seal.check_seal`: CheckpointError
        for another key or a changed marker); CheckpointError naming the file if it is not one rayfed wrote."""
        path = run_dir / MARKER_FILE
        try:
            data = read_json(path)
            if data["format"] not in (_MARKER_FORMAT, _UNSEALED_FORMAT):
                raise ValueError(f"format {data['format']!r}, this rayfed writes {_MARKER_FORMAT}")
            base = (str(data["identity"]), str(data["created"]), tuple(data["train_rounds"]))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CheckpointError(
                f"{str(path)!r} is not a readable run marker ({error}); restore it from a copy, or choose another "
                "run_dir. Nothing in this run directory was changed"
            ) from error
        if data["format"] == _UNSEALED_FORMAT:
            return cls(*base, rayfed="", sealed=False)
        check_seal(data, path)
        return cls(
            *base,
            config=dict(data["config"]),
            plugins=tuple(data["plugins"]),
            rayfed=str(data["rayfed"]),
            accepted=tuple(data["accepted"]),
            traces=tuple(data["traces"]) if "traces" in data else None,
        )
