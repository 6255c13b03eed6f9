"""CSR index arrays: many clients' index sets as one flat array plus offsets.

Client i's indices are ``indices[offsets[i]:offsets[i + 1]]``. Two arrays instead of one
small array per client keep 100,000 clients cheap to build, to store as Parquet and to
send through Ray's object store without copying. The partitioners
(:mod:`rayfed.data.partitioners`), the train/test split (:mod:`rayfed.data.split`) and
:class:`~rayfed.data.partition.Partition` all work on this form.

>>> offsets_from_sizes(np.array([2, 0, 3]))
array([0, 2, 2, 5])
>>> indices, offsets = group_by_client(np.array([10, 11, 12]), np.array([1, 0, 1]), 2)
>>> [part.tolist() for part in to_lists(indices, offsets)]
[[11], [10, 12]]
"""

from __future__ import annotations

import numpy as np

__all__ = ["count_labels", "group_by_client", "offsets_from_sizes", "to_lists"]


def offsets_from_sizes(sizes: np.ndarray) -> np.ndarray:
    """int64 offsets (M + 1,) of consecutive groups of the given sizes, starting at 0."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def group_by_client(samples: np.ndarray, clients: np.ndarray, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of ``samples`` grouped by ``clients``, keeping their order within a client."""
    order = np.argsort(clients, kind="stable")
    return samples[order].astype(np.int64, copy=False), offsets_from_sizes(np.bincount(clients, minlength=num_clients))


def to_lists(indices: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """One array per client (views into ``indices``)."""
    return np.split(indices, offsets[1:-1])


def count_labels(indices: np.ndarray, offsets: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(M, K) int64 histogram of ``labels[indices]`` per client, in one bincount."""
    m = len(offsets) - 1
    owner = np.repeat(np.arange(m, dtype=np.int64), np.diff(offsets))
    flat = np.bincount(owner * num_classes + labels[indices], minlength=m * num_classes)
    return flat.reshape(m, num_classes).astype(np.int64, copy=False)
