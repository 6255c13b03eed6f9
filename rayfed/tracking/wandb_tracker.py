"""Weights & Biases: the run as a W&B run, written by ``wandb`` itself, offline unless told otherwise.

Its files go to ``<run_dir>/wandb/`` (offline: ``offline-run-<time>-<id>/``, one per process of the run, all
with the run's id); ``wandb sync <run_dir>/wandb`` uploads them as one run. ``WANDB_MODE=online`` logs live
instead, ``WANDB_PROJECT`` names the project (default ``rayfed``). A study's trials share the study's name as
their W&B group.

``wandb.log`` hands a row to W&B's service, a process of its own, and returns before the service writes it;
a row is confirmed once the service wrote it to the run's transaction log (:mod:`rayfed.tracking.wandb_log`),
the file ``wandb sync`` uploads, which the service is asked to flush every :data:`_FLUSH_S` seconds. Online,
the service uploads from it: after a hard kill, ``wandb sync`` of the killed process's folder uploads what
it had not.
"""

from __future__ import annotations

import os
import secrets
import time
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import wandb

from rayfed.engine.callbacks import RunView
from rayfed.tracking.state import Logged
from rayfed.tracking.study_link import StudyLink
from rayfed.tracking.tracker import RoundPoint, Tracker
from rayfed.tracking.wandb_log import TransactionLog, carries_config, history_rows, logged_runs
from rayfed.util.errors import ConfigError

__all__ = ["WandbTracker", "LOG_DIR"]

LOG_DIR = "wandb"
"""The W&B files' folder in the run directory."""
_FLUSH_S = 0.05
"""How often W&B's service writes its transaction log out (its default, 15 s, would hold every round that long)."""
_CONFIRM_S = 60.0
"""How long a row may take to reach the transaction log before the tracker is taken for failed."""


def _modes() -> tuple[str, ...]:
    """The values ``WANDB_MODE`` may take, as this wandb's settings declare them."""
    return tuple(typing.get_args(wandb.Settings.model_fields["mode"].annotation))


class WandbTracker(Tracker):
    """Metrics and histograms at each round's step, the config as the run's config, figures as images in the
    run's summary (W&B drops a row at a step it has written, and the next round of an extended run takes the
    step after the last). A resumed run continues the W&B run of the same id (kept in ``tracking.json``)."""

    name = "wandb"
    folder = LOG_DIR

    def __init__(self, run: RunView, saved: Logged, study: StudyLink | None) -> None:
        self.run_id = saved.ids.get("run_id") or secrets.token_hex(4)
        setting = "x_transaction_log_flush_interval"  # absent from older wandb, which writes rows out sooner
        flush: dict[str, Any] = {setting: _FLUSH_S} if setting in wandb.Settings.model_fields else {}
        mode: Any = os.environ.get("WANDB_MODE") or "offline"  # passed: wandb reads the variable once per process
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "rayfed",
            id=self.run_id,
            name=run.run_name,
            group=study.study_name if study is not None else None,
            job_type="trial" if study is not None else "run",
            dir=str(run.run_dir),
            mode=mode,
            resume="allow",
            settings=wandb.Settings(
                console="off", quiet=True, save_code=False, disable_git=True, reinit="create_new", **flush
            ),
        )
        self.keeps = self.run.settings.mode != "disabled"
        self._log = TransactionLog(Path(self.run.settings.sync_file))
        self._written_step, self._written_config = -1, False

    @classmethod
    def check(cls, folder: Path) -> None:
        mode = os.environ.get("WANDB_MODE")
        if mode is not None and mode not in _modes():
            raise ConfigError(
                f"WANDB_MODE={mode!r} is not a mode of W&B; set it to one of {', '.join(_modes())}, or unset it "
                "(rayfed then logs offline into RUN_DIR/wandb)"
            )

    @classmethod
    def recorded(cls, run: RunView, study: StudyLink | None) -> Logged | None:
        """The run id whose transaction logs in ``<run_dir>/wandb`` reach the furthest step, with that step."""
        runs = logged_runs(run.run_dir / LOG_DIR)
        if not runs:
            return None
        found = max(runs.values(), key=lambda logged: (logged.last_step, len(logged.files)))
        return Logged({"run_id": found.run_id}, found.last_step, found.has_config)

    def ids(self) -> dict[str, str]:
        return {"run_id": self.run_id}

    def log_config(self, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> None:
        self.run.config.update(dict(nested), allow_val_change=True)

    def log_rounds(self, points: Sequence[RoundPoint]) -> None:
        for step, metrics, distributions in points:
            histograms = {tag: wandb.Histogram(values.tolist()) for tag, values in distributions.items()}
            self.run.log({**metrics, **histograms}, step=step, commit=True)

    def confirm(self, step: int | None) -> None:
        """Wait until the transaction log holds the config (``step`` None) or the row of ``step``; TimeoutError
        after :data:`_CONFIRM_S` seconds. A disabled W&B (``WANDB_MODE=disabled``) writes nothing to wait for."""
        deadline = time.monotonic() + _CONFIRM_S
        while self.keeps and not self._holds(step):
            if time.monotonic() > deadline:
                what = "the run's config" if step is None else f"step {step}"
                raise TimeoutError(f"W&B's service did not write {what} to {self._log.path} within {_CONFIRM_S:g} s")
            time.sleep(_FLUSH_S / 2)

    def _holds(self, step: int | None) -> bool:
        records = list(self._log.read())
        self._written_step = max([self._written_step, *(row_step for row_step, _ in history_rows(iter(records)))])
        self._written_config = self._written_config or any(carries_config(record) for record in records)
        return self._written_config if step is None else self._written_step >= step

    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        self.run.summary.update({f"figures/{path.stem}": wandb.Image(str(path)) for path in figures})

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)
