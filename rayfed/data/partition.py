"""Client partitions: which dataset indices each virtual client trains and tests on.

The partitioners reimplement PFLlib's generator, ``dataset/utils/dataset_utils.py``
(``separate_data`` and ``split_data``; byte-identical in cwFedAvg's C-cw0), as described
in algorithms.md §1.8:

* ``partition_pathological``: ``separate_data(partition='pat', balance=False)``.
* ``partition_dirichlet``: ``separate_data(partition='dir')``.
* ``split_train_test``: ``split_data``, i.e. sklearn ``train_test_split(train_size=0.75,
  shuffle=True)`` per client, not stratified.

All of them draw from one ``numpy.random.RandomState`` in the same order as the
generator draws from the global NumPy RNG, so ``make_partition(..., seed=1)`` on the
merged pool in torchvision order (train then test) gives the partition of PFLlib's
``generate_*.py`` scripts, which seed ``np.random`` with 1. This was checked index for
index against PFLlib's code (pathological and Dirichlet, with the sklearn split) on
MNIST and on a 100-class pool. Dirichlet on a CIFAR-100-sized pool also reproduces the
classes-per-client figures of P-arXiv Table 3 (see the tests).

Partitions are stored as CSR index arrays (:class:`Partition`), so 100,000 clients are
four arrays, not 200,000, and travel zero-copy through Ray's object store.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayfed.errors import ConfigError, DatasetError
from rayfed.registry import closest

__all__ = [
    "PARTITIONS",
    "Partition",
    "make_partition",
    "partition_dirichlet",
    "partition_iid",
    "partition_pathological",
    "split_train_test",
]

PARTITIONS = ("dirichlet", "iid", "pathological")
"""Values allowed for ``data.partition``."""

_MAX_DIRICHLET_TRIES = 1000
_FORMAT_VERSION = "1"
_META_CLIENTS = b"rayfed.num_clients"
_META_CLASSES = b"rayfed.num_classes"
_META_VERSION = b"rayfed.partition_format"


@dataclass(frozen=True, eq=False)
class Partition:
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
        split. PFLlib computes cwFedAvg's p_i from this histogram (algorithms.md §6,
        cwFedAvg item 4).
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
        for field in (
            self.train_indices,
            self.train_offsets,
            self.test_indices,
            self.test_offsets,
            self.label_counts,
            self.train_label_counts,
        ):
            field.setflags(write=False)

    @property
    def num_clients(self) -> int:
        """M, the number of clients (some may hold no samples)."""
        return int(len(self.train_offsets) - 1)

    @property
    def num_classes(self) -> int:
        """K, the number of classes the counts are over."""
        return int(self.label_counts.shape[1])

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

    def class_distribution(self, *, train_only: bool = False) -> np.ndarray:
        """p_i, each client's class distribution, shape (M, K), rows summing to 1.

        By default over the whole partition (train + test), as PFLlib/cwFedAvg compute
        it; ``train_only=True`` uses the training split. A client without samples gets
        the uniform row 1/K, so downstream matrix products stay well defined.
        """
        counts = (self.train_label_counts if train_only else self.label_counts).astype(np.float64)
        totals = counts.sum(axis=1, keepdims=True)
        uniform = np.full_like(counts, 1.0 / max(self.num_classes, 1))
        return np.divide(counts, totals, out=uniform, where=totals > 0)

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
        table = pa.table(
            {
                "client_id": pa.array(client_id, pa.int32()),
                "split": split,
                "index": pa.array(np.concatenate([self.train_indices, self.test_indices])),
            }
        )
        return table.replace_schema_metadata(
            {
                _META_CLIENTS: str(m).encode(),
                _META_CLASSES: str(self.num_classes).encode(),
                _META_VERSION: _FORMAT_VERSION.encode(),
            }
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_table` as Parquet, atomically.

        The table goes to a temporary file in the same folder, which then replaces
        ``path`` (``os.replace``), so a crash never leaves a half-written partition.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            pq.write_table(self.to_table(), tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str], labels: np.ndarray, num_classes: int) -> Partition:
        """Read a partition written by :meth:`save` and rebuild its label counts.

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
            dataset (an index out of range); the message names the path.
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
        train_indices, train_offsets = _group_by_client(index[is_train], client_id[is_train], m)
        test_indices, test_offsets = _group_by_client(index[~is_train], client_id[~is_train], m)
        return _build(train_indices, train_offsets, test_indices, test_offsets, labels, num_classes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in (
                "train_indices",
                "train_offsets",
                "test_indices",
                "test_offsets",
                "label_counts",
                "train_label_counts",
            )
        )

    def __repr__(self) -> str:
        return (
            f"Partition(num_clients={self.num_clients}, num_classes={self.num_classes}, "
            f"train={len(self.train_indices)}, test={len(self.test_indices)})"
        )


