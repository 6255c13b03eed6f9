"""Held-out server data: samples no client owns, carved out of the pool before it is partitioned.

Some methods need data outside every client's: FedLAW learns its aggregation weights on a
class-balanced *proxy* set that only the server sees (Li et al., ICML 2023, arXiv:2302.10911;
200 images on CIFAR-10 in the FedAWA paper's runs, Sec. 5.2), and KT-pFL mixes the clients'
soft predictions on a *public* set that the server and every client see (Zhang et al.,
NeurIPS 2021, arXiv:2111.02862; about 3,000 images in the FedClassAvg paper, Table 5).

The contract (docs/algorithms.md, "Held-out server data" section):

1. a server half declares what it needs (``HeldOutData``, ``rayfed.algorithms.declarations``) with
   the classmethod ``held_out(params, spec)``, returning a :class:`HeldOutRequest` (size,
   class-balanced or not, shared with the clients or not); one that declares none has no
   held-out data;
2. the engine draws the indices once with :func:`choose_held_out`, from ``data.seed`` on a
   stream of its own, writes them to ``held_out.parquet`` in the run directory (read back
   when the run resumes), and partitions only the rest of the pool
   (:func:`partition_without`), so no client trains or tests on a held-out sample;
3. a request may name another dataset (``HeldOutRequest.dataset``, KT-pFL's public set from a
   dataset the clients do not own, as the FedClassAvg paper's runs of KT-pFL take MNIST for
   Fashion-MNIST and EMNIST and six CIFAR-100 classes for CIFAR-10): it is loaded from
   ``data.root`` with its default options, drawn from (restricted to ``classes``, when given),
   and the whole pool is partitioned; ``held_out.parquet`` then names that dataset;
4. the :class:`HeldOutSet` (indices, uint8 images, labels) rides in the
   :class:`~rayfed.train.problem.ProblemSpec` (``spec.held_out``): the server half reads it there,
   and the workers' copy of the spec keeps it only when the request says ``shared``
   (:meth:`~rayfed.train.problem.ProblemSpec.for_clients`), so a server-only proxy set never
   reaches a client. A worker receives the spec once, when it starts, not every round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayfed.data.partition import ClientPartition, Partition
from rayfed.data.partitioners import make_partition
from rayfed.util.errors import ConfigError, DatasetError
from rayfed.util.files import write_parquet
from rayfed.util.validation import check_int

if TYPE_CHECKING:
    from rayfed.data.dataset import ArrayDataset
    from rayfed.data.settings import DataConfig

__all__ = [
    "HELD_OUT_FILE",
    "HeldOutRequest",
    "HeldOutSet",
    "choose_held_out",
    "choose_from_source",
    "load_held_out",
    "partition_without",
    "save_held_out",
]

HELD_OUT_FILE = "held_out.parquet"
"""Name of the file in a run directory that lists the held-out sample indices."""

HELD_OUT_STREAM = 0x4E1D0
"""The held-out draw uses ``numpy.random.default_rng([data.seed, HELD_OUT_STREAM])``: a stream
of its own, so the partition's ``RandomState(data.seed)`` draws are those of a run without one."""


@dataclass(frozen=True)
class HeldOutRequest:
    """What held-out data a server half needs, declared by its ``held_out`` classmethod.

    ``size`` samples of the pool; ``balanced``: size // K per class (the remainder spread
    over randomly drawn classes), else a uniform draw; ``shared``: the clients see it too
    (KT-pFL's public set), else only the server (FedLAW's proxy set); ``field``: the
    config field that set ``size``, named in errors. ``dataset`` ("" = the pool) names another
    registered dataset to draw from instead, ``classes`` the labels of it to draw from (empty:
    all), and ``source_field`` the config field that chose them, named in errors.
    """

    size: int
    balanced: bool = True
    shared: bool = False
    field: str = "algorithm.params"
    dataset: str = ""
    classes: tuple[int, ...] = ()
    source_field: str = "algorithm.params"

    def __post_init__(self) -> None:
        check_int(self.field, self.size, low=1)
        if self.classes and not self.dataset:
            raise ConfigError(f"{self.source_field}: classes {list(self.classes)} need a dataset to draw from")


