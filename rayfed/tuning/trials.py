"""A study's objective: each trial is one rayfed run, reporting its rounds, stopped when pruned or interrupted.

:class:`TrialRunner` runs ``base.override(params)`` in ``<study_dir>/trial_NNNN`` and returns the objective
of its :class:`~rayfed.engine.result.RunResult`. A trial that Ctrl-C or SIGTERM stops (in its run, around
it, or through :class:`~rayfed.tuning.parallel.TrialStop` while trials run in threads) raises a
KeyboardInterrupt: Optuna marks it ``FAIL`` without ``rayfed.error``, and the study's resume retries it
(:mod:`rayfed.tuning.resume`). A run that fails with an error once a stop was asked is counted as
interrupted too, so a trial torn down by the stop is retried rather than recorded as an error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
import pyarrow as pa

import rayfed.tuning.attrs as attrs
from rayfed.config import RunConfig
from rayfed.engine import RunResult, run
from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.metrics import RoundRecord
from rayfed.execution.run_packs import alone_reason
from rayfed.execution.stack_merger import StackMerger
from rayfed.tracking import StudyLink, Tracking
from rayfed.tuning.parallel import TrialStop
from rayfed.tuning.pruning import PruningCallback
from rayfed.tuning.resume import driver_id
from rayfed.tuning.space import SearchSpace

logger = logging.getLogger(__name__)

__all__ = ["TrialRunner", "packed", "quiet_interrupted_trials"]


@dataclass
class TrialRunner:
    """The objective: one run per trial, reporting rounds, stopping when pruned or asked to stop."""

    base: RunConfig
    """The config each trial overrides with its parameters (on Ray, with its share of the workers)."""
    space: SearchSpace
    study_name: str
    study_dir: Path
    objective: Callable[[RunResult], float]
    trial_callbacks: Callable[[optuna.Trial], Sequence[Callback]] | None
    mlflow_parent_run_id: str | None
    """The study's own MLflow run, in which each trial's is nested (with MLflow among engine.loggers)."""
    driver: str = field(default_factory=driver_id)
    stop: TrialStop = field(default_factory=TrialStop)
    """Requested by Ctrl-C or SIGTERM from before the study's first trial (:func:`~rayfed.tuning.parallel.
    stops_recorded`): a trial asked before it starts does not start; with trials in threads, each running one stops
    after its current round."""
    interrupted: set[int] = field(default_factory=set)
    """Numbers of the trials stopped by Ctrl-C or SIGTERM (retried when the study resumes)."""
    warmup_rounds: int = 0
    """Rounds each trial trains before its pruner may stop it (:class:`~rayfed.tuning.pruning.PruningCallback`)."""
    merger: StackMerger | None = None
    """With trials in threads that may share a stack (:func:`packed`): the merger their runs' stacks train in."""

    def __call__(self, trial: optuna.Trial) -> float:
        try:
            if self.stop.is_set():  # asked before this trial started (Optuna had already handed it out)
                raise self.stop.interruption()
            return self._trial(trial)
        except KeyboardInterrupt:  # in its run or around it (Ctrl-C between two trials lands in one of them)
            self.interrupted.add(trial.number)
            raise

    def _trial(self, trial: optuna.Trial) -> float:
        trial.set_user_attr(attrs.DRIVER, self.driver)
        params = self.space.suggest(trial)
        run_dir = (self.study_dir / f"trial_{trial.number:04d}").resolve()
        trial.set_user_attr(attrs.RUN_DIR, str(run_dir))
        pruning = PruningCallback(trial, self.warmup_rounds)
        callbacks = [pruning, *(self.trial_callbacks(trial) if self.trial_callbacks else [])]
        if self.base.engine.loggers:
            link = StudyLink(self.study_name, self.study_dir, trial.number, self.mlflow_parent_run_id)
            callbacks.append(Tracking(self.base.engine.loggers, link))
        callbacks.append(_StopWhenAsked(self.stop))  # last: every other callback has taken the round
        try:
            with self._packed():
                result = run(self.base.override({**params, "run_dir": str(run_dir)}), callbacks=callbacks)
        except Exception as e:
            if self.stop.is_set():  # torn down while the study stopped: interrupted, and retried on resume
                raise self.stop.interruption() from e
            trial.set_user_attr(attrs.ERROR, f"{type(e).__name__}: {e}")  # an error: finished, not retried
            raise
        for name in ("best_accuracy", "final_accuracy"):
            value = getattr(result, name)
            trial.set_user_attr(f"rayfed.{name}", None if math.isnan(value) else value)
        trial.set_user_attr(attrs.ROUNDS_RUN, result.rounds_run)
        if pruning.pruned_round is not None:
            trial.set_user_attr(attrs.PRUNED_ROUND, pruning.pruned_round)
            raise optuna.TrialPruned(f"pruned at round {pruning.pruned_round}")
        value = float(self.objective(result))
        if math.isnan(value):
            trial.set_user_attr(attrs.ERROR, "the objective is NaN (no round was evaluated?)")
        return value

    @contextmanager
    def _packed(self) -> Iterator[None]:
        """The trial's run, its stacks merged with the running trials' (:attr:`merger`) where they share one."""
        if self.merger is None:
            yield
            return
        self.merger.expect(1)
        with self.merger.turn():
            yield


_ON_RAY = (
    "on Ray each trial's run trains on its own share of the workers (rayfed.run_many packs Ray runs, one Ray task a "
    "pack; a study's trials are not packed on Ray)"
)
"""Why trials at once on Ray train unpacked though their runs may share a stack (``rayfed.run_many`` packs them)."""


def packed(runner: TrialRunner, parallel_trials: int) -> TrialRunner:
    """``runner`` whose ``parallel_trials`` trials at once share one stack where their runs may
    (:func:`~rayfed.execution.run_packs.alone_reason` of the base config: the local backend with the stacked path
    on; trials differ in numbers a lane carries as its own, and a call's stacks that do not merge train apart, as
    in :func:`rayfed.run_many`); the log says in one line which, and why not."""
    if parallel_trials < 2:
        return runner
    reason = alone_reason(runner.base) or (_ON_RAY if runner.base.engine.backend == "ray" else "")
    if reason:
        logger.info("tune: the %d trials at once train alone: %s", parallel_trials, reason)
        return runner
    logger.info("tune: the %d trials at once train packed, their clients' stacks merged into one", parallel_trials)
    return replace(runner, merger=StackMerger())


class _StopWhenAsked(Callback):
    """Ends a trial's run after its current round once ``stop`` is requested, as Ctrl-C would in the main thread
    (the run checkpoints its last round and raises RunInterrupted)."""

    def __init__(self, stop: TrialStop) -> None:
        self.stop = stop

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        if self.stop.is_set():
            raise self.stop.interruption()
        return False


@contextmanager
def quiet_interrupted_trials(interrupted: set[int]) -> Iterator[None]:
    """Drop Optuna's warnings (with a traceback) about trials that Ctrl-C stopped: the command line says it once."""
    optimize_logger = logging.getLogger("optuna.study._optimize")

    def keep(record: logging.LogRecord) -> bool:
        stopped_by_user = record.exc_info is not None and isinstance(record.exc_info[1], KeyboardInterrupt)
        return not stopped_by_user and not any(
            record.getMessage().startswith(f"Trial {number} failed") for number in interrupted
        )

    optimize_logger.addFilter(keep)
    try:
        yield
    finally:
        optimize_logger.removeFilter(keep)
