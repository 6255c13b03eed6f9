"""Whether two trainings of the same clients agree: one client at a time and stacked (``rayfed check``).

With ``engine.vectorize=on`` a worker trains a call's clients as one model as many times as wide; one client at a
time it trains each alone. Both run the same arithmetic, but a stack sums its convolutions in another order, so
they agree up to float rounding grown by training, never bit for bit. :func:`path_differences` names every way two
:class:`~rayfed.execution.reports.TrainResult` of the same call differ beyond that: a client's steps or its
acceptance, its loss or update norm (relative :data:`LOSS_RTOL`), the call's summed upload or a client's new
state (:func:`array_difference`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rayfed.execution.reports import TrainResult

__all__ = ["LOSS_RTOL", "LOSS_ATOL", "numbers", "array_difference", "path_differences", "largest_loss_difference"]

LOSS_RTOL = 1e-3
"""Relative tolerance of a client's reported loss and update norm."""
LOSS_ATOL = 1e-5
"""Absolute tolerance of the same, for values near 0."""
_MOST, _ALL = 1e-4, 1e-2
"""An array's entries agree when 99.9 % of them are within ``_MOST`` of its largest value, and all within ``_ALL``."""


def numbers(value: Any) -> list[np.ndarray]:
    """Every number an upload or a state holds, as float64 arrays in a fixed order (dict keys sorted, dataclass
    fields in order)."""
    if value is None:
        return []
    if isinstance(value, np.ndarray | np.generic | int | float):
        return [np.asarray(value, dtype=np.float64)]
    if isinstance(value, dict):
        return [a for key in sorted(value) for a in numbers(value[key])]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [a for f in dataclasses.fields(value) for a in numbers(getattr(value, f.name))]
    return []


def array_difference(a: np.ndarray, b: np.ndarray) -> str:
    """How ``a`` differs from ``b`` beyond float rounding grown by training, or "": the bulk of the entries must lie
    within 1e-4 of the array's largest value and every entry within 1e-2 (a stack sums its convolutions in another
    order than one client does, and where that flips a ReLU or a max-pool tie of a client, a few entries move
    further)."""
    if np.shape(a) != np.shape(b):
        return f"shapes {np.shape(a)} and {np.shape(b)}"
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    if not diff.size:
        return ""
    largest, bulk = float(diff.max()), float(np.quantile(diff, 0.999))
    if largest > _ALL * scale or bulk > _MOST * scale:
        return f"differ by up to {largest:.3g} (99.9 % within {bulk:.3g}) of values up to {scale:.3g}"
    return ""


def _near(a: float, b: float) -> bool:
    """``a`` within :data:`LOSS_RTOL` of ``b`` (or :data:`LOSS_ATOL` near 0), or both NaN."""
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= max(LOSS_ATOL, LOSS_RTOL * abs(b))


def path_differences(sequential: TrainResult, stacked: TrainResult) -> list[str]:
    """Every way the stacked training of a call differs from its one-client-at-a-time training, in words; empty
    when they agree."""
    found: list[str] = []
    for one, other in zip(sequential.reports, stacked.reports, strict=True):
        client = f"client {one.client_id}"
        if (one.steps, one.rejected) != (other.steps, other.rejected):
            found.append(
                f"{client}: {one.steps} steps ({one.rejected or 'accepted'}) one at a time, "
                f"{other.steps} ({other.rejected or 'accepted'}) stacked"
            )
        for what, a, b in (
            ("loss", one.train_loss, other.train_loss),
            ("update norm", one.update_norm, other.update_norm),
        ):
            if not _near(a, b):
                found.append(f"{client}: {what} {a:.6g} one at a time, {b:.6g} stacked")
    ours, theirs = numbers(sequential.contribution), numbers(stacked.contribution)
    if len(ours) != len(theirs):
        found.append(f"the upload holds {len(ours)} arrays one at a time, {len(theirs)} stacked")
    for index, (alone, stack) in enumerate(zip(ours, theirs)):
        if difference := array_difference(alone, stack):
            found.append(f"the summed upload's array {index}: {difference}")
    if sorted(sequential.states) != sorted(stacked.states):
        found.append(
            f"clients {sorted(sequential.states)} keep a state one at a time, {sorted(stacked.states)} stacked"
        )
    for cid in sorted(set(sequential.states) & set(stacked.states)):
        pairs = zip(numbers(sequential.states[cid]), numbers(stacked.states[cid]))
        for index, (alone, stack) in enumerate(pairs):
            if difference := array_difference(alone, stack):
                found.append(f"client {cid}'s state, array {index}: {difference}")
    return found


def largest_loss_difference(sequential: TrainResult, stacked: TrainResult) -> float:
    """The largest relative difference between a client's loss one at a time and stacked (0 without losses)."""
    relative = [
        abs(other.train_loss - one.train_loss) / max(abs(one.train_loss), LOSS_ATOL)
        for one, other in zip(sequential.reports, stacked.reports)
        if math.isfinite(one.train_loss) and math.isfinite(other.train_loss)
    ]
    return max(relative, default=0.0)
