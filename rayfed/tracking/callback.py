"""The callback that sends a run to its trackers: :class:`Tracking`."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.metrics import RoundRecord, counted_round
from rayfed.provenance.run_dir import resume_command
from rayfed.tracking.state import STATE_FILE, Logged, read_state, write_state
from rayfed.tracking.study_link import StudyLink
from rayfed.tracking.tools import FIGURES, check_folders, check_services, tracker_class
from rayfed.tracking.tracker import RoundPoint, Tracker
from rayfed.util.errors import ConfigError, RayfedError

if TYPE_CHECKING:  # pragma: no cover
    from rayfed.engine.result import RunResult

__all__ = ["Tracking", "DISTRIBUTIONS"]

logger = logging.getLogger(__name__)

DISTRIBUTIONS = ("test_acc", "train_loss", "update_norm", "local_test_acc")
"""Columns of ``clients/round_*.parquet`` sent as per-client distributions (``clients/<column>``)."""


class Tracking(Callback):
    """Sends the run to the trackers ``loggers`` names (:mod:`rayfed.tracking`); ``study`` when the run is an
    Optuna trial. A step, or the config, counts as sent (``tracking.json``) once the tool confirmed holding it
    (:meth:`Tracker.confirm`), so a run killed at any moment resumes by sending each tracker what it lacks. A
    tracker that fails mid-run is warned about once and left out; the run goes on."""

    def __init__(self, loggers: Sequence[str], study: StudyLink | None = None) -> None:
        self.loggers, self.study = tuple(loggers), study
        self._trackers: dict[str, Tracker] = {}
        self._logged: dict[str, Logged] = {}
        """Every entry of ``tracking.json`` (a tracker left out of ``engine.loggers`` keeps its own)."""

    def before_run(self, run: RunView, continues: bool) -> None:
        """Refuse, before anything is written, a run whose trackers' folders are files, whose trackers' settings
        cannot take it (:func:`~rayfed.tracking.tools.check_services`) or whose ``tracking.json`` cannot be
        read; and find, for a continued run, each tracker's logged run and how far it holds it (``tracking.json``,
        caught up with the tool's own records; where it lost a tracker's entry, those records alone)."""
        check_folders(self.loggers, run.run_dir)
        check_services(self.loggers, self.study.study_dir if self.study is not None else run.run_dir)
        saved = read_state(run.run_dir) if continues else {}
        self._logged = dict(saved or {})
        for name in self.loggers:
            entry = self._logged.get(name)
            if continues:
                entry = self._caught_up(name, run, entry) if entry else self._recovered(name, run, saved is None)
            self._logged[name] = entry or Logged()

    def on_run_start(self, run: RunView) -> None:
        for name in self.loggers:
            entry = self._logged[name]
            try:
                tracker = tracker_class(name)(run, entry, self.study)
            except Exception as error:  # the tool's own error, at round 0: nothing of the run is lost
                raise self._not_opened(name, run, entry, error) from error
            self._trackers[name], self._logged[name] = tracker, replace(entry, ids=tracker.ids())
        write_state(run.run_dir, self._logged)  # the logged runs' ids, before anything is sent to them
        plain = run.config.to_dict()
        flat = dict(_flatten(plain))
        for name, tracker in list(self._trackers.items()):
            if not self._logged[name].config and self._attempt(name, "the run's config", _config(tracker, flat, plain)):
                self._logged[name] = replace(self._logged[name], config=tracker.keeps)
        # the rounds recorded before this process (a resume) that a tracker does not hold: a tracker added on
        # resume, or rounds sent by a process that stopped before the tool confirmed them
        self._send(run, [(counted_round(row["round"]), _metrics(row), {}) for row in run.history])

    def _not_opened(self, name: str, run: RunView, entry: Logged, error: Exception) -> ConfigError:
        """Why tracker ``name`` could not open the run's logged run, and the fix: for a resume, the logged run that
        ``tracking.json`` records, the tool's store, and how to continue without the tool."""
        said = f"{type(error).__name__}: {' '.join(str(error).split())}"  # one line, whatever the tool wrote
        folder = self.study.study_dir if self.study is not None else run.run_dir
        if not entry.ids:
            return ConfigError(
                f"engine.loggers: {name} could not open the run's logged run ({said}); fix what it names, or leave "
                f"{name!r} out of engine.loggers, then start the run again"
            )
        others = ",".join(other for other in self.loggers if other != name)
        return ConfigError(
            f"engine.loggers: {name} could not reopen the logged run {entry.ids} that "
            f"{str(run.run_dir / STATE_FILE)!r} records, in its store {tracker_class(name).store(folder)} ({said}); "
            f"fix or restore that store, or continue without {name}: {resume_command(run.run_dir)} "
            f"engine.loggers=[{others}]"
        )

    def _caught_up(self, name: str, run: RunView, entry: Logged) -> Logged:
        """``entry`` (``tracking.json``'s), advanced to the step and config the tool's own records hold of the same
        logged run: a process killed after the tool confirmed a round and before ``tracking.json`` recorded it
        must not send that round again. Records that cannot be read leave ``entry`` as it is."""
        try:
            found = tracker_class(name).recorded(run, self.study)
        except Exception:  # the tool's store, checked before this, failed now: tracking.json's entry stands
            return entry
        if found is None or found.ids.get("run_id") != entry.ids.get("run_id"):  # not the logged run it names
            return entry
        return replace(entry, step=max(entry.step, found.step), config=entry.config or found.config)

    def _recovered(self, name: str, run: RunView, lost: bool) -> Logged | None:
        """A continued run's logged run in ``name`` whose ``tracking.json`` entry is missing (``lost``: the whole
        file), from the tool's own records (:meth:`Tracker.recorded`); said in a warning when found."""
        path = run.run_dir / STATE_FILE
        try:
            found = tracker_class(name).recorded(run, self.study)
        except Exception as error:  # the tool's own error, before anything is written
            raise ConfigError(
                f"{str(path)!r} holds no entry for {name}, and {name}'s own records of the run could not be read "
                f"({type(error).__name__}: {error}); restore {str(path)!r} from a copy, or leave {name!r} out of "
                "engine.loggers"
            ) from error
        if found is not None:
            logger.warning(
                "engine.loggers: %s %s; %s's own records hold the run's logged run (%s) up to step %d, so the "
                "resume continues it and sends only the later rounds",
                path,
                "is missing" if lost else f"holds no entry for {name}",
                name,
                ", ".join(f"{key} {value}" for key, value in found.ids.items()) or "its files in the run directory",
                found.step,
            )
        return found

    def on_initial_evaluation(self, run: RunView, record: RoundRecord, clients: pa.Table) -> None:
        self._send(run, [_point(record, clients)])

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        self._send(run, [_point(record, clients)])
        return False

    def on_run_end(self, run: RunView, result: RunResult | None) -> None:
        if result is not None and self._trackers:
            figures = _draw_figures(run.run_dir)
            if figures:
                last = max(self._logged[name].step for name in self._trackers)
                self._each("its figures", lambda tracker: tracker.log_figures(last, figures))
        self._each("the end of the run", lambda tracker: tracker.close(result is not None))
        self._trackers.clear()

    def _send(self, run: RunView, points: Sequence[RoundPoint]) -> None:
        """Give each tracker the points past its last step and record the steps it confirmed (``tracking.json``)."""
        for name, tracker in list(self._trackers.items()):
            new = [point for point in points if point[0] > self._logged[name].step]
            if new and self._attempt(name, "the rounds' metrics", _rounds(tracker, new)) and tracker.keeps:
                self._logged[name] = replace(self._logged[name], step=new[-1][0])
        if self._trackers:
            write_state(run.run_dir, self._logged)

    def _each(self, what: str, action: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self._trackers.items()):
            self._attempt(name, what, lambda: action(tracker))

    def _attempt(self, name: str, what: str, action: Callable[[], None]) -> bool:
        """Run ``action``; if the tool fails, warn and leave the tracker out (the run's own files hold everything)."""
        try:
            action()
            return True
        except Exception as error:  # a tracker's failure must not end a run that is training
            logger.warning(
                "engine.loggers: %s failed to take %s (%s: %s); the run goes on without it, its rounds.parquet "
                "holds every round, and a resume sends the tracker what it lacks",
                name,
                what,
                type(error).__name__,
                error,
            )
            self._trackers.pop(name, None)
            return False


def _config(tracker: Tracker, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> Callable[[], None]:
    def send() -> None:
        tracker.log_config(flat, nested)
        tracker.confirm(None)

    return send


def _rounds(tracker: Tracker, points: Sequence[RoundPoint]) -> Callable[[], None]:
    def send() -> None:
        tracker.log_rounds(points)
        tracker.confirm(points[-1][0])

    return send


def _draw_figures(run_dir: Path) -> list[Path]:
    """The finished run's figures (``rayfed plot``'s) in ``<run_dir>/figures``; none, with a warning saying what
    was saved and how to draw them, if they cannot be drawn: the run's rounds are all saved by then."""
    from rayfed.results.plots import write_figures

    folder = run_dir / FIGURES
    try:
        return write_figures([run_dir], folder)[0]
    except (RayfedError, OSError) as error:
        reason = "it is a file" if folder.exists() and not folder.is_dir() else f"{type(error).__name__}: {error}"
        logger.warning(
            "engine.loggers: the run's figures could not be drawn into %s (%s), so the trackers get none; every "
            "round is saved in rounds.parquet and sent to them: draw the figures with rayfed plot %s --out DIR",
            folder,
            reason,
            run_dir,
        )
        return []


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
