"""Read a W&B offline run file (``run-<id>.wandb``) back, as ``wandb sync`` would, for the tests.

wandb 0.31 ships no Python reader of its transaction log (its Go core reads it), but its records are the
library's own protobuf messages (``wandb.proto.wandb_internal_pb2.Record``) in LevelDB's log framing: a 7-byte
file header (``:W&B``, magic, version), then 32 KiB blocks of chunks, each a 7-byte header (CRC-32C, length,
type: 1 whole record, 2 first, 3 middle, 4 last piece) and its bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = 7


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2  # here: collecting this folder must not need wandb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, pending = _HEADER, b""
    while position + _HEADER <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            position += left
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        if kind == 0:
            break
        pending += data[position + _HEADER : position + _HEADER + length]
        position += _HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(run_dir: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """(run id, step, {key: value}) of every history row in ``run_dir/wandb``'s offline runs, oldest first."""
    rows = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        run_id = path.stem.removeprefix("run-")
        for record in records(path):
            if record.WhichOneof("record_type") == "history":
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                rows.append((run_id, int(items.pop("_step")), items))
    return rows


def config(run_dir: Path) -> dict[str, Any]:
    """The run's config as its offline runs recorded it (later updates win)."""
    found: dict[str, Any] = {}
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in records(path):
            if record.WhichOneof("record_type") == "config":
                found.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return found
