"""``<run_dir>/tracking.json``: what each tracker's logged run is and what it confirmed holding.

::

    {"mlflow": {"ids": {"run_id": "3f2a...", "tracking_uri": "sqlite:///..."}, "step": 7, "config": true},
     "wandb": {"ids": {"run_id": "1a2b3c4d"}, "step": 7, "config": true},
     "tensorboard": {"ids": {}, "step": 6, "config": true}}

A step is recorded only once the tool confirmed holding it (:meth:`~rayfed.tracking.tracker.Tracker.confirm`),
and a resume catches each entry up with the tool's own records (a kill may fall after the tool confirmed a step
and before this file recorded it), so a run killed at any moment resumes by sending each tracker the rounds after
the step it holds; the ids are recorded as soon as the logged run exists, before anything is sent to it. A file
that cannot be read is refused in one line with its fix (:func:`read_state`); a missing one is rebuilt from the
trackers' own records (:meth:`~rayfed.tracking.tracker.Tracker.recorded`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayfed.util.bounded import read_json
from rayfed.util.errors import ConfigError
from rayfed.util.files import write_json

__all__ = ["STATE_FILE", "Logged", "read_state", "write_state"]

STATE_FILE = "tracking.json"


@dataclass(frozen=True)
class Logged:
    """One tracker's logged run of a rayfed run, as far as the tool confirmed holding it."""

    ids: Mapping[str, str] = field(default_factory=dict)
    """What reopens the logged run (its run id, its store)."""
    step: int = -1
    """The last step the tool confirmed holding (-1: none)."""
    config: bool = False
    """Whether the tool confirmed holding the run's config."""

    def to_json(self) -> dict[str, Any]:
        return {"ids": dict(self.ids), "step": self.step, "config": self.config}


def read_state(run_dir: Path) -> dict[str, Logged] | None:
    """The trackers' entries of ``run_dir``'s :data:`STATE_FILE`, or None when it has none; ConfigError naming
    the file, what is wrong and the fix when it cannot be read."""
    path = run_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        data = read_json(path)
        if not isinstance(data, dict):
            raise ValueError(f"it holds a JSON {type(data).__name__}, not an object of trackers")
        return {str(name): _entry(name, entry) for name, entry in data.items()}
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            f"{str(path)!r} cannot be read ({error}); delete it, and the resume reads what each tracker holds from "
            "the tracker's own files (or restore it from a copy)"
        ) from None


def _entry(name: str, entry: Any) -> Logged:
    if not isinstance(entry, dict):
        raise ValueError(f"{name!r} is {entry!r}, not an object")
    earlier = {key: value for key, value in entry.items() if key not in ("step", "config")}  # before "ids" was
    step, config, ids = entry.get("step", -1), entry.get("config", True), entry.get("ids", earlier)
    if isinstance(step, bool) or not isinstance(step, int) or step < -1:
        raise ValueError(f"{name!r} has step {step!r}, not a whole number >= -1")
    if not isinstance(config, bool):
        raise ValueError(f"{name!r} has config {config!r}, not true or false")
    if not isinstance(ids, dict) or not all(isinstance(v, str) for v in ids.values()):
        raise ValueError(f"{name!r} has ids {ids!r}, not an object of strings")
    return Logged(ids, step, config)


def write_state(run_dir: Path, state: Mapping[str, Logged]) -> None:
    """Record ``state`` (atomically: a kill leaves the previous file or this one)."""
    write_json(run_dir / STATE_FILE, {name: logged.to_json() for name, logged in state.items()})
