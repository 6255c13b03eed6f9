"""Per-batch tensor transforms run on the worker (README.md, "How it works": data plane).

Images travel as uint8 and are normalised one whole batch at a time with tensor ops,
never per sample through PIL: three element-wise passes per batch instead of a PIL
round trip per image. Token sequences travel as int32 ids and become int64 on the device,
what ``nn.Embedding`` reads; they are not normalised. :func:`model_inputs` is the one entry
point the workers call, whatever the dataset's kind.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["model_inputs", "normalize_batch"]


def model_inputs(
    batch: np.ndarray | torch.Tensor,
    mean: Sequence[float] = (),
    std: Sequence[float] = (),
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The model's input tensor for ``batch``, rows of an :class:`~rayfed.data.ArrayDataset`'s inputs (an
    array, or a tensor of them already gathered, e.g. on a GPU).

    Images, uint8 (B, C, H, W): float32 ``(x / 255 - mean) / std`` (:func:`normalize_batch`).
    Token sequences, int32/int64 (B, L): int64 ids, moved as they are stored (int32: half
    the bytes) and widened on ``device``; ``mean`` and ``std`` are not used.

    >>> model_inputs(np.array([[2, 1, 0]], np.int32)).tolist()
    [[2, 1, 0]]
    >>> model_inputs(np.full((1, 1, 2, 2), 255, np.uint8), (0.5,), (0.5,)).unique().tolist()
    [1.0]
    """
    if isinstance(batch, torch.Tensor) and batch.ndim == 2 and batch.dtype in (torch.int32, torch.int64):
        return (batch if device is None else batch.to(device, non_blocking=True)).long()
    if isinstance(batch, np.ndarray) and batch.ndim == 2 and batch.dtype in (np.int32, np.int64):
        ids = torch.from_numpy(np.require(batch, requirements=["C", "W"]))  # copied only if read-only (Ray's store)
        if device is not None:
            ids = ids.to(device, non_blocking=True)
        return ids.long()
    return normalize_batch(batch, mean, std, device=device)


def normalize_batch(
    images_uint8: np.ndarray | torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Turn a uint8 batch (B, C, H, W) into float32 ``(x / 255 - mean) / std``.

    This is torchvision's ``ToTensor()`` followed by ``Normalize(mean, std)``, the test
    transform of PFLlib's generators (mean = std = 0.5 per channel), done on the whole
    batch with bit-identical results. A numpy batch is wrapped without a copy (read-only
    arrays from Ray's object store included); the result is a new tensor on ``device``
    (default: the input's, or CPU for numpy).

    Parameters
    ----------
    images_uint8
        uint8 batch of shape (B, C, H, W).
    mean, std
        One value per channel.
    device
        Where to compute; moving the uint8 batch first keeps the host-to-device copy 4x
        smaller than moving floats.

    Examples
    --------
    >>> x = np.full((2, 1, 2, 2), 255, dtype=np.uint8)
    >>> normalize_batch(x, (0.5,), (0.5,)).unique().tolist()
    [1.0]
    """
    if isinstance(images_uint8, np.ndarray):
        with warnings.catch_warnings():
            # torch warns when it wraps read-only memory (Ray's object store); the
            # wrapped batch is only read, into a new float tensor, so that is safe.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            images = torch.from_numpy(np.ascontiguousarray(images_uint8))
    else:
        images = images_uint8
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise ValueError(
            f"normalize_batch expects a uint8 batch of shape (B, C, H, W), but got "
            f"dtype={images.dtype}, shape={tuple(images.shape)}"
        )
    channels = images.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"need one mean and std per channel ({channels}), but got mean={mean}, std={std}")
    if device is not None:
        images = images.to(device, non_blocking=True)
    mean_t, std_t = _channel_constants(tuple(mean), tuple(std), images.device)
    # The same float32 operations, in the same order, as ToTensor() + Normalize(), so the
    # result is bit-identical to torchvision's per-sample pipeline.
    return images.to(torch.float32).div_(255.0).sub_(mean_t).div_(std_t)


_CONSTANTS: dict[tuple[tuple[float, ...], tuple[float, ...], torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _channel_constants(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean`` and ``std`` as (1, C, 1, 1) float32 tensors on ``device``, moved there once (a batch is normalised
    at every call of a worker: no copy from the host each time)."""
    key = (mean, std, device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = (
            torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1).to(device),
            torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1).to(device),
        )
    return _CONSTANTS[key]
