"""The Optuna study a run is a trial of: :class:`StudyLink`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["StudyLink"]


@dataclass(frozen=True)
class StudyLink:
    """The Optuna study a run is a trial of, so that each tracker files the trial under its study: a run
    nested in the study's run (MLflow), a group (W&B), a folder of the study's (TensorBoard: the trials'
    run directories lie in the study's)."""

    study_name: str
    study_dir: Path
    trial_number: int
    mlflow_parent_run_id: str | None = None
    """The study's own MLflow run (:func:`rayfed.tracking.mlflow_tracker.study_run`), when MLflow is a tracker."""