@dataclass(frozen=True, eq=False)
class HeldOutSet:
    """The held-out samples: their pool indices (sorted), model inputs as the dataset stores them
    (uint8 images or token ids, :attr:`ArrayDataset.inputs`) and int64 labels."""

    indices: np.ndarray
    inputs: np.ndarray
    labels: np.ndarray
    shared: bool = False
    """Whether the clients see it (see :class:`HeldOutRequest`)."""
    source: str = ""
    """The dataset the indices refer to: "" for the pool, else the name of another dataset."""

    @classmethod
    def of(cls, dataset: ArrayDataset, indices: np.ndarray, *, shared: bool = False, source: str = "") -> HeldOutSet:
        """The samples of ``dataset`` at ``indices`` (copied, so the set travels without the pool)."""
        indices = np.asarray(indices, dtype=np.int64)
        inputs, labels = np.ascontiguousarray(dataset.inputs[indices]), dataset.labels[indices].copy()
        return cls(indices, inputs, labels, shared, source)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        return f"HeldOutSet(n={len(self)}, shared={self.shared})"


def choose_held_out(labels: np.ndarray, num_classes: int, request: HeldOutRequest, seed: int) -> np.ndarray:
    """The sorted pool indices of the held-out set: a pure function of (labels, request, seed).

    Class-balanced: ``size // K`` samples of every class, plus one more of ``size % K``
    classes drawn at random; each class's samples drawn without replacement. Otherwise
    ``size`` samples drawn uniformly without replacement.

    Raises
    ------
    ConfigError
        When the pool cannot give ``size`` samples (or a class has too few for a balanced set);
        the message names ``request.field``.

    >>> labels = np.repeat(np.arange(4), 10)
    >>> chosen = choose_held_out(labels, 4, HeldOutRequest(8), seed=1)
    >>> np.bincount(labels[chosen], minlength=4).tolist()
    [2, 2, 2, 2]
    """
    labels = np.asarray(labels)
    if request.size >= len(labels):
        raise ConfigError(
            f"{request.field}={request.size} held-out samples leave nothing to partition: the pool has "
            f"{len(labels)} samples; use fewer"
        )
    return _draw(labels, num_classes, request, seed)


def choose_from_source(labels: np.ndarray, num_classes: int, request: HeldOutRequest, seed: int) -> np.ndarray:
    """The sorted indices into another dataset (``request.dataset``) of the held-out set: drawn as
    :func:`choose_held_out` draws, among the samples whose label is in ``request.classes`` (all when
    empty), balanced over those classes. Nothing is left to partition there, so all may be taken.

    >>> labels = np.repeat(np.arange(5), 4)
    >>> chosen = choose_from_source(labels, 5, HeldOutRequest(4, dataset="d", classes=(1, 3)), seed=0)
    >>> sorted(set(labels[chosen].tolist()))
    [1, 3]
    """
    labels = np.asarray(labels)
    classes = np.array(sorted(set(request.classes)) if request.classes else range(num_classes), dtype=np.int64)
    outside = classes[(classes < 0) | (classes >= num_classes)]
    if len(outside):
        raise ConfigError(
            f"{request.source_field}: {request.dataset!r} has classes 0..{num_classes - 1}, but classes "
            f"{outside.tolist()} were asked for; choose among those"
        )
    candidates = np.flatnonzero(np.isin(labels, classes))
    if request.size > len(candidates):
        raise ConfigError(
            f"{request.field}={request.size} samples asked of {request.dataset!r}, which has {len(candidates)} "
            "of the chosen classes; use fewer"
        )
    relabelled = np.searchsorted(classes, labels[candidates])
    return np.sort(candidates[_draw(relabelled, len(classes), request, seed)])