# --------------------------------------------------------------------------- CSR helpers


def _offsets(sizes: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _group_by_client(samples: np.ndarray, clients: np.ndarray, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of ``samples`` grouped by ``clients``, keeping their order within a client."""
    order = np.argsort(clients, kind="stable")
    return samples[order].astype(np.int64, copy=False), _offsets(np.bincount(clients, minlength=num_clients))


def _to_lists(indices: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return np.split(indices, offsets[1:-1])


def _label_counts(indices: np.ndarray, offsets: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(M, K) histogram of ``labels[indices]`` per client, in one bincount."""
    m = len(offsets) - 1
    owner = np.repeat(np.arange(m, dtype=np.int64), np.diff(offsets))
    flat = np.bincount(owner * num_classes + labels[indices], minlength=m * num_classes)
    return flat.reshape(m, num_classes).astype(np.int64, copy=False)


def _build(
    train_indices: np.ndarray,
    train_offsets: np.ndarray,
    test_indices: np.ndarray,
    test_offsets: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
) -> Partition:
    train_counts = _label_counts(train_indices, train_offsets, labels, num_classes)
    test_counts = _label_counts(test_indices, test_offsets, labels, num_classes)
    return Partition(
        train_indices=train_indices,
        train_offsets=train_offsets,
        test_indices=test_indices,
        test_offsets=test_offsets,
        label_counts=train_counts + test_counts,
        train_label_counts=train_counts,
    )


# --------------------------------------------------------------------------- partitioners


def _iid(num_samples: int, num_clients: int, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.full(num_clients, num_samples // num_clients, dtype=np.int64)
    sizes[: num_samples % num_clients] += 1
    return rng.permutation(num_samples).astype(np.int64), _offsets(sizes)


def partition_iid(labels: np.ndarray, num_clients: int, rng: np.random.RandomState) -> list[np.ndarray]:
    """Shuffle all samples and deal them into ``num_clients`` near-equal parts.

    Sizes differ by at most one. This is a true IID split; PFLlib's "iid" (``niid=False``)
    is instead the pathological partitioner with every class per client, which you get
    here with ``partition_pathological(..., classes_per_client=num_classes)``.
    """
    indices, offsets = _iid(len(labels), num_clients, rng)
    return _to_lists(indices, offsets)


def _pathological(
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    classes_per_client: int,
    rng: np.random.RandomState,
    balance: bool,
    least_samples: int,
) -> tuple[np.ndarray, np.ndarray]:
    by_class = np.argsort(labels, kind="stable")  # each class in dataset order
    class_start = _offsets(np.bincount(labels, minlength=num_classes))
    quota = np.full(num_clients, classes_per_client, dtype=np.int64)
    keep = int(np.ceil((num_clients / num_classes) * classes_per_client))
    owners = []
    for j in range(num_classes):
        selected = np.flatnonzero(quota > 0)[:keep]
        s = len(selected)
        n = int(class_start[j + 1] - class_start[j])
        if s == 0:
            raise ConfigError(
                f"pathological partition ran out of clients at class {j}: every client already "
                f"holds data.classes_per_client={classes_per_client} classes; raise "
                f"data.classes_per_client or data.num_clients={num_clients}"
            )
        avg = n / s
        if balance:
            sizes = np.full(s - 1, int(avg), dtype=np.int64)
        elif s > 1:
            # PFLlib passes the float bounds; RandomState.randint truncates them to ints.
            low, high = int(max(avg / 10, least_samples / num_classes)), int(avg)
            if high <= low:
                raise DatasetError(
                    f"pathological partition: class {j} has {n} samples for {s} clients, too few "
                    "to give each a block; use fewer data.num_clients or a lower "
                    "data.classes_per_client"
                )
            sizes = rng.randint(low, high, s - 1).astype(np.int64)
        else:
            sizes = np.zeros(0, dtype=np.int64)
        sizes = np.append(sizes, n - sizes.sum())
        owners.append(np.repeat(selected, sizes))
        quota[selected] -= 1
    return _group_by_client(by_class, np.concatenate(owners), num_clients)


def partition_pathological(
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    classes_per_client: int,
    rng: np.random.RandomState,
    *,
    balance: bool = False,
    least_samples: int = 1,
) -> list[np.ndarray]:
    """Give every client ``classes_per_client`` classes in deterministic blocks (PFLlib 'pat').

    Reimplements PFLlib/C-cw0 ``separate_data(partition='pat')``. Every client starts
    with a quota of C classes. Classes j = 0..K-1 are handled in order; for class j the
    first ceil(M/K*C) clients with quota left (in index order) are selected, its samples
    are taken in dataset order and cut into contiguous blocks. With ``balance=False``
    the first s-1 blocks have sizes ``rng.randint(max(avg/10, least/K), avg)`` (float
    bounds truncated, as NumPy does) and the last block takes the remainder; with
    ``balance=True`` each has int(avg). With M=20, K=10, C=2 clients 0-3 get classes
    {0, 1}, clients 4-7 get {2, 3}, and so on.

    A client's indices are ordered by class, then by dataset order.

    Raises
    ------
    ConfigError
        When the quotas run out before the last class (M*C too small for K).
    DatasetError
        When a class has fewer samples than the clients it must be split between.
    """
    indices, offsets = _pathological(
        np.asarray(labels, dtype=np.int64), num_clients, num_classes, classes_per_client, rng, balance, least_samples
    )
    return _to_lists(indices, offsets)


def _dirichlet(
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    alpha: float,
    rng: np.random.RandomState,
    least_samples: int,
    max_tries: int,
) -> tuple[np.ndarray, np.ndarray]:
    n_total = len(labels)
    by_class = np.argsort(labels, kind="stable")
    class_start = _offsets(np.bincount(labels, minlength=num_classes))
    cap = n_total / num_clients
    concentration = np.repeat(float(alpha), num_clients)
    clients = np.arange(num_clients, dtype=np.int64)
    smallest = 0
    for _ in range(max_tries):
        sizes = np.zeros(num_clients, dtype=np.int64)
        samples, owners = [], []
        for k in range(num_classes):
            idx = by_class[class_start[k] : class_start[k + 1]].copy()
            rng.shuffle(idx)
            proportions = rng.dirichlet(concentration) * (sizes < cap)  # full clients get 0
            total = proportions.sum()
            if not np.isfinite(total) or total <= 0:
                # Every eligible share underflowed to 0 (tiny alpha); PFLlib would divide
                # by zero here. Split evenly among the clients still below the cap.
                proportions = (sizes < cap).astype(np.float64)
                total = proportions.sum()
            cuts = (np.cumsum(proportions / total) * len(idx)).astype(np.int64)[:-1]
            counts = np.diff(cuts, prepend=0, append=len(idx))
            sizes += counts
            samples.append(idx)
            owners.append(np.repeat(clients, counts))
        smallest = int(sizes.min())
        if smallest >= least_samples:
            return _group_by_client(np.concatenate(samples), np.concatenate(owners), num_clients)
    raise DatasetError(
        f"Dirichlet partition could not give every one of {num_clients} clients at least "
        f"data.min_samples={least_samples} samples in {max_tries} tries (alpha={alpha}, "
        f"{n_total} samples; the smallest client got {smallest}); lower data.min_samples, "
        "raise data.alpha or use fewer data.num_clients"
    )


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    alpha: float,
    rng: np.random.RandomState,
    *,
    least_samples: int = 1,
    max_tries: int = _MAX_DIRICHLET_TRIES,
) -> list[np.ndarray]:
    """Label-skewed partition with Dir(alpha) class shares (PFLlib 'dir').

    Reimplements PFLlib/C-cw0 ``separate_data(partition='dir')`` (itself from IBM's
    PFNM ``experiment.py``). The whole allocation is repeated until every client holds
    at least ``least_samples`` samples. For each class k: shuffle its indices, draw
    proportions ~ Dir(alpha * 1_M), set the share of every client already holding
    >= N/M samples to 0, renormalise, and cut the class at floor(cumsum(p) * n_k).

    A client's indices are ordered by class, then in the shuffled order.

    Raises
    ------
    DatasetError
        When ``max_tries`` allocations all leave a client below ``least_samples``
        (PFLlib would loop forever).
    """
    indices, offsets = _dirichlet(
        np.asarray(labels, dtype=np.int64), num_clients, num_classes, alpha, rng, least_samples, max_tries
    )
    return _to_lists(indices, offsets)


# --------------------------------------------------------------------------- train/test split


def _split(
    indices: np.ndarray,
    offsets: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    train_fraction: float,
    rng: np.random.RandomState,
) -> Partition:
    sizes = np.diff(offsets)
    n_train = np.floor(train_fraction * sizes).astype(np.int64)
    n_test = sizes - n_train
    # One permutation per client, in client order, drawn as sklearn's ShuffleSplit draws
    # it (rng.permutation(n)); the first n_test shuffled positions are the test set, the
    # rest the training set. Only the draws are a Python loop; the gather is vectorised.
    perms = [rng.permutation(int(size)) for size in sizes[sizes > 0]]
    starts = np.repeat(offsets[:-1], sizes)
    shuffled = indices[np.concatenate(perms) + starts] if perms else indices[:0]
    is_test = (np.arange(len(indices)) - starts) < np.repeat(n_test, sizes)
    return _build(shuffled[~is_test], _offsets(n_train), shuffled[is_test], _offsets(n_test), labels, num_classes)


def split_train_test(
    client_indices: list[np.ndarray],
    labels: np.ndarray,
    num_classes: int,
    train_fraction: float,
    rng: np.random.RandomState,
) -> Partition:
    """Split every client's samples into train and test (PFLlib ``split_data``).

    Each client's samples are shuffled and the first ceil((1 - f) * n) go to test, the
    remaining n_train = floor(f * n) to train: sklearn ``train_test_split(train_size=f,
    shuffle=True)`` semantics, not stratified, drawing from ``rng`` client by client.
    Unlike sklearn, a client too small for a training sample (n = 1) is not an error:
    it keeps its sample for testing.
    """
    labels = np.asarray(labels, dtype=np.int64)
    sizes = np.array([len(c) for c in client_indices], dtype=np.int64)
    flat = np.concatenate(client_indices).astype(np.int64) if client_indices else np.zeros(0, np.int64)
    return _split(flat, _offsets(sizes), labels, num_classes, train_fraction, rng)


# --------------------------------------------------------------------------- entry point


def make_partition(
    labels: np.ndarray,
    num_classes: int,
    *,
    method: str,
    num_clients: int,
    seed: int,
    alpha: float = 0.1,
    classes_per_client: int = 2,
    min_samples: int = 1,
    balance: bool = False,
    train_fraction: float = 0.75,
) -> Partition:
    """Partition a labelled pool among clients and split each client 75/25.

    Parameters
    ----------
    labels
        int labels of the pool, shape (N,), in [0, num_classes).
    num_classes
        K.
    method
        ``data.partition``: ``"iid"``, ``"pathological"`` or ``"dirichlet"``.
    num_clients
        ``data.num_clients``, M.
    seed
        Seeds one ``numpy.random.RandomState`` used first by the partitioner and then
        by the split, as PFLlib's generator uses the global RNG (seeded with 1).
    alpha
        ``data.alpha``, the Dirichlet concentration (dirichlet only).
    classes_per_client
        ``data.classes_per_client``, C (pathological only).
    min_samples
        ``data.min_samples``: PFLlib's ``least_samples``. Dirichlet repeats its
        allocation until every client holds at least this many samples; the
        pathological partitioner uses it only in its lower block-size bound. 0 allows
        empty clients (useful for 100,000 clients on a small pool).
    balance
        Pathological only: equal block sizes instead of random ones.
    train_fraction
        ``data.train_fraction``, f in (0, 1]; each client trains on floor(f * n_i).

    Raises
    ------
    ConfigError
        For a value out of range; the message names the field, the value and what is
        allowed.
    DatasetError
        When the labels are malformed or Dirichlet cannot meet ``min_samples``.

    Examples
    --------
    >>> labels = np.repeat(np.arange(10), 100)
    >>> p = make_partition(labels, 10, method="pathological", num_clients=20, seed=1)
    >>> sorted(np.flatnonzero(p.label_counts[0]).tolist())
    [0, 1]
    """
    labels = _check_labels(labels, num_classes)
    n = len(labels)
    _require_int("data.num_clients", num_clients, 1)
    if num_clients > n:
        raise ConfigError(
            f"data.num_clients={num_clients} is more clients than samples: the dataset has {n} "
            "samples, so some clients would get none; use at most that many clients"
        )
    if method not in PARTITIONS:
        raise ConfigError(
            f"unknown data.partition={method!r}{closest(str(method), PARTITIONS)}; "
            f"known partitions: {', '.join(PARTITIONS)}"
        )
    _require_int("data.min_samples", min_samples, 0)
    if min_samples * num_clients > n:
        raise ConfigError(
            f"data.min_samples={min_samples} cannot hold: {num_clients} clients x {min_samples} "
            f"samples is more than the {n} samples in the dataset"
        )
    if not (isinstance(train_fraction, (int, float)) and 0.0 < train_fraction <= 1.0):
        raise ConfigError(f"data.train_fraction must be in (0, 1], but got data.train_fraction={train_fraction!r}")

    rng = np.random.RandomState(seed)
    if method == "iid":
        indices, offsets = _iid(n, num_clients, rng)
    elif method == "pathological":
        _require_int("data.classes_per_client", classes_per_client, 1, num_classes)
        indices, offsets = _pathological(
            labels, num_clients, num_classes, classes_per_client, rng, balance, min_samples
        )
    else:
        if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and math.isfinite(alpha) and alpha > 0):
            raise ConfigError(f"data.alpha must be a finite number > 0, but got data.alpha={alpha!r}")
        indices, offsets = _dirichlet(labels, num_clients, num_classes, alpha, rng, min_samples, _MAX_DIRICHLET_TRIES)
    return _split(indices, offsets, labels, num_classes, train_fraction, rng)


def _check_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"labels must be a 1-D integer array, but got dtype={labels.dtype}, shape={labels.shape}")
    _require_int("num_classes", num_classes, 1)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DatasetError(f"labels must lie in [0, {num_classes}), but range over [{labels.min()}, {labels.max()}]")
    return labels.astype(np.int64, copy=False)


def _require_int(field: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ConfigError naming ``field`` unless ``value`` is an int (not a bool) in [low, high]."""
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if is_int and low <= value and (high is None or value <= high):  # type: ignore[operator]
        return
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ConfigError(f"{field} must be an integer {allowed}, but got {field}={value!r}")
