"""How many of a client's samples fall in each class, counted on their device without waiting for it.

``torch.bincount`` sizes its output from the largest label, which a GPU must send to the host first: one host sync
per call, which a worker's training call may not make (docs/architecture.md: a call reads the device back once).
Counting into a vector of the known number of classes needs no such read.
"""

from __future__ import annotations

import torch

__all__ = ["class_counts"]


def class_counts(labels: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """n_c for c < ``num_classes``: the number of entries of ``labels`` equal to c, as ``dtype`` on their device.

    >>> class_counts(torch.tensor([2, 0, 2]), 4).tolist()
    [1.0, 0.0, 2.0, 0.0]
    """
    counts = torch.zeros(num_classes, dtype=dtype, device=labels.device)
    return counts.index_add_(0, labels, torch.ones(labels.shape[0], dtype=dtype, device=labels.device))
