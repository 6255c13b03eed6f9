"""The bounds every file of a run directory is read within (:mod:`rayfed.util.bounded`): each refusal says what is
wrong, and what rayfed writes reads back as it was."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayfed.util import bounded
from rayfed.util.bounded import INTEGER, NUMBER, npz_members, npz_parts, parse_json, read_json, read_parquet
from rayfed.util.files import digest_of, save_arrays, write_json


def test_json_rayfed_writes_reads_back(tmp_path: Path) -> None:
    tree = {"a": {"b": [1, 2.5, None, "x"], "c": {"d": True}}}
    write_json(tmp_path / "f.json", tree)
    assert read_json(tmp_path / "f.json") == tree


@pytest.mark.parametrize("depth", [bounded.MAX_JSON_DEPTH + 1, 100_000])
def test_json_nested_deeper_than_the_bound_is_refused(depth: int) -> None:
    with pytest.raises(ValueError, match=f"nests deeper than the {bounded.MAX_JSON_DEPTH} levels"):
        parse_json("[" * depth + "]" * depth)
    assert parse_json("[" * bounded.MAX_JSON_DEPTH + "]" * bounded.MAX_JSON_DEPTH) is not None


def test_json_larger_than_the_bound_or_not_a_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 100)
    (tmp_path / "big.json").write_text(json.dumps(["x" * 200]))
    with pytest.raises(ValueError, match="more than rayfed ever writes there"):
        read_json(tmp_path / "big.json")
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(ValueError, match="not a regular file"):
        read_json(tmp_path / "pipe.json")


def test_parquet_columns_of_another_kind_are_named(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"round": [0, 1], "accuracy": ["0.5", "x"]}), path)
    with pytest.raises(ValueError, match="its column 'accuracy' holds string, not numbers"):
        read_parquet(path, {"round": INTEGER, "*": NUMBER})
    pq.write_table(pa.table({"round": [0.0, None], "accuracy": [0.5, None]}), path)
    with pytest.raises(ValueError, match="its column 'round' holds double with gaps, not whole numbers"):
        read_parquet(path, {"round": INTEGER, "*": NUMBER})
    pq.write_table(pa.table({"accuracy": [0.5]}), path)
    with pytest.raises(ValueError, match="it has no column 'round'"):
        read_parquet(path, {"round": INTEGER})


def test_an_npz_member_that_claims_more_than_it_holds_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.npz"
    save_arrays(path, {"w": np.arange(4, dtype=np.float32)})
    with zipfile.ZipFile(path) as archive:
        raw = archive.read("w.npy")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**11,)})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("w.npy", header.getvalue() + raw[-16:])
    with pytest.raises(ValueError, match=r"its array 'w' claims 100,000,000,000 values of float32 .* but holds 16"):
        npz_members(path)


def test_compressed_or_object_members_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    np.savez_compressed(path, w=np.zeros(1000))
    with pytest.raises(ValueError, match="its array 'w' is compressed"):
        npz_members(path)
    np.savez(path, w=np.array([{"a": 1}], dtype="O"))
    with pytest.raises(ValueError, match="its array 'w' holds Python objects"):
        npz_members(path)


def test_streamed_parts_digest_as_the_arrays_do(tmp_path: Path) -> None:
    arrays = {
        "b": np.arange(6, dtype=np.int64).reshape(2, 3),
        "a": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
        "c": np.float64(3.5),
    }
    path = tmp_path / "s.npz"
    save_arrays(path, arrays)
    expected = digest_of([part for name in sorted(arrays) for part in (name.encode(), np.asarray(arrays[name]))], b"k")
    assert digest_of(npz_parts(path, npz_members(path)), b"k") == expected
