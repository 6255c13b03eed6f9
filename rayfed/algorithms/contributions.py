"""Uploads that add: the sufficient statistics of weighted averaging.

A worker sums the contributions of its batch of clients before returning (local
aggregation), and the server sums the workers' partial sums, so what the server
receives grows with the number of workers, not clients. Partial sums are merged along a
fixed tree over the batches (:mod:`rayfed.execution.summation`), so a run is bit-for-bit reproducible
whatever worker or node ran what; on a cluster, each node adds up the subtrees of the batches it ran.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

__all__ = [
    "Contribution",
    "WeightedSum",
    "WeightedState",
    "ClientVectors",
    "row_square_norms",
    "sum_contributions",
    "join",
    "as_float32",
]

C = TypeVar("C", bound="Contribution")


def _is_tensor(value: Any) -> bool:
    """A torch tensor (told apart without importing torch: the server never does)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "device")


class Contribution(abc.ABC):
    """An upload that adds: ``(a + b) + c == a + (b + c)`` and ``a + b == b + a`` up to float rounding.

    A contribution is a dataclass of arrays (and numbers). While a worker's call runs, its arrays may be tensors
    on the worker's device (a GPU); the worker sums the call's contributions there and brings the sum to the
    host once, with every other value of the call (:meth:`device_tensors`, :meth:`with_host_arrays`, which find
    the tensors among the fields themselves). A sum is finite only when every part is: the worker checks the
    call's sum, and the parts only when it is not.
    """

    sum_is_one_part: ClassVar[bool] = True
    """True if a sum of parts takes the bytes of one part (a sum, not a concatenation). The summation tree adds
    and joins alike (:mod:`rayfed.execution.summation`): a node's joined rows are as large as its calls' parts."""

    @abc.abstractmethod
    def __add__(self, other: Any) -> Contribution: ...

    @property
    def nbytes(self) -> int:
        """Bytes this contribution takes on the wire: its arrays, and 8 per float field (a weight, a mass)."""
        total = 0
        for value in _leaves(self):
            if isinstance(value, float):
                total += 8
            elif isinstance(value, np.ndarray):
                total += int(value.nbytes)
            elif _is_tensor(value):
                total += int(value.numel()) * int(value.element_size())
        return total

    def is_finite(self) -> Any:
        """False if any value is NaN or infinite (such an update is never aggregated): a bool, or a 0-d bool
        tensor while the contribution lives on a device."""
        checks: list[Any] = []
        for value in _leaves(self):
            if isinstance(value, float):
                checks.append(bool(np.isfinite(value)))
            elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
                checks.append(bool(np.isfinite(value).all()))
            elif _is_tensor(value) and value.is_floating_point():
                checks.append(value.isfinite().all())
        on_device = [c for c in checks if not isinstance(c, bool)]
        if not all(c for c in checks if isinstance(c, bool)):
            return False
        if not on_device:
            return True
        result = on_device[0]
        for check in on_device[1:]:
            result = result & check
        return result

    def device_tensors(self) -> list[Any]:
        """The tensors of this contribution that live on a device, in field order; none for one on the host."""
        return [value for value in _leaves(self) if _is_tensor(value)]

    def with_host_arrays(self, arrays: Sequence[np.ndarray]) -> Contribution:
        """This contribution with :meth:`device_tensors` replaced by ``arrays``, their host copies in order."""
        if not arrays:
            return self
        return _replaced(self, iter(arrays))


def _leaves(value: Any) -> Iterator[Any]:
    """The arrays, tensors and numbers of a contribution, in field order (nested contributions and tuples too)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _leaves(getattr(value, field.name))
    elif isinstance(value, tuple):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, np.ndarray | float) or _is_tensor(value):
        yield value


def _replaced(value: Any, arrays: Iterator[np.ndarray]) -> Any:
    """``value`` with its device tensors replaced by the next of ``arrays``, in field order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _replaced(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(_replaced(item, arrays) for item in value)
    if _is_tensor(value):
        return next(arrays)
    return value


def join(a: Any, b: Any) -> Any:
    """``a`` and ``b`` joined along their first axis: numpy arrays (the server's), or tensors of one device (a
    worker's, while its call sums its clients' uploads there); None if either is None."""
    if a is None or b is None:
        return None
    if isinstance(a, np.ndarray):
        return np.concatenate([a, b])
    import torch  # a tensor upload exists only where torch is loaded

    return torch.cat([a, b])


def as_float32(a: Any) -> Any:
    """``a`` (a numpy array or a tensor) in float32."""
    return a.astype(np.float32) if isinstance(a, np.ndarray) else a.float()


@dataclass
class WeightedSum(Contribution):
    """Σ_i w_i x_i and Σ_i w_i: FedAvg's sufficient statistics (Flower/pfl ``WeightedStatistics``).

    On a worker the sum may be a tensor on its device, which the call reads back once, with its other values,
    as the numpy array the server aggregates.
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


@dataclass(frozen=True)
class WeightedState:
    """An upload declared as data: the client's trained state (the slices ``parts`` of it, concatenated in order; all
    of it without parts) weighted by its training samples n_i (or 1: :attr:`unit_weights`), FedAvg's upload. A
    client half returns it from ``upload``; the worker makes the :class:`WeightedSum` for one client, or for a
    stack of clients in one matrix product of their sizes and states, and reads no client's model for it."""

    parts: tuple[slice, ...] = ()
    unit_weights: bool = False
    """Every client weighted 1 instead of n_i (an unweighted mean: FedDyn's ``paper`` fidelity)."""

    def of_one(self, state: Any, size: int) -> WeightedSum:
        """One client's upload from its trained ``state``."""
        return WeightedSum.of(self.selected(state), 1 if self.unit_weights else size)

    def of_stack(self, states: Any, sizes: Sequence[int]) -> WeightedSum:
        """The sum of a stack's uploads from its clients' trained ``states`` (C, S): Σ_i n_i θ_i as one product."""
        from rayfed.train.host import to_device  # a worker's: the server never builds uploads

        sizes = [1] * len(sizes) if self.unit_weights else sizes
        weights = to_device([np.asarray(sizes, dtype=np.float32)], states.device)[0]
        return WeightedSum(weights @ self.selected(states), float(sum(sizes)), len(sizes))

    def selected(self, state: Any) -> Any:
        """The uploaded columns of ``state`` (one client's (S,) or a stack's (C, S)): the parts, concatenated."""
        if not self.parts:
            return state
        import torch

        return torch.cat([state[..., part] for part in self.parts], dim=-1)


