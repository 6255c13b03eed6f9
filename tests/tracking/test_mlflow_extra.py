"""The ``[mlflow]`` extra brings what reading runs back needs: ``mlflow.search_runs`` returns a pandas DataFrame,
so pandas is part of the extra (mlflow-skinny alone leaves it out)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_mlflow_extra_has_pandas() -> None:
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["mlflow"]
    names = {re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0] for requirement in extra}
    assert {"mlflow-skinny", "pandas"} <= names


def test_search_runs_reads_a_logged_run_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with mlflow.start_run():
            mlflow.log_metric("accuracy", 0.5, step=1)
        runs = mlflow.search_runs(experiment_ids=["0"])
    finally:
        mlflow.set_tracking_uri(previous)
    assert list(runs["metrics.accuracy"]) == [0.5]
