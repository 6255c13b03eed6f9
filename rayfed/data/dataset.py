"""The in-memory dataset every rayfed component reads: uint8 images and int64 labels.

The driver loads a dataset once into plain numpy arrays, ``ray.put`` s it once, and
every worker on the node reads it zero-copy (README.md, "How it works": data plane). Images stay
uint8 so 70,000 MNIST images cost 55 MB, not 220 MB of float32; normalisation runs
per batch on the worker (:func:`rayfed.data.transforms.normalize_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.errors import DatasetError

__all__ = ["ArrayDataset"]


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A labelled image pool, checked once at construction.

    Parameters
    ----------
    name
        Registry name of the dataset (``"mnist"``, ``"synthetic"``, ...).
    images
        uint8 array of shape (N, C, H, W), C-contiguous (so ``ray.put`` shares it
        without a copy and batches slice into contiguous memory).
    labels
        int64 array of shape (N,) with values in ``[0, num_classes)``.
    num_classes
        K, the number of classes (also the width of the output layer).
    mean, std
        Per-channel statistics applied as ``(x / 255 - mean) / std``. PFLlib's
        generators use 0.5 for every channel.

    Raises
    ------
    DatasetError
        When a dtype, shape or label range is wrong; the message names the field.

    Notes
    -----
    Equality is identity (``eq=False``): comparing two datasets element-wise would
    touch every pixel and is never what a caller wants implicitly.
    """

    name: str
    images: np.ndarray
    labels: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        images, labels = self.images, self.labels
        if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4:
            raise DatasetError(
                f"dataset {self.name!r}: images must be a uint8 array of shape (N, C, H, W), "
                f"but got {_describe(images)}"
            )
        if not images.flags.c_contiguous:
            raise DatasetError(f"dataset {self.name!r}: images must be C-contiguous; pass np.ascontiguousarray(images)")
        if not isinstance(labels, np.ndarray) or labels.dtype != np.int64 or labels.ndim != 1:
            raise DatasetError(
                f"dataset {self.name!r}: labels must be an int64 array of shape (N,), but got {_describe(labels)}"
            )
        if len(labels) != len(images):
            raise DatasetError(f"dataset {self.name!r}: {len(images)} images but {len(labels)} labels")
        if self.num_classes < 1:
            raise DatasetError(
                f"dataset {self.name!r}: num_classes must be >= 1, but got num_classes={self.num_classes}"
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise DatasetError(
                f"dataset {self.name!r}: labels must lie in [0, {self.num_classes}), "
                f"but range over [{labels.min()}, {labels.max()}]"
            )
        channels = images.shape[1]
        if len(self.mean) != channels or len(self.std) != channels:
            raise DatasetError(
                f"dataset {self.name!r}: mean and std need one value per channel "
                f"({channels}), but got mean={self.mean}, std={self.std}"
            )
        if any(s <= 0 for s in self.std):
            raise DatasetError(f"dataset {self.name!r}: std must be > 0, but got std={self.std}")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image, what a model's first layer must accept."""
        _, c, h, w = self.images.shape
        return (int(c), int(h), int(w))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __repr__(self) -> str:
        return (
            f"ArrayDataset(name={self.name!r}, n={len(self)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes})"
        )


def _describe(array: object) -> str:
    if isinstance(array, np.ndarray):
        return f"dtype={array.dtype}, shape={array.shape}"
    return f"an object of type {type(array).__name__}"
