"""The client partition: which dataset indices each virtual client trains and tests on.

:class:`ClientPartition` is what the engine, the workers and the run directory use of a
partition: each client's training and test indices and its class counts, which cwFedAvg
turns into the class distribution p_i ("Class-Wise Federated Averaging for Efficient
Personalization", ICCV 2025, Sec. 4.1). It has two forms:

* :class:`Partition` holds every client's indices in CSR form (:mod:`rayfed.data.csr`),
  as the registered partitioners that deal each sample to one client build it;
* :class:`~rayfed.data.pool_slices.PoolSlices` computes them from each client's slice of
  one shuffled pool (``data.partition="slices"``), for populations of millions.

:func:`~rayfed.data.partitioners.make_partition` builds one; a run directory keeps it in
two files, written side by side by the engine:

* ``partition.parquet`` (:meth:`ClientPartition.save` / :func:`load_partition`): what
  rebuilds the exact client data sets when a run resumes (for :class:`Partition`, one row
  per (client, split, index));
* ``label_counts.parquet`` (:func:`write_label_counts` / :func:`read_label_counts`): each
  client's class counts and the dataset's input shape, so ``rayfed plot`` draws p_i
  without loading the dataset.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayfed.data.csr import count_labels, group_by_client
from rayfed.util.bounded import read_parquet
from rayfed.util.errors import DatasetError
from rayfed.util.files import digest_of, write_parquet

__all__ = [
    "LABEL_COUNTS_FILE",
    "ClientPartition",
    "Partition",
    "load_partition",
    "partition_metadata",
    "read_label_counts",
    "register_partition_format",
    "write_label_counts",
]

LABEL_COUNTS_FILE = "label_counts.parquet"
"""Name of the label-counts file in a run directory."""

_FORMAT_VERSION = "1"
_META_CLIENTS = b"rayfed.num_clients"
_META_CLASSES = b"rayfed.num_classes"
_META_VERSION = b"rayfed.partition_format"
_META_INPUT_SHAPE = b"rayfed.input_shape"
_META_KIND = b"rayfed.partition_kind"
"""Which :class:`ClientPartition` a partition file holds; files without it hold a :class:`Partition`."""
_ARRAYS = ("train_indices", "train_offsets", "test_indices", "test_offsets", "label_counts", "train_label_counts")


class ClientPartition(abc.ABC):
    """Each client's training and test indices and class counts, however they are stored.

    Subclasses hold ``label_counts`` and ``train_label_counts``, (M, K) integer class
    counts over the client's whole data set and over its training split.
    """

    label_counts: np.ndarray
    train_label_counts: np.ndarray

    @property
    def num_clients(self) -> int:
        """M, the number of clients (some may hold no samples)."""
        return int(self.label_counts.shape[0])

    @property
    def num_classes(self) -> int:
        """K, the number of classes the counts are over."""
        return int(self.label_counts.shape[1])

    @abc.abstractmethod
    def train(self, i: int) -> np.ndarray:
        """Dataset indices of client ``i``'s training split."""

    @abc.abstractmethod
    def test(self, i: int) -> np.ndarray:
        """Dataset indices of client ``i``'s test split."""

    @abc.abstractmethod
    def num_train(self) -> np.ndarray:
        """n_i, the training-set size of every client, shape (M,)."""

    @abc.abstractmethod
    def num_test(self) -> np.ndarray:
        """The test-set size of every client, shape (M,)."""

    @abc.abstractmethod
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write what :func:`load_partition` needs to rebuild this partition, atomically."""

    @abc.abstractmethod
    def digest(self) -> str:
        """A hex digest of what defines this partition: equal partitions (``==``) have equal digests
        (a run's identity includes it: :mod:`rayfed.provenance.run_identity`)."""


PartitionReader = Callable[[pa.Table, Path, np.ndarray, int], ClientPartition]
"""``reader(table, path, labels, num_classes)``: the partition a file's table describes (``path`` for errors)."""

_READERS: dict[str, PartitionReader] = {}


def register_partition_format(kind: str, reader: PartitionReader) -> None:
    """Let :func:`load_partition` read files whose ``rayfed.partition_kind`` metadata is ``kind``."""
    if kind in _READERS:
        raise ValueError(f"partition format {kind!r} is registered twice")
    _READERS[kind] = reader


def partition_metadata(kind: str, num_clients: int, num_classes: int) -> dict[bytes, bytes]:
    """Schema metadata of a partition file of ``kind``; ``"csr"`` stays implicit, as in files before the kinds."""
    meta = {_META_CLIENTS: num_clients, _META_CLASSES: num_classes, _META_VERSION: _FORMAT_VERSION}
    if kind != "csr":
        meta[_META_KIND] = kind
    return {key: str(value).encode() for key, value in meta.items()}


def load_partition(path: str | os.PathLike[str], labels: np.ndarray, num_classes: int) -> ClientPartition:
    """Read a partition written by :meth:`ClientPartition.save`, whichever form it has.

    Parameters
    ----------
    path
        The Parquet file.
    labels
        The dataset's labels; the counts are recomputed from them.
    num_classes
        K.

    Raises
    ------
    DatasetError
        When the file is missing, truncated or corrupted, or does not match the
        dataset (an index out of range, another pool size); the message names the path.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"partition file {str(path)!r} does not exist")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(
            f"partition file {str(path)!r} is truncated or corrupted ({error}); delete it "
            "to partition the dataset again"
        ) from error
    kind = (table.schema.metadata or {}).get(_META_KIND, b"csr").decode()
    if kind not in _READERS:
        raise DatasetError(
            f"partition file {str(path)!r} holds a partition of kind {kind!r}, which this rayfed cannot "
            f"read (known kinds: {', '.join(sorted(_READERS))})"
        )
    return _READERS[kind](table, path, np.asarray(labels), num_classes)


@dataclass(frozen=True, eq=False)
class Partition(ClientPartition):
    """Client index sets in CSR form.

    Client i's training indices (into the dataset) are
    ``train_indices[train_offsets[i]:train_offsets[i + 1]]``, and the same holds for
    test. CSR (two arrays instead of 2M small ones) lets 100,000 clients serialise
    zero-copy through Ray. The arrays are made read-only, as the partition is shared.

    Attributes
    ----------
    train_indices, test_indices
        int64 dataset indices, grouped by client.
    train_offsets, test_offsets
        int64, shape (M + 1,), starting at 0 and non-decreasing.
    label_counts
        (M, K) int64 class counts over the client's whole partition, before the 75/25
        split. The cwFedAvg authors' code (built on PFLlib) computes p_i from this
        histogram; see docs/algorithms.md, cwFedAvg section.
    train_label_counts
        (M, K) int64 class counts over the training split only.
    """

    train_indices: np.ndarray
    train_offsets: np.ndarray
    test_indices: np.ndarray
    test_offsets: np.ndarray
    label_counts: np.ndarray
    train_label_counts: np.ndarray

    def __post_init__(self) -> None:
        for name in ("train_indices", "train_offsets", "test_indices", "test_offsets"):
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.ndim != 1:
                raise DatasetError(f"Partition.{name} must be a 1-D int64 array")
        m = len(self.train_offsets) - 1
        if m < 0 or len(self.test_offsets) != m + 1:
            raise DatasetError(
                f"Partition offsets disagree: {len(self.train_offsets)} train offsets, "
                f"{len(self.test_offsets)} test offsets"
            )
        for split in ("train", "test"):
            offsets, indices = getattr(self, f"{split}_offsets"), getattr(self, f"{split}_indices")
            if offsets[0] != 0 or offsets[-1] != len(indices) or np.any(np.diff(offsets) < 0):
                raise DatasetError(
                    f"Partition.{split}_offsets must start at 0, be non-decreasing and end at "
                    f"len({split}_indices)={len(indices)}"
                )
        for name in ("label_counts", "train_label_counts"):
            counts = getattr(self, name)
            if counts.ndim != 2 or counts.shape[0] != m or counts.shape != self.label_counts.shape:
                raise DatasetError(f"Partition.{name} must have shape (num_clients={m}, K)")
        for name in _ARRAYS:
            getattr(self, name).setflags(write=False)

    @classmethod
    def from_csr(
        cls,
        train_indices: np.ndarray,
        train_offsets: np.ndarray,
        test_indices: np.ndarray,
        test_offsets: np.ndarray,
        labels: np.ndarray,
        num_classes: int,
    ) -> Partition:
        """The partition of these CSR splits, with its label counts computed from ``labels``."""
        train_counts = count_labels(train_indices, train_offsets, labels, num_classes)
        test_counts = count_labels(test_indices, test_offsets, labels, num_classes)
        return cls(
            train_indices=train_indices,
            train_offsets=train_offsets,
            test_indices=test_indices,
            test_offsets=test_offsets,
            label_counts=train_counts + test_counts,
            train_label_counts=train_counts,
        )

    def train(self, i: int) -> np.ndarray:
        """Dataset indices of client ``i``'s training split (a read-only view)."""
        return self.train_indices[self.train_offsets[i] : self.train_offsets[i + 1]]

    def test(self, i: int) -> np.ndarray:
        """Dataset indices of client ``i``'s test split (a read-only view)."""
        return self.test_indices[self.test_offsets[i] : self.test_offsets[i + 1]]

    def num_train(self) -> np.ndarray:
        """n_i, the training-set size of every client, shape (M,)."""
        return np.diff(self.train_offsets)

    def num_test(self) -> np.ndarray:
        """The test-set size of every client, shape (M,)."""
        return np.diff(self.test_offsets)

    def to_table(self) -> pa.Table:
        """Long table with one row per (client, split, index); train rows come first.

        Columns: ``client_id`` (int32), ``split`` (dictionary: "train"/"test"),
        ``index`` (int64). M and K are kept in the schema metadata, because clients
        without samples have no rows.
        """
        m = self.num_clients
        clients = np.arange(m, dtype=np.int32)
        client_id = np.concatenate([np.repeat(clients, self.num_train()), np.repeat(clients, self.num_test())])
        codes = np.concatenate([np.zeros(len(self.train_indices), np.int8), np.ones(len(self.test_indices), np.int8)])
        split = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(["train", "test"]))
        index = pa.array(np.concatenate([self.train_indices, self.test_indices]))
        table = pa.table({"client_id": pa.array(client_id, pa.int32()), "split": split, "index": index})
        return table.replace_schema_metadata(partition_metadata("csr", m, self.num_classes))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_table` as Parquet, atomically (:func:`rayfed.util.files.write_parquet`),
        so a crash never leaves a half-written partition."""
        write_parquet(path, self.to_table())

    @classmethod
    def load(cls, path: str | os.PathLike[str], labels: np.ndarray, num_classes: int) -> Partition:
        """Read a partition written by :meth:`save` and rebuild its label counts (see :func:`load_partition`)."""
        partition = load_partition(path, labels, num_classes)
        if not isinstance(partition, Partition):
            raise DatasetError(f"partition file {str(path)!r} holds a {type(partition).__name__}, not CSR index sets")
        return partition

    @classmethod
    def from_table(cls, table: pa.Table, path: Path, labels: np.ndarray, num_classes: int) -> Partition:
        """The partition of a :meth:`to_table` table read from ``path``, its counts rebuilt from ``labels``."""
        meta = table.schema.metadata or {}
        missing = {"client_id", "split", "index"} - set(table.column_names)
        if missing or _META_CLIENTS not in meta:
            raise DatasetError(
                f"partition file {str(path)!r} is not a rayfed partition (missing columns "
                f"{sorted(missing)} or the {_META_CLIENTS.decode()} metadata)"
            )
        m = int(meta[_META_CLIENTS])
        client_id = table.column("client_id").to_numpy().astype(np.int64)
        index = table.column("index").to_numpy().astype(np.int64, copy=False)
        is_train = pc.equal(table.column("split"), "train").to_numpy()
        if len(client_id) and (client_id.min() < 0 or client_id.max() >= m):
            raise DatasetError(f"partition file {str(path)!r} has client ids outside [0, {m})")
        if len(index) and (index.min() < 0 or index.max() >= len(labels)):
            raise DatasetError(
                f"partition file {str(path)!r} refers to sample {index.max()}, but the dataset "
                f"has {len(labels)} samples; it was written for another dataset"
            )
        train_indices, train_offsets = group_by_client(index[is_train], client_id[is_train], m)
        test_indices, test_offsets = group_by_client(index[~is_train], client_id[~is_train], m)
        return cls.from_csr(train_indices, train_offsets, test_indices, test_offsets, labels, num_classes)

    def digest(self) -> str:
        return digest_of(getattr(self, name) for name in _ARRAYS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        return all(np.array_equal(getattr(self, name), getattr(other, name)) for name in _ARRAYS)

    def __repr__(self) -> str:
        return (
            f"Partition(num_clients={self.num_clients}, num_classes={self.num_classes}, "
            f"train={len(self.train_indices)}, test={len(self.test_indices)})"
        )


def write_label_counts(path: str | os.PathLike[str], partition: ClientPartition, input_shape: Sequence[int]) -> None:
    """Write each client's class counts (whole partition and training split), atomically.

    Columns ``client_id``, ``label_counts`` and ``train_label_counts`` (fixed-size lists of K
    integers, of the partition's dtype); the dataset's input shape rides in the schema
    metadata, so the figures can rebuild the model's parameter layout without loading the
    dataset.
    """
    m, k = partition.label_counts.shape
    table = pa.table(
        {
            "client_id": pa.array(np.arange(m, dtype=np.int32)),
            "label_counts": pa.FixedSizeListArray.from_arrays(pa.array(partition.label_counts.ravel()), k),
            "train_label_counts": pa.FixedSizeListArray.from_arrays(pa.array(partition.train_label_counts.ravel()), k),
        }
    )
    shape = ",".join(str(int(s)) for s in input_shape)
    write_parquet(path, table.replace_schema_metadata({_META_INPUT_SHAPE: shape.encode()}))


def read_label_counts(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """(label_counts, train_label_counts, input_shape) from a file of :func:`write_label_counts`, checked first
    (:func:`rayfed.util.bounded.read_parquet`: bounded, each column of the kind written); ValueError saying what is
    wrong, for the reader to name the file and its fix."""
    table = read_parquet(path)

    def matrix(name: str) -> np.ndarray:
        kind = table.schema.field(name).type if name in table.column_names else None
        if kind is None or not (pa.types.is_fixed_size_list(kind) and pa.types.is_integer(kind.value_type)):
            raise ValueError(f"its column {name!r} holds {kind or 'nothing'}, not a row of whole numbers per client")
        column = table.column(name).combine_chunks()
        if column.null_count or column.flatten().null_count:
            raise ValueError(f"its column {name!r} has gaps")
        return column.flatten().to_numpy().reshape(len(column), -1).astype(np.int64)

    counts, train_counts = matrix("label_counts"), matrix("train_label_counts")
    shape = (table.schema.metadata or {}).get(_META_INPUT_SHAPE, b"")
    dims = shape.split(b",") if shape else []
    if counts.shape != train_counts.shape or not counts.size or not dims or not all(d.isdigit() for d in dims):
        raise ValueError(f"its counts ({counts.shape}, {train_counts.shape}) or input shape {shape!r} do not fit")
    return counts, train_counts, tuple(int(d) for d in dims)


register_partition_format("csr", Partition.from_table)
