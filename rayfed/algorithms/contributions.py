"""Uploads that add: the sufficient statistics of weighted averaging.

A worker sums the contributions of its batch of clients before returning (local
aggregation), and the server sums the workers' partial sums, so what the server
receives grows with the number of workers, not clients. Partial sums are merged in a
fixed order (by batch), so a run is bit-for-bit reproducible whatever worker ran what.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from rayfed.algorithms.base import Contribution

__all__ = ["WeightedSum", "sum_contributions"]

C = TypeVar("C", bound=Contribution)


@dataclass
class WeightedSum(Contribution):
    """Σ_i w_i x_i and Σ_i w_i: FedAvg's sufficient statistics (Flower/pfl ``WeightedStatistics``)."""

    total: np.ndarray
    weight: float
    count: int = 1

    @classmethod
    def of(cls, vector: np.ndarray, weight: float) -> WeightedSum:
        """The contribution of one client: its vector scaled by its weight (n_i for FedAvg)."""
        return cls(vector * np.float32(weight), float(weight), 1)

    def __add__(self, other: WeightedSum) -> WeightedSum:
        return WeightedSum(self.total + other.total, self.weight + other.weight, self.count + other.count)

    def __iadd__(self, other: WeightedSum) -> WeightedSum:
        if not self.total.flags.writeable:  # arrays read zero-copy from Ray's object store
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

    def is_finite(self) -> bool:
        return bool(np.isfinite(self.total).all()) and np.isfinite(self.weight)


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
