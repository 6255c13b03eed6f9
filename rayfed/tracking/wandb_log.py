"""W&B's transaction log (``run-<id>.wandb``) read back: what W&B's service has written of a run.

``wandb.log`` returns before W&B's service (a process of its own) writes the row, so a run that records a
step as sent when ``wandb.log`` returns loses it if the driver is killed; the rows the service wrote to this
log are those ``wandb sync`` uploads, and so the proof that W&B holds a step (:class:`TransactionLog`).

wandb ships no Python reader of the log (its Go core reads it), but its records are the library's own protobuf
messages (``wandb.proto.wandb_internal_pb2.Record``) in LevelDB's log framing: a 7-byte file header (``:W&B``,
magic, version), then 32 KiB blocks of chunks, each a 7-byte header (CRC-32C, length, type: 1 a whole record,
2 its first, 3 a middle, 4 its last piece) and its bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TransactionLog", "LoggedRun", "logged_runs", "history_rows", "carries_config"]

_BLOCK = 32768
_HEADER = 7
_WHOLE, _LAST = 1, 4


class TransactionLog:
    """One run file, read incrementally: :meth:`read` parses the records written since the last call (a chunk
    the service has not finished writing is read on a later call)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._position = _HEADER
        self._pending = b""

    def read(self) -> Iterator[Any]:
        """The records written since the last call, oldest first (read from where the last call stopped)."""
        from wandb.proto import wandb_internal_pb2

        try:
            with self.path.open("rb") as file:
                if file.read(4) not in (b":W&B", b""):
                    raise ValueError(f"{self.path} is not a W&B run file")
                file.seek(self._position)
                data = file.read()
        except FileNotFoundError:
            return
        start, offset = self._position, 0  # data[offset] is the file's byte start + offset
        while offset + _HEADER <= len(data):
            left = _BLOCK - (start + offset) % _BLOCK
            if left < _HEADER:  # a block's tail too short for a header is padding
                offset += left
                continue
            length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
            end = offset + _HEADER + length
            if kind == 0 or end > len(data):  # zeros past the end written so far, or a chunk being written
                break
            self._pending += data[offset + _HEADER : end]
            offset = end
            self._position = start + end
            if kind in (_WHOLE, _LAST):
                record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
                record.ParseFromString(self._pending)
                self._pending = b""
                yield record


def history_rows(records: Iterator[Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, {key: value}) of each history record among ``records``."""
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            yield int(items.pop("_step")), items


def carries_config(record: Any) -> bool:
    """Whether ``record`` (a run's first record, or a config update) sets any of the run's own config."""
    kind = record.WhichOneof("record_type")
    updates = record.config.update if kind == "config" else record.run.config.update if kind == "run" else ()
    return any(item.key != "_wandb" for item in updates)


@dataclass
class LoggedRun:
    """What the transaction logs of one W&B run id in a folder hold."""

    run_id: str
    files: list[Path] = field(default_factory=list)
    last_step: int = -1
    """The last history step written (-1: none)."""
    has_config: bool = False
    """Whether a run or config record carries the run's config."""


def logged_runs(folder: Path) -> dict[str, LoggedRun]:
    """Every W&B run whose transaction logs lie in ``folder`` (``wandb/``: ``offline-run-*`` and ``run-*``
    folders, one per process that logged it), by run id."""
    found: dict[str, LoggedRun] = {}
    for path in sorted(folder.glob("*run-*/run-*.wandb")):
        run_id = path.stem.removeprefix("run-")
        logged = found.setdefault(run_id, LoggedRun(run_id))
        logged.files.append(path)
        records = list(TransactionLog(path).read())
        logged.last_step = max([logged.last_step, *(step for step, _ in history_rows(iter(records)))])
        logged.has_config = logged.has_config or any(carries_config(record) for record in records)
    return found
