"""The seal on a run marker: only the holder of the checkpoint key writes a marker a continuation accepts.

A run marker (:mod:`rayfed.provenance.run_identity`) records what the run is: its identity, the config that defines it
(``config.json`` as the run wrote it), rayfed's version and the digest of every file of its code outside rayfed
(:mod:`rayfed.provenance.plugin_seal`). It is sealed as checkpoints are (:mod:`rayfed.engine.checkpoint`): an
HMAC-SHA256 of its fields under the key of :mod:`rayfed.provenance.checkpoint_key`, which lives outside every run
directory. So someone who can write a run directory but cannot read the key can change what the directory says
(an edited ``config.json``, a ``plugins`` entry, a forged marker), and a continuation refuses it, before anything
runs; reading a run (figures, reports) never runs its code at all, and needs no key.

A marker sealed with another key (a colleague's run, copied here) is readable but not resumable without that key,
as its checkpoints are. A marker from before markers were sealed (format 1) is accepted for a run with no code
outside rayfed, and sealed from then on; one whose config names plugins is refused until each is accepted by digest.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rayfed.config import read_saved_config
from rayfed.config.retired import without_retired
from rayfed.provenance.checkpoint_key import KEY_FILE_VARIABLE, checkpoint_key, key_id, key_path
from rayfed.util.config_tree import tree_differences
from rayfed.util.errors import CheckpointError, CheckpointKeyError
from rayfed.util.files import digest_of

__all__ = ["SEAL_FIELDS", "sealed", "check_seal", "check_config_file"]

SEAL_FIELDS = ("key_id", "seal")
"""The marker's fields that the seal adds (every other field is sealed)."""
_LABEL = b"rayfed run marker\0"


def _mac(fields: Mapping[str, Any], key: bytes) -> str:
    body = {name: value for name, value in fields.items() if name not in SEAL_FIELDS}
    return digest_of([_LABEL, json.dumps(body, sort_keys=True, default=str).encode()], key)


def sealed(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` with the seal: this machine's key id and the HMAC of every field (the key is made if missing)."""
    key = checkpoint_key(create=True)
    assert key is not None
    return {**fields, "key_id": key_id(key), "seal": _mac(fields, key)}


def check_seal(fields: Mapping[str, Any], path: Path) -> None:
    """CheckpointError, naming the marker ``path`` and the fix, unless ``fields`` carry a seal made with this
    machine's key over these very fields."""
    key = checkpoint_key(create=False)
    recorded = str(fields.get("key_id"))
    run_dir = str(path.parent)
    if key is None or key_id(key) != recorded:
        here = f"this machine's key {str(key_path())!r} is {key_id(key)}" if key else f"{str(key_path())!r} holds none"
        raise CheckpointKeyError(
            f"run_dir={run_dir!r} was sealed with the checkpoint key {recorded}, but {here}: it can be read (rayfed "
            f"plot) but not continued here; copy the key file of the machine that wrote it to {str(key_path())!r}, "
            f"or point {KEY_FILE_VARIABLE} at it. Nothing in this run directory was changed"
        )
    if not hmac.compare_digest(str(fields.get("seal")), _mac(fields, key)):
        raise CheckpointError(
            f"run_dir={run_dir!r}: its {path.name} does not match its seal: the marker was changed after its run "
            f"sealed it (by someone without the key, or damaged); restore {path.name} from a copy, or choose another "
            "run_dir. Nothing in this run directory was changed"
        )


def check_config_file(run_dir: Path, config: Mapping[str, Any]) -> None:
    """CheckpointError, naming the first field that differs, unless ``run_dir``'s ``config.json`` is ``config``
    (the sealed config; keys since retired aside, which change no numbers)."""
    changed = tree_differences(config, without_retired(read_saved_config(run_dir / "config.json")))
    if changed:
        field, values = changed[0].split(": ", 1)
        sealed_value, file_value = values.split(" -> ", 1)
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise CheckpointError(
            f"run_dir={str(run_dir)!r}: its config.json was edited after its run sealed it: {field} is {file_value} "
            f"in the file, {sealed_value} in the sealed config{more}; restore config.json from a copy (a resume "
            "changes train.rounds, engine.* and plugins as field.path=value overrides), or start a new run in "
            "another run_dir. Nothing in this run directory was changed"
        )
