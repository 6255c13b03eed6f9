"""MLflow: the run as an MLflow run, written through ``mlflow.MlflowClient``.

Where: the tracking server or store ``MLFLOW_TRACKING_URI`` names, else an SQLite store beside the run
(``sqlite:///<run_dir>/mlflow.db``; a study's trials share ``<study_dir>/mlflow.db``), with artifacts (the
figures) in ``mlartifacts/`` beside it: ``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db``.
The experiment is ``MLFLOW_EXPERIMENT_NAME``, else ``rayfed`` (a study's: the study's name). An Optuna
study is a run of its own, and each trial a run nested in it (:func:`study_run`). A store the variable names
is checked before anything is written (:func:`check_store`): one MLflow knows, a server that answers within
seconds, an SQLite file that can be written.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus
from mlflow.exceptions import MlflowException

from rayfed.engine.callbacks import RunView
from rayfed.tracking.state import Logged
from rayfed.tracking.study_link import StudyLink
from rayfed.tracking.tracker import RoundPoint, Tracker
from rayfed.util.errors import ConfigError

__all__ = ["MlflowTracker", "check_store", "study_run", "tracking_uri"]

_BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow accepts at most 1000)."""
_PARAM_CHARS = 6000
"""The longest parameter value MLflow stores."""
_REACH_S = 5.0
"""How long the check waits for a tracking server's answer (one request, no retry: MLflow's own client retries
for minutes)."""
_RUN_DIR_TAG, _IDENTITY_TAG = "rayfed.run_dir", "rayfed.identity"


def tracking_uri(folder: Path) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the SQLite store in ``folder``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder.resolve() / 'mlflow.db'}"


def check_store(folder: Path) -> None:
    """ConfigError in one line, before anything is written, when the store ``MLFLOW_TRACKING_URI`` names cannot
    take a run: a scheme MLflow has no store for, a server that does not answer within :data:`_REACH_S`
    seconds, an SQLite file (or its folder) that cannot be written. The default store beside the run needs no
    check: the run directory was checked."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return
    fix = f"fix or unset MLFLOW_TRACKING_URI (unset: the run logs to {str(folder / 'mlflow.db')!r})"
    if uri.startswith("sqlite:///"):
        _check_sqlite(uri, Path(uri.removeprefix("sqlite:///")), fix)
    try:
        MlflowClient(uri)
    except Exception as error:  # MLflow's own error, or its store's
        listed = re.search(r"Supported URI schemes are: \[([^]]*)\]", str(error))
        schemes = [item.strip(" '") for item in listed.group(1).split(",")] if listed else []
        reason = (
            f"no store has the scheme {uri.partition(':')[0]!r}; MLflow's: {', '.join(filter(None, schemes))}"
            if schemes
            else str(error).splitlines()[0].split(". See ")[0]
        )
        raise ConfigError(f"MLFLOW_TRACKING_URI={uri!r} names no store MLflow can use ({reason}); {fix}") from None
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            requests.get(uri, timeout=_REACH_S)
        except requests.RequestException as error:
            raise ConfigError(
                f"MLFLOW_TRACKING_URI={uri!r} does not answer within {_REACH_S:g} s ({type(error).__name__}); "
                f"start its server or {fix}"
            ) from None


def _check_sqlite(uri: str, database: Path, fix: str) -> None:
    """ConfigError unless SQLite can write ``database`` and its journal beside it (tried with a temporary file:
    a read-only file system refuses even root)."""
    try:
        if database.exists() and not (database.is_file() and os.access(database, os.W_OK)):
            raise PermissionError(f"{str(database)!r} is not a file that can be written")
        with tempfile.TemporaryFile(dir=database.parent):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(
            f"MLFLOW_TRACKING_URI={uri!r}: SQLite cannot write the database there ({reason}: "
            f"{str(error.filename or database.parent)!r}); {fix}"
        ) from None


def _experiment_name(study: StudyLink | None) -> str:
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or (study.study_name if study else "rayfed")


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
    run is nested; ``params``: the base config's and the search space's. ConfigError in one line if MLflow
    fails."""
    try:
        client = MlflowClient(tracking_uri(study_dir))
        experiment = _experiment(client, os.environ.get("MLFLOW_EXPERIMENT_NAME") or study_name, study_dir)
        found = client.search_runs([experiment], filter_string=f"tags.`rayfed.study` = '{study_name}'", max_results=1)
        if found:
            return str(found[0].info.run_id)
        run = client.create_run(experiment, run_name=study_name, tags={"rayfed.study": study_name})
        client.log_batch(run.info.run_id, params=_params(params))
        return str(run.info.run_id)
    except MlflowException as error:
        raise ConfigError(
            f"engine.loggers: mlflow could not open the study's own MLflow run ({str(error).splitlines()[0]}); fix "
            "what it names, or leave 'mlflow' out of engine.loggers, then start the study again"
        ) from None


