"""Moving values between the host and a worker's device: many tensors in one transfer each way.

On a GPU every read waits for the work queued before it, so the training loop reads nothing, and
a worker call brings its numbers over once (:func:`to_host`). The other way, every host-to-device
copy goes through :func:`to_device`: the host arrays are staged in page-locked memory and copied
without blocking, all of a call's pieces in one transfer.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["host_copy", "host_values", "to_host", "to_device", "read_only_tensor"]


def host_copy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy copy of ``tensor``, made in one copy from any device (the host memory is its own)."""
    host = tensor.detach().cpu()
    return host.numpy() if host.data_ptr() != tensor.data_ptr() else host.numpy().copy()


def host_values(tensor: torch.Tensor) -> np.ndarray:
    """The values of a tensor that lives on the host (a CPU generator's draw: batch orders, augmentation draws) as
    numpy, without a copy; a tensor on a device is refused, since reading it would make the host wait for the
    device (a worker's call reads the device once, :func:`to_host`)."""
    if tensor.device.type != "cpu":
        raise ValueError(f"host_values reads host tensors only, but got one on {tensor.device}; use to_host")
    return tensor.numpy()


def to_host(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Host copies of ``tensors`` (of one device), brought over in one transfer: their bytes end to end in one buffer.

    >>> [a.tolist() for a in to_host([torch.tensor([1.5, 2.0]), torch.tensor(3), torch.tensor([True])])]
    [[1.5, 2.0], 3, [True]]
    """
    if not tensors:
        return []
    pieces = [t.detach().contiguous().reshape(-1) for t in tensors]
    joined = torch.cat([(p.to(torch.uint8) if p.dtype == torch.bool else p).view(torch.uint8) for p in pieces])
    buffer = joined.numpy() if joined.device.type == "cpu" else host_copy(joined)  # the join is a copy already
    arrays, offset = [], 0
    for tensor, piece in zip(tensors, pieces):
        size = piece.numel() * piece.element_size()
        dtype: np.dtype[Any] = np.dtype(np.bool_) if tensor.dtype == torch.bool else _NUMPY[tensor.dtype]
        arrays.append(buffer[offset : offset + size].view(dtype).reshape(tuple(tensor.shape)))
        offset += size
    return arrays


def read_only_tensor(array: np.ndarray) -> torch.Tensor:
    """Wrap a numpy array without a copy, also a read-only one (Ray hands out object-store
    arrays read-only). Callers only read from the result, so torch's warning about
    non-writable arrays does not apply and is silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def to_device(arrays: Sequence[np.ndarray | torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` (host arrays or CPU tensors) as tensors on ``device``, in one non-blocking transfer.

    On a CPU device the tensors share the arrays' memory (no copy). On a GPU their bytes are laid end to
    end in one page-locked buffer from torch's caching host allocator (which keeps it until the copy is
    done) and copied over once; the host never waits for the device.

    >>> [t.tolist() for t in to_device([np.array([1, 2]), np.array([0.5], dtype=np.float32)], torch.device("cpu"))]
    [[1, 2], [0.5]]
    """
    tensors = [a if isinstance(a, torch.Tensor) else read_only_tensor(_contiguous(np.asarray(a))) for a in arrays]
    if device.type == "cpu" or not tensors:
        return tensors
    staged, starts = packed(tensors)
    return unpacked(staged.to(device, non_blocking=True), tensors, starts)


def packed(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """The bytes of ``tensors`` laid end to end in one page-locked buffer (where CUDA can lock pages), each starting
    on an 8-byte boundary so that it views as its own dtype; and where each starts. Empty tensors take no bytes.

    >>> staged, starts = packed([torch.tensor([1, 2]), torch.zeros(0), torch.tensor([True])])
    >>> staged.numel(), starts
    (24, [0, 16, 16, 24])
    """
    pieces = [_bytes(t) for t in tensors]
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + -(-piece.numel() // 8) * 8)
    staged = torch.empty(starts[-1], dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    for piece, start in zip(pieces, starts):
        staged[start : start + piece.numel()].copy_(piece)
    return staged, starts


def unpacked(staged: torch.Tensor, tensors: Sequence[torch.Tensor], starts: Sequence[int]) -> list[torch.Tensor]:
    """``tensors`` read back out of ``staged`` (:func:`packed`'s buffer, on any device): views of it, each with its
    tensor's dtype and shape.

    >>> values = [torch.tensor([1, 2]), torch.zeros(0, 3), torch.tensor(True), torch.tensor([0.5], dtype=torch.float16)]
    >>> staged, starts = packed(values)
    >>> [t.tolist() for t in unpacked(staged, values, starts)]
    [[1, 2], [], True, [0.5]]
    """
    out = []
    for tensor, start in zip(tensors, starts):
        if tensor.numel() == 0:
            out.append(torch.empty(tensor.shape, dtype=tensor.dtype, device=staged.device))
            continue
        raw = staged[start : start + tensor.numel() * _width(tensor)]
        out.append((raw.bool() if tensor.dtype == torch.bool else raw.view(tensor.dtype)).view(tensor.shape))
    return out


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values as a flat uint8 tensor (a bool as one byte each; an empty tensor as no bytes)."""
    if tensor.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    flat = (tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor).detach().contiguous().reshape(-1)
    return flat.view(torch.uint8)


def _width(tensor: torch.Tensor) -> int:
    """Bytes per element of ``tensor`` as :func:`packed` lays it out (one for a bool)."""
    return 1 if tensor.dtype == torch.bool else tensor.element_size()


def _contiguous(array: np.ndarray) -> np.ndarray:
    """``array`` in C order, copied only when it is not (``np.ascontiguousarray`` would make a 0-d array 1-d)."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


_NUMPY: dict[torch.dtype, np.dtype[Any]] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.uint8: np.dtype(np.uint8),
}
"""The numpy dtype of each tensor dtype a worker brings to the host."""
