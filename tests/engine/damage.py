"""Ways to damage the files of a finished run directory, as a careless copy or a crafted one would
(tests/engine/test_damaged_run_dirs.py): deep nesting, a column of the wrong type, an array header that claims
more than its file holds, a cut, random bytes."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["nest_json", "column_of_strings", "claim_values", "cut", "overwrite", "change_array_bytes"]


def nest_json(path: Path, depth: int) -> None:
    """Replace ``path`` with a JSON object nested ``depth`` deep."""
    path.write_text('{"a":' * depth + "1" + "}" * depth)


def column_of_strings(path: Path, column: str) -> None:
    """Rewrite the Parquet table ``path`` with ``column`` holding its values as text."""
    table = pq.read_table(path)
    values = pa.array([str(value) for value in table.column(column).to_pylist()])
    pq.write_table(table.set_column(table.column_names.index(column), column, values), path)


def claim_values(path: Path, member: str, count: int) -> None:
    """Rewrite the ``.npz`` ``path`` with its array ``member``'s ``.npy`` header claiming ``count`` float32 values
    (its bytes kept)."""
    members = _members(path)
    raw = io.BytesIO(members[f"{member}.npy"])
    version = np.lib.format.read_magic(raw)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    read(raw)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (count,)})
    members[f"{member}.npy"] = header.getvalue() + raw.read()
    _write(path, members)


def change_array_bytes(path: Path, member: str) -> None:
    """Flip the last byte of the array ``member`` of the ``.npz`` ``path`` (its header and size kept)."""
    members = _members(path)
    data = bytearray(members[f"{member}.npy"])
    data[-1] ^= 0xFF
    members[f"{member}.npy"] = bytes(data)
    _write(path, members)


def cut(path: Path, fraction: float) -> None:
    """Keep the first ``fraction`` of ``path``'s bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def overwrite(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _write(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def written_run(run_dir: Path) -> Path:
    """A finished one-round run directory as the engine leaves it, written with rayfed's own writers instead of a
    run (seconds less): ``config.json``, ``rounds.parquet``, ``summary.json``, ``label_counts.parquet`` and a
    checkpoint of the server's state, for the readers that draw and load a run."""
    from types import SimpleNamespace

    from rayfed.config import RunConfig
    from rayfed.data import LABEL_COUNTS_FILE, write_label_counts
    from rayfed.engine.checkpoint import save_checkpoint
    from rayfed.util.files import write_json, write_parquet
    from tests.conftest import tiny_overrides

    config = RunConfig().override(tiny_overrides(run_dir, **{"train.rounds": 1, "engine.checkpoint_every": 1}))
    write_json(run_dir / "config.json", config.to_dict())
    rows = [{"round": 0, "accuracy": 0.25, "global_accuracy": 0.2, "train_loss": 2.1, "num_sampled": 10}]
    write_parquet(run_dir / "rounds.parquet", pa.Table.from_pylist(rows))
    write_json(run_dir / "summary.json", {"best_accuracy": 0.25, "final_accuracy": 0.25, "rounds_run": 1})
    counts = np.full((10, 10), 12, dtype=np.int64)
    write_label_counts(
        run_dir / LABEL_COUNTS_FILE, SimpleNamespace(label_counts=counts, train_label_counts=counts), (1, 28, 28)
    )  # type: ignore[arg-type]
    save_checkpoint(run_dir, 0, {"global": np.zeros(64, np.float32)}, [], "0" * 64)
    return run_dir