class MlflowTracker(Tracker):
    """Params from the config, one metric history per ``rounds.parquet`` column, figures as artifacts. MLflow
    keeps no histograms. A resumed run logs into the same MLflow run (its id in ``tracking.json``)."""

    name = "mlflow"

    def __init__(self, run: RunView, saved: Logged, study: StudyLink | None) -> None:
        folder = study.study_dir if study is not None else run.run_dir
        self.uri = saved.ids.get("tracking_uri") or tracking_uri(folder)
        self.client = MlflowClient(self.uri)
        if "run_id" in saved.ids:
            self.run_id = saved.ids["run_id"]
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            return
        tags = {_RUN_DIR_TAG: str(run.run_dir.resolve()), _IDENTITY_TAG: run.identity}
        if study is not None:
            tags["rayfed.trial"] = str(study.trial_number)
            if study.mlflow_parent_run_id:
                tags["mlflow.parentRunId"] = study.mlflow_parent_run_id
        created = self.client.create_run(
            _experiment(self.client, _experiment_name(study), folder), run_name=run.run_name, tags=tags
        )
        self.run_id = str(created.info.run_id)

    @classmethod
    def check(cls, folder: Path) -> None:
        check_store(folder)

    @classmethod
    def store(cls, folder: Path) -> str:
        return repr(tracking_uri(folder))

    @classmethod
    def recorded(cls, run: RunView, study: StudyLink | None) -> Logged | None:
        """The newest MLflow run tagged with this run's directory and identity, its last step over every metric
        and whether it holds params. A default store that does not exist yet holds none (and is not made)."""
        folder = study.study_dir if study is not None else run.run_dir
        uri = tracking_uri(folder)
        if not os.environ.get("MLFLOW_TRACKING_URI") and not (folder / "mlflow.db").is_file():
            return None
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(_experiment_name(study))
        if experiment is None:
            return None
        tags = f"tags.`{_RUN_DIR_TAG}` = '{run.run_dir.resolve()}' and tags.`{_IDENTITY_TAG}` = '{run.identity}'"
        found = client.search_runs(
            [experiment.experiment_id], filter_string=tags, order_by=["attributes.start_time DESC"], max_results=1
        )
        if not found:
            return None
        logged = found[0]
        steps = [m.step for key in logged.data.metrics for m in client.get_metric_history(logged.info.run_id, key)]
        return Logged(
            {"run_id": logged.info.run_id, "tracking_uri": uri}, max(steps, default=-1), bool(logged.data.params)
        )

    def ids(self) -> dict[str, str]:
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def log_config(self, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> None:
        self.client.log_batch(self.run_id, params=_params(flat))

    def log_rounds(self, points: Sequence[RoundPoint]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for step, values, _ in points for key, value in values.items()]
        for start in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _BATCH])

    def confirm(self, step: int | None) -> None:
        """Nothing left to wait for: MLflow's client writes synchronously, ``log_batch`` returning once the store
        committed the batch (a server's answer, a database's commit) and raising otherwise."""

    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        for path in figures:
            self.client.log_artifact(self.run_id, str(path), artifact_path="figures")

    def close(self, finished: bool) -> None:
        status = RunStatus.FINISHED if finished else RunStatus.KILLED
        self.client.set_terminated(self.run_id, status=RunStatus.to_string(status))


def _params(values: Mapping[str, Any]) -> list[Param]:
    text = ((key, value if isinstance(value, str) else json.dumps(value)) for key, value in values.items())
    return [Param(key, value[:_PARAM_CHARS]) for key, value in text]
