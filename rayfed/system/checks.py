"""The one check of the system model's per-client numbers: speeds, bandwidths and periods are finite and > 0.

>>> first_not_positive(np.array([1.0, 2.5, -1.0, np.inf])), first_not_positive(np.array([1.0]))
(2, None)
"""

from __future__ import annotations

import numpy as np

from rayfed.util.errors import ConfigError

__all__ = ["first_not_positive", "refuse_not_positive"]


def first_not_positive(values: np.ndarray) -> int | None:
    """The index of the first value that is not a finite number > 0, or None if there is none."""
    bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
    return int(bad[0]) if len(bad) else None


def refuse_not_positive(values: np.ndarray, source: str, column: str) -> None:
    """ConfigError naming ``source`` (a field, or a field and its file), the first client whose ``column`` is not a
    finite number > 0, and the fix."""
    client = first_not_positive(values)
    if client is not None:
        raise ConfigError(
            f"{source}: client {client}'s {column} is {float(values[client])!r}; it must be a finite number > 0 "
            "(speeds and bandwidths are positive)"
        )
