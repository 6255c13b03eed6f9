"""Uploads that add: the sufficient statistics of weighted averaging.

A worker sums the contributions of its batch of clients before returning (local
aggregation), and the server sums the workers' partial sums, so what the server
receives grows with the number of workers, not clients. Partial sums are merged along a
fixed tree over the batches (:mod:`rayfed.execution.summation`), so a run is bit-for-bit reproducible
whatever worker or node ran what; on a cluster, each node adds up the subtrees of the batches it ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from rayfed.algorithms.hooks import Contribution

__all__ = ["WeightedSum", "ClientVectors", "sum_contributions"]

C = TypeVar("C", bound=Contribution)


@dataclass
class WeightedSum(Contribution):
    """Σ_i w_i x_i and Σ_i w_i: FedAvg's sufficient statistics (Flower/pfl ``WeightedStatistics``).

    On a worker the sum may be a tensor on its device; :meth:`with_host_arrays` turns it into the
    numpy array the server aggregates.
    """

    total: Any
    """Σ_i w_i x_i: a float32 numpy array, or a tensor on a worker's device."""
    weight: float
    count: int = 1

    @classmethod
    def of(cls, vector: Any, weight: float) -> WeightedSum:
        """The contribution of one client: its vector (numpy, or a tensor) scaled by its weight (n_i for FedAvg)."""
        return cls(
            vector * np.float32(weight) if isinstance(vector, np.ndarray) else vector * float(weight), float(weight), 1
        )

    def __add__(self, other: WeightedSum) -> WeightedSum:
        return WeightedSum(self.total + other.total, self.weight + other.weight, self.count + other.count)

    def __iadd__(self, other: WeightedSum) -> WeightedSum:
        if isinstance(self.total, np.ndarray) and not self.total.flags.writeable:  # read zero-copy from Ray's store
            return self + other
        self.total += other.total
        self.weight += other.weight
        self.count += other.count
        return self

    def average(self) -> np.ndarray:
        """Σ w_i x_i / Σ w_i, in float32."""
        return (self.total / np.float32(self.weight)).astype(np.float32, copy=False)

    @property
    def nbytes(self) -> int:
        return int(self.total.nbytes) + 8

    def is_finite(self) -> Any:
        if isinstance(self.total, np.ndarray):
            return bool(np.isfinite(self.total).all()) and np.isfinite(self.weight)
        import torch  # a tensor sum exists only where torch is loaded

        return torch.isfinite(self.total).all()  # a client's weight n_i is a finite number

    def device_tensors(self) -> list[Any]:
        return [] if isinstance(self.total, np.ndarray) else [self.total]

    def with_host_arrays(self, arrays: Sequence[np.ndarray]) -> WeightedSum:
        return WeightedSum(np.asarray(arrays[0], dtype=np.float32), self.weight, self.count) if arrays else self


@dataclass
class ClientVectors(Contribution):
    """One row per uploading client (FedAWA's τ_k = θ_k − θ_g, or a whole model), with ids and sizes.

    For server halves that need each client's vector, not only their sum (FedAWA, FedAMP,
    CFL, ...). Rows are whole states (parameters, then buffers) unless the algorithm says
    otherwise. ``+`` concatenates, lazily: it joins the tuples of blocks, and :meth:`matrix`
    copies them into one (M, S) array once, on the server. Concatenation is associative; the row order (the merge order,
    fixed by the engine) changes results only by float rounding.
    """

    sum_is_one_part: ClassVar[bool] = False  # rows are concatenated: a partial sum grows with its clients

    blocks: tuple[np.ndarray, ...]
    client_ids: np.ndarray
    sizes: np.ndarray
    label_counts: np.ndarray | None = None
    """(M, K) training-label counts, one row per client, for methods whose clients reveal them
    (FedDisco); ``None`` when they are not uploaded (then they cost no bytes)."""

    @classmethod
    def of(
        cls, vector: np.ndarray, client_id: int, size: float, label_counts: np.ndarray | None = None
    ) -> ClientVectors:
        """One client's upload; ``label_counts`` (K,) only if the method sends them."""
        counts = None if label_counts is None else np.asarray(label_counts, np.int64)[None, :]
        return cls((vector[None, :],), np.array([client_id], np.int64), np.array([size], np.float64), counts)

    def __add__(self, other: ClientVectors) -> ClientVectors:
        if (self.label_counts is None) != (other.label_counts is None):
            raise ValueError("cannot add client vectors with label counts to client vectors without")
        counts = None
        if self.label_counts is not None and other.label_counts is not None:
            counts = np.concatenate([self.label_counts, other.label_counts])
        return ClientVectors(
            self.blocks + other.blocks,
            np.concatenate([self.client_ids, other.client_ids]),
            np.concatenate([self.sizes, other.sizes]),
            counts,
        )

    __iadd__ = __add__

    @property
    def count(self) -> int:
        return len(self.client_ids)

    def matrix(self) -> np.ndarray:
        """The (M, S) float32 matrix of client vectors; no copy when there is one block."""
        if len(self.blocks) == 1:
            return self.blocks[0]
        return np.concatenate(self.blocks, axis=0)

    def size_weighted_mean(self) -> np.ndarray:
        """Σ_k n_k x_k / Σ_k n_k over the rows (FedAvg's rule on stacked uploads), in float32."""
        sizes = np.asarray(self.sizes, np.float64)
        return ((sizes / sizes.sum()).astype(np.float32) @ self.matrix()).astype(np.float32)

    @property
    def nbytes(self) -> int:
        counts = 0 if self.label_counts is None else int(self.label_counts.nbytes)
        return sum(int(b.nbytes) for b in self.blocks) + int(self.client_ids.nbytes) + int(self.sizes.nbytes) + counts

    def is_finite(self) -> bool:
        return all(bool(np.isfinite(b).all()) for b in self.blocks) and bool(np.isfinite(self.sizes).all())


def sum_contributions(parts: Iterable[C | None]) -> C | None:
    """Left-to-right sum of the parts that are not ``None``; ``None`` if there are none."""
    total: C | None = None
    for part in parts:
        if part is None:
            continue
        if total is None:
            total = part
        else:
            total += part  # type: ignore[assignment]
    return total
