"""A paper's table as data: rows (methods with their params), columns (data, partition, model), values.

A :class:`Table` holds no code: each cell's config is the column's preset
(:mod:`rayfed.config.presets`) without its algorithm, then the table's and the column's settings,
then the row's algorithm, params and settings (and those it takes on the column's dataset
only, e.g. a number of clusters per dataset). :func:`cell_overrides` is the one place that
composes them, so every table is run the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rayfed.config.presets import preset_overrides

__all__ = [
    "PAPERS",
    "Row",
    "Column",
    "Table",
    "RowMetric",
    "cell_overrides",
    "paper_values",
    "papers_cited",
    "row_metric",
    "unavailable",
]

PAPERS = {
    "P-ICCV": 'G. Lee and D. Choi, "Class-Wise Federated Averaging for Efficient Personalization", ICCV 2025',
    "P-arXiv": 'G. Lee and D. Choi, "Regularizing and Aggregating Clients with Class Distribution for Personalized '
    'Federated Learning", arXiv:2406.07800 (the earlier version of P-ICCV)',
    "P-AWA": 'C. Shi et al., "FedAWA: Adaptive Optimization of Aggregation Weights in Federated Learning Using '
    'Client Vectors", CVPR 2025',
    "P-FCA": 'Jang et al., "FedClassAvg: Local Representation Learning for Personalized Federated Learning on '
    'Heterogeneous Neural Networks", ICPP 2022',
}
"""The papers the tables come from, by the short names the tables, reports and docs use."""

EVALUATED = ("personalised", "global", "local")
"""What a row may report: the clients' own models, the global model, or the clients' models right after local
training (docs/algorithms.md, "Data and evaluation", "Which model a row reports")."""
SELECTIONS = ("best", "lowest_test_loss")
"""Which round of a run is scored: its best, as the papers' logs report, or the round of its lowest test loss."""


def papers_cited(text: str) -> list[str]:
    """``"P-ICCV: <citation>"`` for each paper ``text`` names, in :data:`PAPERS`' order.

    >>> [line[:30] for line in papers_cited("P-AWA Table 1, beside P-ICCV")]
    ['P-ICCV: G. Lee and D. Choi, "C', 'P-AWA: C. Shi et al., "FedAWA:']
    """
    return [f"{name}: {citation}" for name, citation in PAPERS.items() if re.search(rf"\b{re.escape(name)}\b", text)]


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
    evaluates: str = ""
    """The model this row reports, one of :data:`EVALUATED`; "" = the one its algorithm evaluates clients with
    (its own models, or FedAvg's global model). The table's notes give the paper's reason where it is not that."""
    select: str = "best"
    """Which round is scored, one of :data:`SELECTIONS`."""
    choices: str = ""
    """The settings of this row that are choices rather than its reference's, as the report's header lists them."""

    def __post_init__(self) -> None:
        if self.evaluates and self.evaluates not in EVALUATED:
            raise ValueError(f"Row {self.key!r}: evaluates={self.evaluates!r} is not one of {EVALUATED} or ''")
        if self.select not in SELECTIONS:
            raise ValueError(f"Row {self.key!r}: select={self.select!r} is not one of {SELECTIONS}")


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
    """How the clients' accuracies are summed up: ``accuracy`` (pooled over their test samples, as the cwFedAvg and
    FedAWA papers) or ``acc_mean`` (their unweighted mean, as P-FCA); each row's model picks the column
    (:func:`row_metric`)."""
    scale: float = 100.0
    """Printed value = metric x scale (100: per cent, as the cwFedAvg and FedAWA papers; 1: fractions)."""
    paper_rounds: int = 0
    """Rounds the papers ran (0 = not stated)."""
    paper_seeds: int = 3
    """Seeds the papers' mean ± std is over (the cwFedAvg, FedAWA and FedClassAvg papers: 3)."""
    notes: str = ""

    def row(self, key: str) -> Row:
        return next(r for r in self.rows if r.key == key)

    def column(self, key: str) -> Column:
        return next(c for c in self.columns if c.key == key)


