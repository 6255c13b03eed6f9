"""The in-memory dataset every rayfed component reads: uint8 images or int32 token ids, and int64 labels.

The driver loads a dataset once into plain numpy arrays, ``ray.put`` s it once, and
every worker on the node reads it zero-copy (README.md, "How it works": data plane). Images stay
uint8 so 70,000 MNIST images cost 55 MB, not 220 MB of float32; normalisation runs
per batch on the worker (:func:`rayfed.data.transforms.model_inputs`).

Two kinds of input, told apart by the array's shape (:attr:`ArrayDataset.kind`):

* ``"image"``: uint8 (N, C, H, W), normalised per channel with ``mean`` and ``std``;
  the input shape is (C, H, W).
* ``"tokens"``: integer (N, L) token ids into ``vocabulary`` (0 = padding), fixed length L,
  fed to the model as they are; the input shape is (L, V), the shape of the one-hot
  sequence the ids stand for, so a model learns both its sequence length and its vocabulary
  size V from it (:mod:`rayfed.models.text`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.util.errors import DatasetError

__all__ = ["IMAGE", "TOKENS", "ArrayDataset"]

IMAGE = "image"
"""Kind of a dataset of uint8 images (N, C, H, W)."""
TOKENS = "tokens"
"""Kind of a dataset of fixed-length token-id sequences (N, L)."""


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A labelled pool of images or token sequences, checked once at construction.

    Parameters
    ----------
    name
        Registry name of the dataset (``"mnist"``, ``"synthetic"``, ``"ag_news"``, ...).
    inputs
        Images: a uint8 array of shape (N, C, H, W). Token sequences: an int32 or int64
        array of shape (N, L) with ids in ``[0, len(vocabulary))``. C-contiguous (so
        ``ray.put`` shares it without a copy and batches slice into contiguous memory).
    labels
        int64 array of shape (N,) with values in ``[0, num_classes)``.
    num_classes
        K, the number of classes (also the width of the output layer).
    mean, std
        Images: per-channel statistics applied as ``(x / 255 - mean) / std`` (PFLlib's
        generators use 0.5 for every channel). Token sequences: empty.
    vocabulary
        Token sequences: the token of every id, id 0 the padding token. The engine saves
        it with the run (:func:`rayfed.data.text.save_vocabulary`). Images: empty.

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
    inputs: np.ndarray
    labels: np.ndarray
    num_classes: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    vocabulary: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        inputs, labels = self.inputs, self.labels
        if self.kind == IMAGE:
            self._check_image()
        elif self.kind == TOKENS:
            self._check_tokens()
        else:
            raise DatasetError(
                f"dataset {self.name!r}: inputs must be a uint8 array of images with shape (N, C, H, W) "
                f"or an integer array of token ids with shape (N, L), but got {_describe(inputs)}"
            )
        if not inputs.flags.c_contiguous:
            raise DatasetError(f"dataset {self.name!r}: inputs must be C-contiguous; pass np.ascontiguousarray(inputs)")
        if not isinstance(labels, np.ndarray) or labels.dtype != np.int64 or labels.ndim != 1:
            raise DatasetError(
                f"dataset {self.name!r}: labels must be an int64 array of shape (N,), but got {_describe(labels)}"
            )
        if len(labels) != len(inputs):
            raise DatasetError(f"dataset {self.name!r}: {len(inputs)} inputs but {len(labels)} labels")
        if self.num_classes < 1:
            raise DatasetError(
                f"dataset {self.name!r}: num_classes must be >= 1, but got num_classes={self.num_classes}"
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise DatasetError(
                f"dataset {self.name!r}: labels must lie in [0, {self.num_classes}), "
                f"but range over [{labels.min()}, {labels.max()}]"
            )

    def _check_image(self) -> None:
        channels = self.inputs.shape[1]
        if len(self.mean) != channels or len(self.std) != channels:
            raise DatasetError(
                f"dataset {self.name!r}: mean and std need one value per channel "
                f"({channels}), but got mean={self.mean}, std={self.std}"
            )
        if any(s <= 0 for s in self.std):
            raise DatasetError(f"dataset {self.name!r}: std must be > 0, but got std={self.std}")
        if self.vocabulary:
            raise DatasetError(f"dataset {self.name!r}: an image dataset has no vocabulary")

    def _check_tokens(self) -> None:
        inputs, size = self.inputs, len(self.vocabulary)
        if size < 2:
            raise DatasetError(
                f"dataset {self.name!r}: token sequences need a vocabulary of at least 2 tokens "
                f"(padding and one more), but got {size}"
            )
        if inputs.shape[1] < 1:
            raise DatasetError(
                f"dataset {self.name!r}: token sequences need length L >= 1, but got {_describe(inputs)}"
            )
        if inputs.size and (inputs.min() < 0 or inputs.max() >= size):
            raise DatasetError(
                f"dataset {self.name!r}: token ids must lie in [0, {size}) (the vocabulary's size), "
                f"but range over [{inputs.min()}, {inputs.max()}]"
            )
        if self.mean or self.std:
            raise DatasetError(f"dataset {self.name!r}: token sequences are not normalised; leave mean and std empty")

    @property
    def kind(self) -> str:
        """``"image"`` for uint8 (N, C, H, W) inputs, ``"tokens"`` for integer (N, L) ones, else ``""``."""
        inputs = self.inputs
        if not isinstance(inputs, np.ndarray):
            return ""
        if inputs.dtype == np.uint8 and inputs.ndim == 4:
            return IMAGE
        if inputs.dtype in (np.int32, np.int64) and inputs.ndim == 2:
            return TOKENS
        return ""

    @property
    def images(self) -> np.ndarray:
        """The inputs of an image dataset, under the name image code reads them by."""
        return self.inputs

    @property
    def input_shape(self) -> tuple[int, ...]:
        """What a model's first layer must accept: (C, H, W) of one image, or (L, V) of one token sequence."""
        if self.kind == TOKENS:
            return (int(self.inputs.shape[1]), len(self.vocabulary))
        _, c, h, w = self.inputs.shape
        return (int(c), int(h), int(w))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __repr__(self) -> str:
        return (
            f"ArrayDataset(name={self.name!r}, n={len(self)}, kind={self.kind!r}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes})"
        )


def _describe(array: object) -> str:
    if isinstance(array, np.ndarray):
        return f"dtype={array.dtype}, shape={array.shape}"
    return f"an object of type {type(array).__name__}"
