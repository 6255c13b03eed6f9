"""Each client's own train/test split, as in PFLlib's ``split_data``.

The cwFedAvg papers split every client's samples 75 % / 25 % into training and test
sets ("Class-Wise Federated Averaging for Efficient Personalization", ICCV 2025,
Sec. 5.1; "Regularizing and Aggregating Clients with Class Distribution for
Personalized Federated Learning", arXiv, Appendix C), with the generators of PFLlib, whose
``split_data`` calls sklearn ``train_test_split(train_size=0.75, shuffle=True)`` per
client, not stratified. Every client is evaluated on its own test split (docs/algorithms.md,
"Data and evaluation" section).
"""

from __future__ import annotations

import numpy as np

from rayfed.data.csr import offsets_from_sizes
from rayfed.data.partition import Partition
from rayfed.util.progress import progress_bar

__all__ = ["split_csr", "split_train_test"]

_PROGRESS_EVERY = 100_000
"""Clients split between two updates of the progress bar (shown when splitting is slow)."""


def split_csr(
    indices: np.ndarray,
    offsets: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    train_fraction: float,
    rng: np.random.RandomState,
) -> Partition:
    """Split the clients of a CSR partition (see :func:`split_train_test`)."""
    sizes = np.diff(offsets)
    n_train = np.floor(train_fraction * sizes).astype(np.int64)
    n_test = sizes - n_train
    # One permutation per client, in client order, drawn as sklearn's ShuffleSplit draws
    # it (rng.permutation(n)); the first n_test shuffled positions are the test set, the
    # rest the training set. Only the draws are a Python loop; the gather is vectorised.
    nonempty = sizes[sizes > 0].tolist()
    perms: list[np.ndarray] = []
    with progress_bar(len(nonempty), "splitting clients into train and test", "client") as bar:
        for lo in range(0, len(nonempty), _PROGRESS_EVERY):
            perms.extend(rng.permutation(size) for size in nonempty[lo : lo + _PROGRESS_EVERY])
            bar.update(len(nonempty[lo : lo + _PROGRESS_EVERY]))
    starts = np.repeat(offsets[:-1], sizes)
    shuffled = indices[np.concatenate(perms) + starts] if perms else indices[:0]
    is_test = (np.arange(len(indices)) - starts) < np.repeat(n_test, sizes)
    return Partition.from_csr(
        shuffled[~is_test],
        offsets_from_sizes(n_train),
        shuffled[is_test],
        offsets_from_sizes(n_test),
        labels,
        num_classes,
    )


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

    >>> labels = np.array([0, 1, 1, 0, 1])
    >>> part = split_train_test([np.array([0]), np.array([1, 2, 3, 4])], labels, 2, 0.75, np.random.RandomState(0))
    >>> part.num_train().tolist(), part.num_test().tolist()
    ([0, 3], [1, 1])
    """
    labels = np.asarray(labels, dtype=np.int64)
    sizes = np.array([len(c) for c in client_indices], dtype=np.int64)
    flat = np.concatenate(client_indices).astype(np.int64) if client_indices else np.zeros(0, np.int64)
    return split_csr(flat, offsets_from_sizes(sizes), labels, num_classes, train_fraction, rng)
