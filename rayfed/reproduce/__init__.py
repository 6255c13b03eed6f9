"""``rayfed reproduce TABLE``: the seeds' papers' tables, declared as data, run and reported.

    rayfed reproduce cwfedavg-mnist --data-root ~/data --rounds 30 --seeds 5 --at-rounds 1,5,10,20,30
    rayfed reproduce --list

:mod:`rayfed.reproduce.spec` says what a table is (rows = methods with their params, columns =
dataset, partition, clients and model on a paper's preset), :mod:`rayfed.reproduce.tables_cwfedavg`,
:mod:`rayfed.reproduce.tables_fedawa` and :mod:`rayfed.reproduce.tables_fedclassavg` declare the tables,
:mod:`rayfed.reproduce.runner` runs (resumes, extends, skips) their cells, and :mod:`rayfed.reproduce.report`
writes the Markdown and the figures. See README.md, "Results".
"""

from __future__ import annotations

from rayfed.reproduce.spec import Column, Row, Table
from rayfed.reproduce.tables_cwfedavg import CWFEDAVG_TABLES
from rayfed.reproduce.tables_fedawa import FEDAWA_TABLES
from rayfed.reproduce.tables_fedclassavg import FEDCLASSAVG_TABLES

__all__ = ["TABLES", "Table", "Row", "Column"]

TABLES: dict[str, Table] = {t.name: t for t in (*CWFEDAVG_TABLES, *FEDAWA_TABLES, *FEDCLASSAVG_TABLES)}
"""Every declared table by name (``rayfed reproduce --list``)."""