def _draw(labels: np.ndarray, num_classes: int, request: HeldOutRequest, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, HELD_OUT_STREAM])
    if not request.balanced:
        return np.sort(rng.choice(len(labels), size=request.size, replace=False)).astype(np.int64)
    per_class = np.full(num_classes, request.size // num_classes, dtype=np.int64)
    per_class[rng.choice(num_classes, size=request.size % num_classes, replace=False)] += 1
    chosen = []
    for k in range(num_classes):
        members = np.flatnonzero(labels == k)
        if per_class[k] > len(members):
            raise ConfigError(
                f"{request.field}={request.size} asks a class-balanced set of {per_class[k]} samples of class {k}, "
                f"but there are {len(members)}; use a smaller size"
            )
        chosen.append(rng.choice(members, size=int(per_class[k]), replace=False))
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def partition_without(labels: np.ndarray, num_classes: int, data: DataConfig, held_out: np.ndarray) -> ClientPartition:
    """The partition of the pool minus ``held_out``, with indices into the whole pool.

    The partitioner and the train/test split run, unchanged, on the kept samples (in pool
    order), and their indices are mapped back: no client trains or tests on a held-out
    sample, and ``partition.parquet`` stays a partition of the pool. Pool slices
    (``data.partition="slices"``) compute indices on the fly and are refused.
    """
    if data.partition == "slices":
        raise ConfigError(
            "data.partition='slices' cannot leave out held-out server data (the algorithm's proxy/public set); "
            "use a partition that deals samples to clients, e.g. data.partition='dirichlet'"
        )
    keep = np.setdiff1d(np.arange(len(labels), dtype=np.int64), held_out, assume_unique=True)
    inner = make_partition(np.asarray(labels)[keep], num_classes, data)
    assert isinstance(inner, Partition)  # every partitioner but "slices" deals index sets
    return Partition.from_csr(
        keep[inner.train_indices],
        np.array(inner.train_offsets),
        keep[inner.test_indices],
        np.array(inner.test_offsets),
        np.asarray(labels, dtype=np.int64),
        num_classes,
    )


def save_held_out(path: str | os.PathLike[str], held_out: HeldOutSet) -> None:
    """Write the held-out indices (an ``index`` column) and the dataset they refer to (a ``dataset``
    column: "" for the pool), atomically."""
    n = len(held_out)
    write_parquet(
        path,
        pa.table(
            {
                "index": pa.array(np.asarray(held_out.indices, dtype=np.int64)),
                "dataset": pa.array([held_out.source] * n, pa.string()),
            }
        ),
    )


def load_held_out(path: str | os.PathLike[str], pool_size: int, source: str = "") -> np.ndarray:
    """Read indices written by :func:`save_held_out`, checked against the dataset they must refer to
    (``source``: "" for the pool) and its size."""
    path = Path(path)
    try:
        table = pq.read_table(path)
        indices = table.column("index").to_numpy().astype(np.int64)
        written = set(table.column("dataset").to_pylist()) if "dataset" in table.column_names else {""}
    except (OSError, KeyError, pa.ArrowException) as error:
        raise DatasetError(f"held-out file {str(path)!r} is missing or damaged ({error})") from error
    if written - {source}:
        names = ", ".join(repr(w or "the pool") for w in sorted(written))
        raise DatasetError(
            f"held-out file {str(path)!r} was drawn from {names}, but this run draws it from "
            f"{source or 'the pool'!r}; resume with the config that wrote it"
        )
    if len(indices) and (indices.min() < 0 or indices.max() >= pool_size):
        raise DatasetError(
            f"held-out file {str(path)!r} refers to sample {indices.max()}, but the dataset has {pool_size}; "
            "it was written for another dataset"
        )
    return indices
