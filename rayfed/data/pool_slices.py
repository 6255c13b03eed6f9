"""Pool slices: millions of clients as windows onto one shuffled pool of samples.

Cross-device federated learning has populations of millions of clients, each holding a
few samples ("Advances and Open Problems in Federated Learning", Foundations and Trends
in Machine Learning 2021, Sec. 1.1, Table 1). A simulation holds one pool of N samples,
and index sets that deal every sample to one client
(:class:`~rayfed.data.partition.Partition`) both cap the population at N and cost a word
per sample. ``data.partition="slices"`` instead gives client i the
s = ``data.samples_per_client`` consecutive positions of one permutation of the pool that
start at

    start_i = (i · stride) mod N,

wrapping around the end of the pool, and splits them in place: the first floor(f · s)
positions train, the other s - floor(f · s) test (f = ``data.train_fraction``, the
rounding of :func:`~rayfed.data.split.split_csr`). As s ≤ N, a client never holds a
sample twice, so its train and test sets are disjoint. The stride is s when the M slices
fit side by side (M · s ≤ N): they tile the pool and no two clients share a sample.
Otherwise it is the smallest integer ≥ s coprime with N, so the first N clients start at
N different positions; clients then overlap in the pool, and client i + N holds what
client i holds.

Reproducible from ``data.seed`` alone: the permutation is
``numpy.random.RandomState(data.seed).permutation(N)``, the first and only draw, and
everything else follows from (N, M, s, floor(f · s), stride). So :meth:`PoolSlices.save`
writes these numbers and the seed, no per-sample array, and a resumed run rebuilds the
same client data sets from the dataset's labels. What is held in memory is the
permutation (N integers) and the two (M, K) class-count tables, as int32, computed from
one prefix sum of per-class counts along the permuted pool; a client's indices are
computed when a worker asks for them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from rayfed.data.partition import ClientPartition, partition_metadata, register_partition_format
from rayfed.data.partitioners import PARTITIONERS
from rayfed.util.errors import DatasetError
from rayfed.util.files import digest_of, write_parquet
from rayfed.util.validation import check

if TYPE_CHECKING:
    from rayfed.data.settings import DataConfig

__all__ = ["PoolSlices", "slice_stride"]

_KIND = "slices"
_PARAMS = ("num_clients", "pool_size", "slice_size", "train_size", "stride", "seed")
"""The columns of the one-row partition file, in the order of :meth:`PoolSlices.build`'s arguments."""


def slice_stride(pool_size: int, num_clients: int, slice_size: int) -> int:
    """The step between consecutive clients' slice starts (see the module docstring).

    >>> slice_stride(100, 10, 10), slice_stride(100, 11, 10), slice_stride(99, 100, 3)
    (10, 11, 4)
    """
    if num_clients * slice_size <= pool_size:
        return slice_size
    stride = slice_size
    while math.gcd(stride, pool_size) != 1:
        stride += 1
    return stride