@dataclass(frozen=True)
class RowMetric:
    """What a row of a table reports: the model, the ``rounds.parquet`` column scored, and how a round is chosen."""

    model: str
    """One of :data:`EVALUATED`."""
    column: str
    """The ``rounds.parquet`` column scored."""
    loss_column: str
    """The ``rounds.parquet`` column of the test loss that ``select="lowest_test_loss"`` minimises."""
    select: str

    def describe(self) -> str:
        """E.g. "global model (`global_accuracy`), best round"."""
        rounds = "best round" if self.select == "best" else "round of lowest test loss"
        return f"{_MODEL_WORDS[self.model]} (`{self.column}`), {rounds}"


_MODEL_WORDS = {
    "personalised": "personalised models",
    "global": "global model",
    "local": "clients' models after local training",
}


_COLUMNS = {  # (table statistic, model) -> rounds.parquet column
    ("accuracy", "personalised"): "accuracy",
    ("acc_mean", "personalised"): "acc_mean",
    ("accuracy", "global"): "global_accuracy",
    ("acc_mean", "global"): "global_acc_mean",
    ("accuracy", "local"): "local_accuracy",
    ("acc_mean", "local"): "local_acc_mean",
}
_LOSS_COLUMNS = {"accuracy": "test_loss", "acc_mean": "test_loss_mean"}


def row_metric(table: Table, row: Row) -> RowMetric:
    """The model ``row`` reports and the column it is scored on.

    An algorithm that evaluates every client with its one global model (FedAvg; registered with
    ``Reporting.single_model``) reports that model in ``accuracy``; any other reports its clients' own models there and
    its global model, if it has one, in ``global_accuracy``. A single-model row cannot report personalised
    models, and the test loss that picks a round is that of the clients' own evaluation models.

    >>> t = Table("t", "", "", rows=(), columns=())
    >>> row_metric(t, Row("a", "FedAvg", "fedavg")).describe()
    'global model (`accuracy`), best round'
    >>> row_metric(t, Row("n", "FedNH", "fednh", evaluates="global")).column
    'global_accuracy'
    """
    from rayfed.algorithms import ALGORITHMS

    if table.metric not in _LOSS_COLUMNS:
        raise ValueError(f"Table {table.name!r}: metric={table.metric!r} is not one of {tuple(_LOSS_COLUMNS)}")
    single = ALGORITHMS.get(row.algorithm).reporting.single_model if row.algorithm in ALGORITHMS.names() else False
    model = row.evaluates or ("global" if single else "personalised")
    if single and model == "personalised":
        raise ValueError(
            f"Row {row.key!r}: {row.algorithm} evaluates every client with its global model; "
            "it has no personalised models to report"
        )
    column = table.metric if single and model == "global" else _COLUMNS[(table.metric, model)]
    if row.select == "lowest_test_loss" and model != ("global" if single else "personalised"):
        raise ValueError(
            f"Row {row.key!r}: the test loss is that of the clients' evaluation models, so "
            f"select='lowest_test_loss' cannot score the {model} model"
        )
    return RowMetric(model, column, _LOSS_COLUMNS[table.metric], row.select)


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
    if row_metric(table, row).model == "local":  # the clients' models after local training are measured on request
        values["engine.eval_local"] = True
    return values


def unavailable(overrides: Mapping[str, Any]) -> str:
    """Why a cell cannot run in this version ("" if it can): an algorithm, dataset or model not registered."""
    from rayfed.algorithms import ALGORITHMS
    from rayfed.data import DATASETS
    from rayfed.models import MODELS

    wanted = [
        ("algorithm", overrides.get("algorithm.name"), ALGORITHMS.names()),
        ("algorithm", overrides.get("algorithm.client"), ALGORITHMS.names()),
        ("dataset", overrides.get("data.dataset"), DATASETS.names()),
        ("model", overrides.get("model.name"), MODELS.names()),
    ]
    wanted += [("model", m, MODELS.names()) for m in overrides.get("model.client_models", ())]
    for kind, name, known in wanted:
        if name is not None and name not in known:
            return f"{kind} {name} not available in this version"
    return ""
