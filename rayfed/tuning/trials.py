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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import cloudpickle
import optuna
import pyarrow as pa

import rayfed.tuning.attrs as attrs
from rayfed.config import RunConfig
from rayfed.engine import RunResult, run
from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.metrics import RoundRecord
from rayfed.execution.run_packs import alone_reason
from rayfed.execution.stack_merger import StackMerger
from rayfed.packs.lane_host import GO, PRUNE, STOP, run_as_lane
from rayfed.tracking import StudyLink, Tracking
from rayfed.tuning.parallel import TrialStop
from rayfed.tuning.pruning import PruningCallback
from rayfed.tuning.resume import driver_id
from rayfed.tuning.space import SearchSpace

if TYPE_CHECKING:  # pragma: no cover
    from rayfed.actors.pack_host import HostActor

logger = logging.getLogger(__name__)

__all__ = ["TrialRunner", "packs", "packed", "quiet_interrupted_trials"]


@dataclass
class TrialRunner:
    """The objective: one run per trial, reporting rounds, stopping when pruned or asked to stop."""

    base: RunConfig
    """The config each trial overrides with its parameters (on Ray unpacked, with its share of the workers)."""
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
    host: HostActor | None = None
    """On Ray, with trials in threads that may share a stack (:func:`packs`): the host their runs train in, as
    lanes of one stack (:mod:`rayfed.packs.lane_host`)."""

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
        callbacks = list(self.trial_callbacks(trial) if self.trial_callbacks else [])
        if self.base.engine.loggers:
            link = StudyLink(self.study_name, self.study_dir, trial.number, self.mlflow_parent_run_id)
            callbacks.append(Tracking(self.base.engine.loggers, link))
        config = self.base.override({**params, "run_dir": str(run_dir)})
        try:
            if self.host is not None:  # a lane of the host's stack, its rounds judged here
                result = run_as_lane(self.host, str(trial.number), config, callbacks, partial(self._verdict, pruning))
            else:  # the stop last: every other callback has taken the round
                with self._packed():
                    result = run(config, callbacks=[pruning, *callbacks, _StopWhenAsked(self.stop)])
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

    def _verdict(self, pruning: PruningCallback, record: RoundRecord) -> str:
        """What a hosted run does after ``record``'s round: what :class:`PruningCallback` then
        :class:`_StopWhenAsked` would have it do, in that order."""
        pruned = pruning.judge(record)
        return STOP if self.stop.is_set() else PRUNE if pruned else GO

    @contextmanager
    def _packed(self) -> Iterator[None]:
        """The trial's run, its stacks merged with the running trials' (:attr:`merger`) where they share one."""
        if self.merger is None:
            yield
            return
        self.merger.expect(1)
        with self.merger.turn():
            yield


def _unsendable(trial_callbacks: Callable[[optuna.Trial], Sequence[Callback]] | None) -> str:
    """Why ``trial_callbacks`` cannot make callbacks that a packed trial's host on Ray receives ("" when it can:
    none, or a function that pickles, as :func:`rayfed.run_many` sends a pack's callbacks)."""
    if trial_callbacks is None:
        return ""
    try:
        cloudpickle.dumps(trial_callbacks)
    except Exception as error:  # noqa: BLE001 - pickling fails in many ways; each is named
        return (
            "its trial_callbacks cannot be sent to the host where packed trials train on Ray "
            f"({type(error).__name__}: {error})"
        )
    return ""


def packs(runner: TrialRunner, parallel_trials: int) -> bool:
    """Whether ``runner``'s ``parallel_trials`` trials at once share one stack: where their runs may
    (:func:`~rayfed.execution.run_packs.alone_reason` of the base config: the stacked path on; trials differ in
    numbers a lane carries as its own, and a call's stacks that do not merge train apart, as in
    :func:`rayfed.run_many`), and on Ray where the host can receive their ``trial_callbacks``; the log says in one
    line which, and why not."""
    if parallel_trials < 2:
        return False
    on_ray = runner.base.engine.backend == "ray"
    reason = alone_reason(runner.base) or (_unsendable(runner.trial_callbacks) if on_ray else "")
    if reason:
        logger.info("tune: the %d trials at once train alone: %s", parallel_trials, reason)
        return False
    where = " in one host with one worker's resources" if on_ray else ""
    logger.info(
        "tune: the %d trials at once train packed, their clients' stacks merged into one%s", parallel_trials, where
    )
    return True


def packed(runner: TrialRunner, parallel_trials: int) -> TrialRunner:
    """``runner`` whose ``parallel_trials`` trials at once, in this process, share one stack where they may
    (:func:`packs`)."""
    return replace(runner, merger=StackMerger()) if packs(runner, parallel_trials) else runner


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
