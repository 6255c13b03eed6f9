"""Two groups of clients that disagree on every label: the test bed of the clustering methods (CFL, IFCA).

The dataset ``two_label_groups`` is the synthetic glyph pool whose second half has its
labels shifted, y → (y + K/2) mod K, as the CFL paper permutes labels between clusters;
the partitioner ``two_groups`` deals the first half to the even client ids and the
shifted half to the odd ones, evenly at random. So no single model can fit both groups,
while a model per group can.
"""

from __future__ import annotations

import numpy as np

from rayfed.data import DATASETS, PARTITIONERS, ArrayDataset, make_synthetic
from rayfed.data.csr import offsets_from_sizes

DATASET = "two_label_groups"
PARTITION = "two_groups"

__all__ = ["DATASET", "PARTITION", "group_of", "two_group_overrides"]


def group_of(client_id: int) -> int:
    """0 for the clients with the original labels (even ids), 1 for those with shifted labels (odd ids)."""
    return client_id % 2


def _load(root: str | None, *, download: bool = False, seed: int = 0, num_samples: int = 1000) -> ArrayDataset:
    del root, download
    pool = make_synthetic(seed, num_samples=num_samples)
    labels = pool.labels.copy()
    half = num_samples // 2
    labels[half:] = (labels[half:] + pool.num_classes // 2) % pool.num_classes
    return ArrayDataset(DATASET, pool.images, labels, pool.num_classes, pool.mean, pool.std)


def _partition(labels: np.ndarray, num_classes: int, data, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    half, m = len(labels) // 2, data.num_clients
    groups = [np.arange(m)[0::2], np.arange(m)[1::2]]
    pools = [rng.permutation(half), half + rng.permutation(len(labels) - half)]
    chunks: list[np.ndarray] = [np.empty(0, np.int64)] * m
    for clients, pool in zip(groups, pools):
        for cid, part in zip(clients, np.array_split(pool, len(clients))):
            chunks[cid] = part.astype(np.int64)
    return np.concatenate(chunks), offsets_from_sizes(np.array([len(c) for c in chunks]))


if DATASET not in DATASETS:
    DATASETS.register(DATASET)(_load)
if PARTITION not in PARTITIONERS:
    PARTITIONERS.register(PARTITION)(_partition)


def two_group_overrides(**extra: object) -> dict[str, object]:
    """Data settings of the two-group problem (merge into ``tiny_overrides``)."""
    return {"data.dataset": DATASET, "data.partition": PARTITION, "data.options": {"num_samples": 1000}, **extra}
