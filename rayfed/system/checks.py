"""The one check of the system model's per-client numbers: speeds, bandwidths and periods are finite and > 0.

>>> first_not_positive(np.array([1.0, 2.5, -1.0, np.inf])), first_not_positive(np.array([1.0]))
(2, None)
"""

from __future__ import annotations

import numpy as np

__all__ = ["first_not_positive"]


def first_not_positive(values: np.ndarray) -> int | None:
    """The index of the first value that is not a finite number > 0, or None if there is none."""
    bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
    return int(bad[0]) if len(bad) else None
