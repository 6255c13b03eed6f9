"""Reading device values on the host: one copy of a tensor, or many tensors in one transfer.

On a GPU every read waits for the work queued before it, so the training loop reads nothing, and
a worker call brings its numbers over once (:func:`to_host`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["host_copy", "to_host"]


def host_copy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy copy of ``tensor``, made in one copy from any device (the host memory is its own)."""
    host = tensor.detach().cpu()
    return host.numpy() if host.data_ptr() != tensor.data_ptr() else host.numpy().copy()


def to_host(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Host copies of ``tensors`` (of one device), brought over in one transfer: their bytes end to end in one buffer.

    >>> [a.tolist() for a in to_host([torch.tensor([1.5, 2.0]), torch.tensor(3), torch.tensor([True])])]
    [[1.5, 2.0], 3, [True]]
    """
    if not tensors:
        return []
    pieces = [t.detach().contiguous().reshape(-1) for t in tensors]
    buffer = host_copy(torch.cat([(p.to(torch.uint8) if p.dtype == torch.bool else p).view(torch.uint8)
                                  for p in pieces]))
    arrays, offset = [], 0
    for tensor, piece in zip(tensors, pieces):
        size = piece.numel() * piece.element_size()
        dtype: np.dtype[Any] = np.dtype(np.bool_) if tensor.dtype == torch.bool else _NUMPY[tensor.dtype]
        arrays.append(buffer[offset : offset + size].view(dtype).reshape(tuple(tensor.shape)))
        offset += size
    return arrays


_NUMPY: dict[torch.dtype, np.dtype[Any]] = {
    torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64), torch.float16: np.dtype(np.float16),
    torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32), torch.uint8: np.dtype(np.uint8),
}
"""The numpy dtype of each tensor dtype a worker brings to the host."""
