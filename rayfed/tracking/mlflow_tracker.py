"""MLflow: the run as an MLflow run, written through ``mlflow.MlflowClient``.

Where: the tracking server or store ``MLFLOW_TRACKING_URI`` names, else an SQLite store beside the run
(``sqlite:///<run_dir>/mlflow.db``; a study's trials share ``<study_dir>/mlflow.db``), with artifacts (the
figures) in ``mlartifacts/`` beside it: ``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db``.
The experiment is ``MLFLOW_EXPERIMENT_NAME``, else ``rayfed`` (a study's: the study's name). An Optuna
study is a run of its own, and each trial a run nested in it (:func:`study_run`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus

from rayfed.engine.callbacks import RunView
from rayfed.tracking.registry import StudyLink
from rayfed.tracking.tracker import RoundPoint, Tracker

__all__ = ["MlflowTracker", "study_run", "tracking_uri"]

_BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow accepts at most 1000)."""
_PARAM_CHARS = 6000
"""The longest parameter value MLflow stores."""


def tracking_uri(folder: Path) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the SQLite store in ``folder``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder.resolve() / 'mlflow.db'}"


def _experiment(client: MlflowClient, name: str, folder: Path) -> str:
    """The id of experiment ``name``, made (artifacts in ``folder/mlartifacts`` for a local store) if new."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    local = not os.environ.get("MLFLOW_TRACKING_URI")
    artifacts = (folder.resolve() / "mlartifacts").as_uri() if local else None
    return str(client.create_experiment(name, artifact_location=artifacts))


def study_run(study_name: str, study_dir: Path, params: Mapping[str, Any]) -> str:
    """The id of the Optuna study's own MLflow run (made on the study's first session), in which every trial's
    run is nested; ``params``: the base config's and the search space's."""
    client = MlflowClient(tracking_uri(study_dir))
    experiment = _experiment(client, os.environ.get("MLFLOW_EXPERIMENT_NAME") or study_name, study_dir)
    found = client.search_runs([experiment], filter_string=f"tags.`rayfed.study` = '{study_name}'", max_results=1)
    if found:
        return str(found[0].info.run_id)
    run = client.create_run(experiment, run_name=study_name, tags={"rayfed.study": study_name})
    client.log_batch(run.info.run_id, params=_params(params))
    return str(run.info.run_id)


class MlflowTracker(Tracker):
    """Params from the config, one metric history per ``rounds.parquet`` column, figures as artifacts. MLflow
    keeps no histograms. A resumed run logs into the same MLflow run (its id in ``tracking.json``)."""

    name = "mlflow"

    def __init__(self, run: RunView, saved: Mapping[str, Any], study: StudyLink | None) -> None:
        folder = study.study_dir if study is not None else run.run_dir
        self.uri = saved.get("tracking_uri") or tracking_uri(folder)
        self.client = MlflowClient(self.uri)
        if "run_id" in saved:
            self.run_id = str(saved["run_id"])
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            return
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or (study.study_name if study else "rayfed")
        tags = {"rayfed.run_dir": str(run.run_dir.resolve())}
        if study is not None:
            tags["rayfed.trial"] = str(study.trial_number)
            if study.mlflow_parent_run_id:
                tags["mlflow.parentRunId"] = study.mlflow_parent_run_id
        created = self.client.create_run(
            _experiment(self.client, experiment_name, folder), run_name=run.run_name, tags=tags
        )
        self.run_id = str(created.info.run_id)

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def log_config(self, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> None:
        self.client.log_batch(self.run_id, params=_params(flat))

    def log_rounds(self, points: Sequence[RoundPoint]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for step, values, _ in points for key, value in values.items()]
        for start in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _BATCH])

    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        for path in figures:
            self.client.log_artifact(self.run_id, str(path), artifact_path="figures")

    def close(self, finished: bool) -> None:
        status = RunStatus.FINISHED if finished else RunStatus.KILLED
        self.client.set_terminated(self.run_id, status=RunStatus.to_string(status))


def _params(values: Mapping[str, Any]) -> list[Param]:
    text = ((key, value if isinstance(value, str) else json.dumps(value)) for key, value in values.items())
    return [Param(key, value[:_PARAM_CHARS]) for key, value in text]
