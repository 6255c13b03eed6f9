"""W&B's offline run files in a run directory, read back through :mod:`rayfed.tracking.wandb_log`, as
``wandb sync`` would upload them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def history(run_dir: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """(run id, step, {key: value}) of every history row in ``run_dir/wandb``'s offline runs, oldest first."""
    from rayfed.tracking.wandb_log import TransactionLog, history_rows

    return [
        (path.stem.removeprefix("run-"), step, items)
        for path in _files(run_dir)
        for step, items in history_rows(TransactionLog(path).read())
    ]


def config(run_dir: Path) -> dict[str, Any]:
    """The run's config as its offline runs recorded it (later updates win; the run record's first)."""
    from rayfed.tracking.wandb_log import TransactionLog

    found: dict[str, Any] = {}
    for path in _files(run_dir):
        for record in TransactionLog(path).read():
            kind = record.WhichOneof("record_type")
            updates = record.config.update if kind == "config" else record.run.config.update if kind == "run" else ()
            found.update({item.key: json.loads(item.value_json) for item in updates if item.key != "_wandb"})
    return found


def summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary as its offline runs recorded it (later updates win)."""
    from rayfed.tracking.wandb_log import TransactionLog

    found: dict[str, Any] = {}
    for path in _files(run_dir):
        for record in TransactionLog(path).read():
            if record.WhichOneof("record_type") == "summary":
                found.update({item.key: json.loads(item.value_json) for item in record.summary.update if item.key})
    return found
