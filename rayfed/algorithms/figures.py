"""The figures a method draws from a finished run, as data: the method says what to show (its
server half's :meth:`~rayfed.algorithms.hooks.ServerHalf.figures`), ``rayfed plot`` draws it
(:mod:`rayfed.results.plots`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rayfed.train.problem import ProblemSpec

__all__ = ["FinishedRun", "Heatmap", "DistributionPairs", "Figure"]


@dataclass(frozen=True)
class FinishedRun:
    """What a method's figures read from a finished run directory."""

    server: Mapping[str, np.ndarray]
    """The server half's state in the newest checkpoint (``ServerHalf.state_dict``)."""
    label_counts: np.ndarray
    """(M, K) each client's class counts over its whole partition."""
    train_label_counts: np.ndarray
    """(M, K) the same over its training split."""
    spec: ProblemSpec
    """The run's problem, rebuilt without data (layouts, blocks, output layers)."""


@dataclass(frozen=True)
class Heatmap:
    """A matrix of values, one row per ``rows`` (clients, class models), one column per class."""

    name: str
    """The figure's file suffix: ``<run>-<name>.png``."""
    values: np.ndarray
    rows: str
    title: str


@dataclass(frozen=True)
class DistributionPairs:
    """Each client's class distribution ``p`` beside an estimate ``estimate`` of it, both (N, K)."""

    name: str
    p: np.ndarray
    estimate: np.ndarray
    client_ids: tuple[int, ...]
    """The client of each row."""
    estimate_label: str
    title: str


Figure = Heatmap | DistributionPairs
