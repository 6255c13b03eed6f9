"""Reading the files of a run directory bounded before they are trusted: JSON, Parquet tables and ``.npz`` arrays.

A run directory may come from someone else (README.md, "What a run directory may do"): a file in it may be torn,
of the wrong type, or crafted to claim more than it holds. Each kind of file is read here, once, and what it
claims is checked against what it is before anything is built from it:

* JSON (:func:`read_json`, :func:`parse_json`): at most :data:`MAX_JSON_BYTES`, a regular file, nested at most
  :data:`MAX_JSON_DEPTH` deep (a config is a few levels; 100,000 levels would overflow Python's stack);
* Parquet (:func:`read_parquet`): at most :data:`MAX_TABLE_BYTES` once decompressed, as its footer declares,
  and each column of the kind its reader needs (a number where a number is read, flat where a value is read);
* ``.npz`` (:func:`npz_members`, :func:`npz_parts`): every member stored uncompressed within the file, as
  :func:`rayfed.util.files.save_arrays` writes it, of a dtype that holds no Python object, its ``.npy`` header
  claiming no more values than its bytes hold (numpy allocates what a header claims before reading a byte).

Each raises ValueError saying what is wrong, for its caller to name the file and the fix in one line.
"""

from __future__ import annotations

import json
import math
import os
import stat
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TABLE_BYTES",
    "NUMBER",
    "INTEGER",
    "read_json",
    "parse_json",
    "read_parquet",
    "NpyMember",
    "npz_members",
    "npz_parts",
]

MAX_JSON_BYTES = 16 * 2**20
"""The most bytes a JSON file of a run directory is read from: rayfed's own are a few KiB."""
MAX_JSON_DEPTH = 64
"""The deepest nesting of lists and objects a JSON file of a run directory may hold (a config nests 4 levels)."""
MAX_TABLE_BYTES = 4 * 2**30
"""The most bytes a Parquet file of a run directory may decompress to, as its footer declares."""
NUMBER = "number"
"""A column kind of :func:`read_parquet`: integers or floats (nulls allowed)."""
INTEGER = "integer"
"""A column kind of :func:`read_parquet`: integers, none missing."""
_CHUNK = 1 << 20


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON value in the regular file ``path``, bounded (:func:`parse_json`); OSError if it cannot be read,
    ValueError saying what is wrong with it."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # before opening: opening a pipe would wait for its writer
        raise ValueError("it is not a regular file")
    with open(path, "rb") as handle:
        raw = handle.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise ValueError(f"it holds more than {MAX_JSON_BYTES // 2**20} MiB, more than rayfed ever writes there")
    return parse_json(raw)


def parse_json(raw: bytes | str) -> Any:
    """``raw`` as JSON, refused (ValueError) if it is not, or nests deeper than :data:`MAX_JSON_DEPTH`."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"it nests deeper than the {MAX_JSON_DEPTH} levels rayfed reads") from None
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"it nests deeper than the {MAX_JSON_DEPTH} levels rayfed reads")
        level = [
            child
            for item in level
            if isinstance(item, (dict, list))
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, (dict, list))
        ]
    return value


def read_parquet(
    path: str | os.PathLike[str], kinds: Mapping[str, str] | None = None, *, columns: list[str] | None = None
) -> pa.Table:
    """The table in ``path`` (only ``columns``, if given), bounded by :data:`MAX_TABLE_BYTES`; each column named
    in ``kinds`` must be there and of its kind (:data:`NUMBER`, :data:`INTEGER`), and ``"*"`` gives the kind of
    every column not named. ValueError saying what is wrong (Arrow's own errors included)."""
    try:
        metadata = pq.read_metadata(path)
        claimed = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        if claimed > MAX_TABLE_BYTES:
            raise ValueError(
                f"its footer says it decompresses to {claimed:,} bytes, more than the {MAX_TABLE_BYTES:,} rayfed reads"
            )
        table = pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        first = first.replace(f"Could not open Parquet input source '{path}': ", "")
        raise ValueError(f"it is not a readable Parquet file ({first})") from error
    kinds = kinds or {}
    absent = [name for name in kinds if name != "*" and name not in table.column_names and columns is None]
    if absent:
        raise ValueError(f"it has no column {absent[0]!r}")
    for name in table.column_names:
        kind, held = kinds.get(name, kinds.get("*")), table.schema.field(name).type
        if kind == NUMBER and not _numeric(held):
            raise ValueError(f"its column {name!r} holds {held}, not numbers")
        gaps = table.column(name).null_count
        if kind == INTEGER and (not pa.types.is_integer(held) or gaps):
            raise ValueError(f"its column {name!r} holds {held}{' with gaps' * bool(gaps)}, not whole numbers")
    return table


def _numeric(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind))


@dataclass(frozen=True)
class NpyMember:
    """One array of an ``.npz`` as its ``.npy`` header describes it, checked against the bytes it holds."""

    name: str
    """The array's name (the member's, without ``.npy``)."""
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool


def npz_members(path: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, NpyMember]:
    """The arrays of the ``.npz`` at ``path`` (those in ``names``, if given) by name, each checked as the module
    says before any is read; ValueError naming the array and what is wrong, KeyError for a name it lacks."""
    size = Path(path).stat().st_size
    members: dict[str, NpyMember] = {}
    with zipfile.ZipFile(path) as archive:
        infos = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
        for name in infos if names is None else names:
            info = infos[name]
            if info.compress_type != zipfile.ZIP_STORED or info.header_offset + info.compress_size > size:
                raise ValueError(f"its array {name!r} is compressed or claims more bytes than the file holds")
            with archive.open(info) as stream:
                members[name] = _header(name, stream, info.file_size)
    return members


def _header(name: str, stream: Any, member_bytes: int) -> NpyMember:
    """The ``.npy`` header of the member ``name`` of ``member_bytes`` bytes, read from ``stream``."""
    version = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read(stream)
    if dtype.hasobject:
        raise ValueError(f"its array {name!r} holds Python objects, which rayfed never unpickles")
    claimed = math.prod(shape) * dtype.itemsize
    held = member_bytes - stream.tell()
    if claimed > held:
        raise ValueError(
            f"its array {name!r} claims {math.prod(shape):,} values of {dtype} ({claimed:,} bytes), but holds "
            f"{max(held, 0):,} bytes"
        )
    return NpyMember(name, dtype, tuple(shape), bool(fortran_order))


def npz_parts(path: str | os.PathLike[str], members: Mapping[str, NpyMember]) -> Iterator[bytes]:
    """For each of ``members`` of the ``.npz`` at ``path`` (checked by :func:`npz_members`), in sorted order: its
    name, its dtype and shape, then its values in C order, streamed as
    :func:`rayfed.util.files.digest_of` digests an array (no array is built whole, but a Fortran-ordered one)."""
    with zipfile.ZipFile(path) as archive:
        for name in sorted(members):
            member = members[name]
            yield name.encode()
            yield f"{member.dtype.str}{member.shape}".encode()
            with archive.open(f"{name}.npy") as stream:
                if member.fortran_order and len(member.shape) > 1:  # its bytes are not in C order: read whole
                    yield np.ascontiguousarray(np.lib.format.read_array(stream, allow_pickle=False)).tobytes()
                    continue
                _header(name, stream, archive.getinfo(f"{name}.npy").file_size)
                left = math.prod(member.shape) * member.dtype.itemsize
                while left:
                    chunk = stream.read(min(left, _CHUNK))
                    if not chunk:
                        raise ValueError(f"its array {name!r} is cut short")
                    left -= len(chunk)
                    yield chunk