def _window_counts(prefix: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """Class counts of the windows [start, start + length) of the permuted pool: prefix differences."""
    counts = prefix[starts + length]
    counts -= prefix[starts]
    return counts


@dataclass(frozen=True, eq=False)
class PoolSlices(ClientPartition):
    """Every client's data set as a slice of one permutation of the pool (module docstring).

    Attributes
    ----------
    order
        int64, shape (N,): the permutation of the pool's indices that slices cut.
    slice_size, train_size
        s and floor(f · s), the same for every client.
    stride
        The step between consecutive clients' starts (:func:`slice_stride`).
    seed
        ``data.seed``, from which ``order`` is drawn.
    label_counts, train_label_counts
        (M, K) int32 class counts over each client's slice and over its training part.
    """

    order: np.ndarray
    slice_size: int
    train_size: int
    stride: int
    seed: int
    label_counts: np.ndarray
    train_label_counts: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.order)
        if not 1 <= self.slice_size <= n or not 0 <= self.train_size <= self.slice_size:
            raise DatasetError(
                f"PoolSlices needs 1 <= slice_size <= pool size and 0 <= train_size <= slice_size, but got "
                f"slice_size={self.slice_size}, train_size={self.train_size} for a pool of {n} samples"
            )
        if self.label_counts.ndim != 2 or self.label_counts.shape != self.train_label_counts.shape:
            raise DatasetError("PoolSlices.label_counts and train_label_counts must both have shape (M, K)")
        for array in (self.order, self.label_counts, self.train_label_counts):
            array.setflags(write=False)

    @classmethod
    def build(
        cls,
        labels: np.ndarray,
        num_classes: int,
        num_clients: int,
        pool_size: int,
        slice_size: int,
        train_size: int,
        stride: int,
        seed: int,
    ) -> PoolSlices:
        """The partition these parameters describe, its class counts taken from ``labels`` (length N)."""
        labels = np.asarray(labels, dtype=np.int64)
        if len(labels) != pool_size:
            raise DatasetError(
                f"the slices partition was made for a pool of {pool_size} samples, but the dataset has "
                f"{len(labels)}; it was written for another dataset"
            )
        order = np.random.RandomState(seed).permutation(pool_size).astype(np.int64)
        pooled = labels[order]
        pooled = np.concatenate([pooled, pooled[:slice_size]])  # windows that wrap around the end
        prefix = np.zeros((len(pooled) + 1, num_classes), dtype=np.int32)
        for k in range(num_classes):
            np.cumsum(pooled == k, dtype=np.int32, out=prefix[1:, k])
        starts = np.arange(num_clients, dtype=np.int64) * stride % pool_size
        return cls(
            order=order,
            slice_size=slice_size,
            train_size=train_size,
            stride=stride,
            seed=seed,
            label_counts=_window_counts(prefix, starts, slice_size),
            train_label_counts=_window_counts(prefix, starts, train_size),
        )

    def params(self) -> dict[str, int]:
        """The six numbers that rebuild this partition with :meth:`build`."""
        return {
            "num_clients": self.num_clients,
            "pool_size": len(self.order),
            "slice_size": self.slice_size,
            "train_size": self.train_size,
            "stride": self.stride,
            "seed": self.seed,
        }

    def indices(self, i: int) -> np.ndarray:
        """Dataset indices of client ``i``'s whole slice: its training part, then its test part."""
        start = int(i) * self.stride % len(self.order)
        return np.take(self.order, np.arange(start, start + self.slice_size), mode="wrap")

    def train(self, i: int) -> np.ndarray:
        """Dataset indices of client ``i``'s training split (the first ``train_size`` of its slice)."""
        return self.indices(i)[: self.train_size]

    def test(self, i: int) -> np.ndarray:
        """Dataset indices of client ``i``'s test split (the rest of its slice)."""
        return self.indices(i)[self.train_size :]

    def num_train(self) -> np.ndarray:
        return np.full(self.num_clients, self.train_size, dtype=np.int64)

    def num_test(self) -> np.ndarray:
        return np.full(self.num_clients, self.slice_size - self.train_size, dtype=np.int64)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`params` as a one-row Parquet table, atomically."""
        table = pa.table({name: pa.array([value], pa.int64()) for name, value in self.params().items()})
        meta = partition_metadata(_KIND, self.num_clients, self.num_classes)
        write_parquet(path, table.replace_schema_metadata(meta))

    @classmethod
    def from_table(cls, table: pa.Table, path: Path, labels: np.ndarray, num_classes: int) -> PoolSlices:
        """The partition of a table written by :meth:`save` to ``path``, rebuilt on ``labels``."""
        if table.num_rows != 1 or set(_PARAMS) - set(table.column_names):
            raise DatasetError(f"partition file {str(path)!r} is not a slices partition (one row of {_PARAMS})")
        row = table.to_pylist()[0]
        try:
            return cls.build(labels, num_classes, *(int(row[name]) for name in _PARAMS))
        except DatasetError as error:
            raise DatasetError(f"partition file {str(path)!r}: {error}") from error

    def digest(self) -> str:
        return digest_of([json.dumps(self.params(), sort_keys=True).encode(), self.label_counts])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PoolSlices):
            return NotImplemented
        return self.params() == other.params() and np.array_equal(self.label_counts, other.label_counts)

    def __repr__(self) -> str:
        return "PoolSlices(" + ", ".join(f"{name}={value}" for name, value in self.params().items()) + ")"


@PARTITIONERS.register(_KIND)
def _slices_partitioner(
    labels: np.ndarray, num_classes: int, data: DataConfig, rng: np.random.RandomState
) -> PoolSlices:
    """``data.partition="slices"``: s = ``data.samples_per_client`` (0: N // M) samples per client."""
    del rng  # the pool order is drawn from data.seed itself, so that the saved parameters rebuild it
    n, m = len(labels), data.num_clients
    size = data.samples_per_client or n // m
    check(
        1 <= size <= n,
        "data.samples_per_client",
        data.samples_per_client,
        f"in [1, {n}] (the dataset's samples; 0 gives samples // data.num_clients, here {n // m})",
    )
    train_size = math.floor(data.train_fraction * size)
    return PoolSlices.build(labels, num_classes, m, n, size, train_size, slice_stride(n, m, size), data.seed)


register_partition_format(_KIND, PoolSlices.from_table)
