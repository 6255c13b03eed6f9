"""A paper's table as data: rows (methods with their params), columns (data, partition, model), values.

A :class:`Table` holds no code: each cell's config is the column's preset
(:mod:`rayfed.config.presets`) without its algorithm, then the table's and the column's settings,
then the row's algorithm, params and settings (and those it takes on the column's dataset
only, e.g. a number of clusters per dataset). :func:`cell_overrides` is the one place that
composes them, so every table is run the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rayfed.config.presets import preset_overrides

__all__ = ["Row", "Column", "Table", "cell_overrides", "paper_values", "unavailable"]


def paper_values(keys: tuple[str, ...], values: str) -> dict[str, str]:
    """Column key -> printed value, from a space-separated line of a paper's table ('-' = not reported).

    >>> paper_values(("a", "b", "c"), "98.1 - 99.5±0.1")
    {'a': '98.1', 'c': '99.5±0.1'}
    """
    return {k: v for k, v in zip(keys, values.split()) if v != "-"}


@dataclass(frozen=True)
class Row:
    """One method of a table: a registered algorithm with its params, and the papers' values per column."""

    key: str
    """Short name, unique in the table (``--methods``)."""
    label: str
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    """``algorithm.params.*`` of this row."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Other dotted config values of this row (``algorithm.client``, ``train.*``, ...)."""
    per_dataset: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Dotted config values this row takes on one dataset only (dataset name -> values)."""
    paper: Mapping[str, str] = field(default_factory=dict)
    """The papers' value per column key, as printed there."""


@dataclass(frozen=True)
class Column:
    """One setting of a table: a preset and what the column changes in it (dataset, partition, clients, model)."""

    key: str
    """Short name, unique in the table (``--columns``)."""
    label: str
    preset: str
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Table:
    """One of the seeds' tables, declared once: what ``rayfed reproduce NAME`` runs and reports."""

    name: str
    title: str
    source: str
    """Which paper and table the values come from."""
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Dotted config values of every cell (after the preset, before column and row)."""
    metric: str = "accuracy"
    """The ``rounds.parquet`` column scored: ``accuracy`` (pooled), ``acc_mean`` (unweighted), ..."""
    scale: float = 100.0
    """Printed value = metric x scale (100: per cent, as the cwFedAvg and FedAWA papers; 1: fractions)."""
    paper_rounds: int = 0
    """Rounds the papers ran (0 = not stated)."""
    notes: str = ""

    def row(self, key: str) -> Row:
        return next(r for r in self.rows if r.key == key)

    def column(self, key: str) -> Column:
        return next(c for c in self.columns if c.key == key)


def cell_overrides(table: Table, row: Row, column: Column) -> dict[str, Any]:
    """The dotted config of cell (row, column) without seed, rounds and run directory.

    The preset's ``algorithm.*`` values belong to the preset's algorithm, so they are dropped
    unless the row runs that algorithm (then its defaults for the dataset, e.g. cwFedAvg's
    lambda per dataset, are kept under the row's own params).
    """
    preset = preset_overrides(column.preset)
    same = preset.get("algorithm.name") == row.algorithm
    values = {k: v for k, v in preset.items() if same or not k.startswith("algorithm.")}
    values.update(table.settings)
    values.update(column.settings)
    values["algorithm.name"] = row.algorithm
    values.update({f"algorithm.params.{k}": v for k, v in row.params.items()})
    values.update(row.settings)
    dataset = values.get("data.dataset")
    values.update(row.per_dataset.get(str(dataset), {}))
    return values


def unavailable(overrides: Mapping[str, Any]) -> str:
    """Why a cell cannot run in this version ("" if it can): an algorithm, dataset or model not registered."""
    from rayfed.algorithms import ALGORITHMS
    from rayfed.data import DATASETS
    from rayfed.models import MODELS

    wanted = [("algorithm", overrides.get("algorithm.name"), ALGORITHMS.names()),
              ("algorithm", overrides.get("algorithm.client"), ALGORITHMS.names()),
              ("dataset", overrides.get("data.dataset"), DATASETS.names()),
              ("model", overrides.get("model.name"), MODELS.names())]
    wanted += [("model", m, MODELS.names()) for m in overrides.get("model.client_models", ())]
    for kind, name, known in wanted:
        if name is not None and name not in known:
            return f"{kind} {name} not available in this version"
    return ""
