"""Partitioners: which samples of the pool each client gets, chosen by ``data.partition``.

The cwFedAvg papers ("Class-Wise Federated Averaging for Efficient Personalization",
ICCV 2025, Sec. 5.1; "Regularizing and Aggregating Clients with Class Distribution for
Personalized Federated Learning", arXiv, Appendix C) partition their data with the
generators of PFLlib, ``dataset/utils/dataset_utils.py``; the cwFedAvg authors' code
ships the same file. The partitioners here reimplement its ``separate_data``:

* ``"pathological"``: ``separate_data(partition='pat', balance=False)``, each client
  holds a few classes;
* ``"dirichlet"``: ``separate_data(partition='dir')``, class shares drawn from Dir(alpha);
* ``"iid"``: a uniform random split (PFLlib has no such mode; see :func:`partition_iid`).

All of them draw from one ``numpy.random.RandomState`` in the same order as the
generator draws from the global NumPy RNG, and :func:`make_partition` then splits each
client with the same generator (:mod:`rayfed.data.split`). So ``make_partition`` with
``data.seed=1`` on the merged pool in torchvision order (train then test) gives the
partition of PFLlib's ``generate_*.py`` scripts, which seed ``np.random`` with 1. This
was checked index for index against PFLlib's code (pathological and Dirichlet, with the
sklearn split) on MNIST and on a 100-class pool, and Dirichlet on a CIFAR-100-sized pool
reproduces the classes-per-client figures of the arXiv paper's Table 3 (see
tests/data/test_partition.py). The protocol as a whole is described in
docs/algorithms.md, "Data and evaluation" section.

A partitioner is registered by name in :data:`PARTITIONERS`: a function
``(labels, num_classes, data, rng) -> (indices, offsets)`` returning the clients' index
sets in CSR form (:mod:`rayfed.data.csr`), which reads its own fields of the
:class:`~rayfed.data.settings.DataConfig` and checks the ones that depend on the data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rayfed.data.csr import group_by_client, offsets_from_sizes
from rayfed.data.partition import ClientPartition
from rayfed.data.split import split_csr
from rayfed.util.errors import ConfigError, DatasetError
from rayfed.util.progress import progress_bar
from rayfed.util.registry import Registry
from rayfed.util.validation import check, check_int

if TYPE_CHECKING:
    from rayfed.data.settings import DataConfig

logger = logging.getLogger(__name__)

__all__ = [
    "PARTITIONERS",
    "Partitioner",
    "make_partition",
    "partition_dirichlet",
    "partition_iid",
    "partition_pathological",
]

Partitioner = Callable[
    [np.ndarray, int, "DataConfig", np.random.RandomState], tuple[np.ndarray, np.ndarray] | ClientPartition
]
"""``partitioner(labels, num_classes, data, rng) -> (indices, offsets)``, the clients in CSR form, which
:func:`make_partition` then splits; or the finished, split partition (:mod:`rayfed.data.pool_slices`)."""

PARTITIONERS: Registry[Partitioner] = Registry("partition", field="data.partition")

_MAX_DIRICHLET_TRIES = 1000


def make_partition(labels: np.ndarray, num_classes: int, data: DataConfig) -> ClientPartition:
    """Partition a labelled pool among ``data.num_clients`` clients and split each one.

    The partitioner registered as ``data.partition`` assigns the samples, then every
    client's share is split into ``floor(data.train_fraction * n_i)`` training samples
    and the rest for testing (:func:`~rayfed.data.split.split_csr`). Both draw, in this
    order, from one ``numpy.random.RandomState(data.seed)``, as PFLlib's generator draws
    from the global RNG. A partitioner may instead return the finished partition
    (``"slices"``, :mod:`rayfed.data.pool_slices`). The config's own ranges were checked
    when it was built; only what depends on the data is checked, by the partitioner.

    Parameters
    ----------
    labels
        int labels of the pool, shape (N,), in [0, num_classes).
    num_classes
        K.
    data
        The run's data section: ``partition``, ``num_clients``, ``seed``,
        ``train_fraction`` and the fields the chosen partitioner reads.

    Raises
    ------
    ConfigError
        When a setting does not fit this dataset (more clients than samples, a
        ``min_samples`` the pool cannot hold, more classes per client than classes);
        the message names the field, the value and the fix.
    DatasetError
        When the labels are malformed or the partitioner cannot meet ``min_samples``.

    Examples
    --------
    >>> from rayfed.data.settings import DataConfig
    >>> labels = np.repeat(np.arange(10), 100)
    >>> p = make_partition(labels, 10, DataConfig(partition="pathological", num_clients=20, seed=1))
    >>> sorted(np.flatnonzero(p.label_counts[0]).tolist())
    [0, 1]
    """
    labels = _check_labels(labels, num_classes)
    logger.info(
        "partitioning %d samples among %d clients (data.partition=%r)", len(labels), data.num_clients, data.partition
    )
    rng = np.random.RandomState(data.seed)
    assigned = PARTITIONERS.get(data.partition)(labels, num_classes, data, rng)
    if isinstance(assigned, ClientPartition):  # the partitioner split its clients itself
        return assigned
    indices, offsets = assigned
    return split_csr(indices, offsets, labels, num_classes, data.train_fraction, rng)


def _check_dealable(n: int, data: DataConfig) -> None:
    """A partitioner that deals each of the n samples to one client needs n >= M (and n >= M * min_samples)."""
    if data.num_clients > n:
        raise ConfigError(
            f"data.num_clients={data.num_clients} is more clients than samples: the dataset has {n} "
            "samples, so some clients would get none; use at most that many clients, or "
            "data.partition=slices, whose clients share the pool"
        )
    if data.min_samples * data.num_clients > n:
        raise ConfigError(
            f"data.min_samples={data.min_samples} cannot hold: {data.num_clients} clients x "
            f"{data.min_samples} samples is more than the {n} samples in the dataset; lower "
            "data.min_samples or data.num_clients"
        )


def _check_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"labels must be a 1-D integer array, but got dtype={labels.dtype}, shape={labels.shape}")
    check_int("num_classes", num_classes, low=1)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DatasetError(f"labels must lie in [0, {num_classes}), but range over [{labels.min()}, {labels.max()}]")
    return labels.astype(np.int64, copy=False)


# --------------------------------------------------------------------------- iid


def partition_iid(labels: np.ndarray, num_clients: int, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle all samples and deal them into ``num_clients`` near-equal parts (CSR).

    Sizes differ by at most one. This is a true IID split; PFLlib's "iid" (``niid=False``)
    is instead the pathological partitioner with every class per client, which you get
    here with ``partition_pathological(..., classes_per_client=num_classes)``.

    >>> indices, offsets = partition_iid(np.zeros(5, np.int64), 2, np.random.RandomState(0))
    >>> offsets.tolist()
    [0, 3, 5]
    """
    num_samples = len(labels)
    sizes = np.full(num_clients, num_samples // num_clients, dtype=np.int64)
    sizes[: num_samples % num_clients] += 1
    return rng.permutation(num_samples).astype(np.int64), offsets_from_sizes(sizes)


@PARTITIONERS.register("iid")
def _iid_partitioner(
    labels: np.ndarray, num_classes: int, data: DataConfig, rng: np.random.RandomState
) -> tuple[np.ndarray, np.ndarray]:
    _check_dealable(len(labels), data)
    return partition_iid(labels, data.num_clients, rng)


# --------------------------------------------------------------------------- pathological


def partition_pathological(
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    classes_per_client: int,
    rng: np.random.RandomState,
    *,
    balance: bool = False,
    least_samples: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Give every client ``classes_per_client`` classes in deterministic blocks (PFLlib 'pat'), in CSR form.

    Reimplements PFLlib's ``separate_data(partition='pat')``. Every client starts
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
    labels = np.asarray(labels, dtype=np.int64)
    by_class = np.argsort(labels, kind="stable")  # each class in dataset order
    class_start = offsets_from_sizes(np.bincount(labels, minlength=num_classes))
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
    return group_by_client(by_class, np.concatenate(owners), num_clients)


@PARTITIONERS.register("pathological")
def _pathological_partitioner(
    labels: np.ndarray, num_classes: int, data: DataConfig, rng: np.random.RandomState
) -> tuple[np.ndarray, np.ndarray]:
    _check_dealable(len(labels), data)
    check(
        data.classes_per_client <= num_classes,
        "data.classes_per_client",
        data.classes_per_client,
        f"at most the number of classes in the dataset, {num_classes}",
    )
    return partition_pathological(
        labels,
        data.num_clients,
        num_classes,
        data.classes_per_client,
        rng,
        balance=data.balance,
        least_samples=data.min_samples,
    )


# --------------------------------------------------------------------------- dirichlet


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    alpha: float,
    rng: np.random.RandomState,
    *,
    least_samples: int = 1,
    max_tries: int = _MAX_DIRICHLET_TRIES,
) -> tuple[np.ndarray, np.ndarray]:
    """Label-skewed partition with Dir(alpha) class shares (PFLlib 'dir'), in CSR form.

    Reimplements PFLlib's ``separate_data(partition='dir')`` (itself from IBM's PFNM
    ``experiment.py``). The whole allocation is repeated until every client holds at
    least ``least_samples`` samples. For each class k: shuffle its indices, draw
    proportions ~ Dir(alpha * 1_M), set the share of every client already holding
    >= N/M samples to 0, renormalise, and cut the class at floor(cumsum(p) * n_k).

    A client's indices are ordered by class, then in the shuffled order.

    Raises
    ------
    DatasetError
        When ``max_tries`` allocations all leave a client below ``least_samples``
        (PFLlib would loop forever).
    """
    labels = np.asarray(labels, dtype=np.int64)
    n_total = len(labels)
    by_class = np.argsort(labels, kind="stable")
    class_start = offsets_from_sizes(np.bincount(labels, minlength=num_classes))
    cap = n_total / num_clients
    concentration = np.repeat(float(alpha), num_clients)
    clients = np.arange(num_clients, dtype=np.int64)
    smallest = 0
    with progress_bar(num_classes, "Dirichlet partition", "class") as bar:
        for attempt in range(max_tries):
            if attempt:  # a redraw: the bar counts every class of every attempt
                bar.total += num_classes
                bar.set_postfix(attempt=attempt + 1, refresh=False)
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
                bar.update()
            smallest = int(sizes.min())
            if smallest >= least_samples:
                return group_by_client(np.concatenate(samples), np.concatenate(owners), num_clients)
    raise DatasetError(
        f"Dirichlet partition could not give every one of {num_clients} clients at least "
        f"data.min_samples={least_samples} samples in {max_tries} tries (alpha={alpha}, "
        f"{n_total} samples; the smallest client got {smallest}); lower data.min_samples, "
        "raise data.alpha or use fewer data.num_clients"
    )


@PARTITIONERS.register("dirichlet")
def _dirichlet_partitioner(
    labels: np.ndarray, num_classes: int, data: DataConfig, rng: np.random.RandomState
) -> tuple[np.ndarray, np.ndarray]:
    _check_dealable(len(labels), data)
    return partition_dirichlet(labels, data.num_clients, num_classes, data.alpha, rng, least_samples=data.min_samples)
