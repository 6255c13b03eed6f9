"""The callback that sends a run to its trackers: :class:`Tracking`."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.metrics import RoundRecord, counted_round
from rayfed.tracking.registry import STATE_FILE, StudyLink
from rayfed.tracking.tracker import RoundPoint, Tracker
from rayfed.util.errors import ConfigError
from rayfed.util.files import write_json

if TYPE_CHECKING:  # pragma: no cover
    from rayfed.engine.result import RunResult

__all__ = ["Tracking", "DISTRIBUTIONS"]

logger = logging.getLogger(__name__)

DISTRIBUTIONS = ("test_acc", "train_loss", "update_norm", "local_test_acc")
"""Columns of ``clients/round_*.parquet`` sent as per-client distributions (``clients/<column>``)."""


class Tracking(Callback):
    """Sends the run to the trackers ``loggers`` names (:mod:`rayfed.tracking`); ``study`` when the run is an
    Optuna trial. A tracker that fails mid-run is warned about once and left out; the run goes on."""

    def __init__(self, loggers: Sequence[str], study: StudyLink | None = None) -> None:
        self.loggers, self.study = tuple(loggers), study
        self._trackers: dict[str, Tracker] = {}
        self._steps: dict[str, int] = {}
        """The last step each tracker received (-1: none)."""

    def on_run_start(self, run: RunView) -> None:
        saved = _read_state(run.run_dir)
        plain = run.config.to_dict()
        flat = dict(_flatten(plain))
        for name in self.loggers:
            entry = saved.get(name, {})
            try:
                tracker = _open(name, run, entry, self.study)
            except Exception as error:  # the tool's own error, at round 0: nothing of the run is lost
                raise ConfigError(
                    f"engine.loggers: {name} could not open the run's logged run ({type(error).__name__}: {error}); "
                    f"fix what it names, or leave {name!r} out of engine.loggers, then start the run again"
                ) from error
            self._trackers[name], self._steps[name] = tracker, int(entry.get("step", -1))
            if not entry:
                tracker.log_config(flat, plain)
        # the rounds recorded before this process (a resume) that a tracker has not received: a tracker added
        # on resume, or rounds sent by a process that stopped before saving its state
        self._send(run, [(counted_round(row["round"]), _metrics(row), {}) for row in run.history])

    def on_initial_evaluation(self, run: RunView, record: RoundRecord, clients: pa.Table) -> None:
        self._send(run, [_point(record, clients)])

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        self._send(run, [_point(record, clients)])
        return False

    def on_run_end(self, run: RunView, result: RunResult | None) -> None:
        if result is not None and self._trackers:
            from rayfed.results.plots import write_figures

            figures, _ = write_figures([run.run_dir], run.run_dir / "figures")
            last = max(self._steps.values())
            self._each("its figures", lambda tracker: tracker.log_figures(last, figures))
        self._each("the end of the run", lambda tracker: tracker.close(result is not None))
        self._trackers.clear()

    def _send(self, run: RunView, points: Sequence[RoundPoint]) -> None:
        """Give each tracker the points past its last step, then record the steps (``tracking.json``)."""
        for name, tracker in list(self._trackers.items()):
            new = [point for point in points if point[0] > self._steps[name]]
            if new and self._attempt(name, "the rounds' metrics", lambda: tracker.log_rounds(new)):
                self._steps[name] = new[-1][0]
        if self._trackers:
            write_json(
                run.run_dir / STATE_FILE,
                {name: {**tracker.state(), "step": self._steps[name]} for name, tracker in self._trackers.items()},
            )

    def _each(self, what: str, action: Any) -> None:
        for name, tracker in list(self._trackers.items()):
            self._attempt(name, what, lambda: action(tracker))

    def _attempt(self, name: str, what: str, action: Any) -> bool:
        """Run ``action``; if the tool fails, warn and leave the tracker out (the run's own files hold everything)."""
        try:
            action()
            return True
        except Exception as error:  # a tracker's failure must not end a run that is training
            logger.warning(
                "engine.loggers: %s failed to take %s (%s: %s); the run goes on without it, its rounds.parquet "
                "holds every round",
                name,
                what,
                type(error).__name__,
                error,
            )
            self._trackers.pop(name, None)
            return False


def _open(name: str, run: RunView, saved: Mapping[str, Any], study: StudyLink | None) -> Tracker:
    """The named tracker's logged run: reopened from ``saved`` (a resume), else a new one."""
    if name == "tensorboard":
        from rayfed.tracking.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker(run, saved)
    if name == "mlflow":
        from rayfed.tracking.mlflow_tracker import MlflowTracker

        return MlflowTracker(run, saved, study)
    from rayfed.tracking.wandb_tracker import WandbTracker

    return WandbTracker(run, saved, study)


def _read_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _point(record: RoundRecord, clients: pa.Table) -> RoundPoint:
    distributions = {}
    for column in DISTRIBUTIONS:
        if column in clients.column_names:
            values = np.asarray(clients.column(column).to_numpy(zero_copy_only=False), dtype=np.float64)
            values = values[np.isfinite(values)]
            if values.size:
                distributions[f"clients/{column}"] = values
    return counted_round(record.round), _metrics(record.as_row()), distributions


def _metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's numbers but its round, each as a float, NaN and infinities left out."""
    numbers = ((key, value) for key, value in row.items() if key != "round" and not isinstance(value, bool))
    return {key: float(value) for key, value in numbers if isinstance(value, (int, float)) and math.isfinite(value)}


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf of a plain config tree."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{path}.")
        else:
            yield path, value
