"""Weights & Biases: the run as a W&B run, written by ``wandb`` itself, offline unless told otherwise.

Its files go to ``<run_dir>/wandb/`` (offline: ``offline-run-<time>-<id>/``, one per process of the run, all
with the run's id); ``wandb sync <run_dir>/wandb`` uploads them as one run. ``WANDB_MODE=online`` logs live
instead, ``WANDB_PROJECT`` names the project (default ``rayfed``). A study's trials share the study's name as
their W&B group.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import wandb

from rayfed.engine.callbacks import RunView
from rayfed.tracking.registry import StudyLink
from rayfed.tracking.tracker import RoundPoint, Tracker

__all__ = ["WandbTracker"]


class WandbTracker(Tracker):
    """Metrics and histograms at each round's step, the config as the run's config, figures as images. A resumed
    run continues the W&B run of the same id (kept in ``tracking.json``)."""

    name = "wandb"

    def __init__(self, run: RunView, saved: Mapping[str, Any], study: StudyLink | None) -> None:
        self.run_id = str(saved.get("run_id") or secrets.token_hex(4))
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "rayfed",
            id=self.run_id,
            name=run.run_name,
            group=study.study_name if study is not None else None,
            job_type="trial" if study is not None else "run",
            dir=str(run.run_dir),
            mode=None if os.environ.get("WANDB_MODE") else "offline",
            resume="allow",
            settings=wandb.Settings(console="off", quiet=True, save_code=False, disable_git=True, reinit="create_new"),
        )

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def log_config(self, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> None:
        self.run.config.update(dict(nested), allow_val_change=True)

    def log_rounds(self, points: Sequence[RoundPoint]) -> None:
        for step, metrics, distributions in points:
            histograms = {tag: wandb.Histogram(values.tolist()) for tag, values in distributions.items()}
            self.run.log({**metrics, **histograms}, step=step)

    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        self.run.log({f"figures/{path.stem}": wandb.Image(str(path)) for path in figures}, step=step)

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)