@dataclass
class ClientVectors(Contribution):
    """One row per uploading client (FedAWA's τ_k = θ_k − θ_g, or a whole model), with ids and sizes.

    For server halves that need each client's vector, not only their sum (FedAWA, FedAMP,
    CFL, ...). Rows are whole states (parameters, then buffers) unless the algorithm says
    otherwise. ``+`` concatenates, lazily: it joins the tuples of blocks (on a worker, tensors on its device,
    read back once with the call), and :meth:`matrix` copies them into one (M, S) array once, on the server.
    Concatenation is associative; the row order (the merge order, fixed by the engine) changes results only by
    float rounding.
    """

    sum_is_one_part: ClassVar[bool] = False  # rows are concatenated: a partial sum grows with its clients

    blocks: tuple[Any, ...]
    """(rows, S) arrays, or tensors on a worker's device."""
    client_ids: np.ndarray
    sizes: np.ndarray
    label_counts: np.ndarray | None = None
    """(M, K) training-label counts, one row per client, for methods whose clients reveal them
    (FedDisco); ``None`` when they are not uploaded (then they cost no bytes)."""
    norm_slices: tuple[slice, ...] = ()
    """Column ranges whose squared norms the server reads (FedAWA's ‖τ_k,l‖² per group l); the
    worker computes them, in parallel with the other workers, once the rows are on its host."""
    square_norms: np.ndarray | None = None
    """(M, len(norm_slices)) float32 :func:`row_square_norms` of the rows; ``None`` until read back, or when no
    ranges were asked for."""

    @classmethod
    def of(
        cls,
        vector: Any,
        client_id: int,
        size: float,
        label_counts: np.ndarray | None = None,
        norm_slices: tuple[slice, ...] = (),
    ) -> ClientVectors:
        """One client's upload (its vector: a numpy array, or a tensor it owns on the worker's device);
        ``label_counts`` (K,) only if the method sends them; ``norm_slices`` the ranges whose squared norms
        the server reads."""
        counts = None if label_counts is None else np.asarray(label_counts, np.int64)[None, :]
        ids, sizes = np.array([client_id], np.int64), np.array([size], np.float64)
        upload = cls((vector[None, :],), ids, sizes, counts, norm_slices)
        return upload.with_square_norms() if isinstance(vector, np.ndarray) else upload

    def __add__(self, other: ClientVectors) -> ClientVectors:
        if self.norm_slices != other.norm_slices:
            raise ValueError("cannot add client vectors whose squared norms cover different ranges")
        return ClientVectors(
            self.blocks + other.blocks,
            np.concatenate([self.client_ids, other.client_ids]),
            np.concatenate([self.sizes, other.sizes]),
            _rows_of_both(self.label_counts, other.label_counts, "label counts"),
            self.norm_slices,
            _rows_of_both(self.square_norms, other.square_norms, "squared norms"),
        )

    __iadd__ = __add__

    def with_host_arrays(self, arrays: Sequence[np.ndarray]) -> ClientVectors:
        """The rows on the host, and their squared norms over ``norm_slices`` made there."""
        host = super().with_host_arrays(arrays)
        assert isinstance(host, ClientVectors)
        return host.with_square_norms()

    def with_square_norms(self) -> ClientVectors:
        """This upload with :attr:`square_norms` of its host rows, if asked for and not made yet."""
        if not self.norm_slices or self.square_norms is not None:
            return self
        norms = [row_square_norms(block, self.norm_slices) for block in self.blocks]
        return dataclasses.replace(self, square_norms=np.concatenate(norms))

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


def _rows_of_both(a: np.ndarray | None, b: np.ndarray | None, what: str) -> np.ndarray | None:
    """The rows of ``a`` then those of ``b``; None if both are None."""
    if (a is None) != (b is None):
        raise ValueError(f"cannot add client vectors with {what} to client vectors without")
    return None if a is None or b is None else np.concatenate([a, b])


def row_square_norms(rows: np.ndarray, slices: Sequence[slice]) -> np.ndarray:
    """(M, L) float32: ‖r_k[s]‖² of every row r_k (M, S) over every column range s of ``slices``.

    Each is one BLAS dot product of the row with itself, which reads no other row: a worker's rows give the
    bits the server would get from the whole matrix.

    >>> row_square_norms(np.array([[1.0, 2.0, 2.0]], np.float32), [slice(0, 3), slice(1, 2)]).tolist()
    [[9.0, 4.0]]
    """
    out = np.empty((rows.shape[0], len(slices)), np.float32)
    for group, columns in enumerate(slices):
        part = rows[:, columns]
        out[:, group] = np.matmul(part[:, None, :], part[:, :, None])[:, 0, 0]
    return out


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
