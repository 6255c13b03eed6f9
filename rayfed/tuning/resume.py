"""Resuming a study that was killed or interrupted, without repeating finished trials.

Every trial records the driver process that runs it (``rayfed.driver``: host, pid and
the process's start time). When :func:`rayfed.tuning.tune` opens an existing study:

1. A ``RUNNING`` trial whose driver is gone (another host counts as gone: one driver
   per study) is marked ``FAIL``; so is nothing else. A trial of a live driver is left alone.
2. Each trial that failed because it was interrupted (killed, Ctrl-C; not a Python
   error in the run, which is recorded as ``rayfed.error``) is re-enqueued once with
   the same parameters (``study.enqueue_trial``; the new trial carries ``rayfed.retry_of``).
   A retry that is interrupted again is not retried a second time.
3. ``n_trials`` counts finished trials, :func:`finished_trials`: ``COMPLETE``,
   ``PRUNED`` and trials that failed with an error. Interrupted trials do not count,
   so the resumed study runs exactly the trials still missing.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import FrozenTrial, TrialState

import rayfed.tuning.attrs as attrs
from rayfed.util.processes import ProcessId, is_running

__all__ = ["driver_id", "finished_trials", "recover_interrupted"]

logger = logging.getLogger(__name__)


def driver_id() -> str:
    """``host:pid:start_time`` of this process: unique even when a pid is reused."""
    return str(ProcessId.current())


def finished_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that count toward ``n_trials``: complete, pruned, or failed with an error."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and attrs.ERROR in t.user_attrs)
    ]


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Fail the trials of dead drivers and re-enqueue every interrupted trial once.

    Returns the numbers of the trials that were re-enqueued.
    """
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _driver_alive(trial.user_attrs.get(attrs.DRIVER)):
            logger.warning("trial %d was left running by a driver that is gone; marking it FAIL", trial.number)
            study.tell(trial.number, state=TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs[attrs.RETRY_OF] for t in trials if attrs.RETRY_OF in t.user_attrs}
    enqueued = []
    for trial in trials:
        interrupted = trial.state == TrialState.FAIL and attrs.ERROR not in trial.user_attrs
        if interrupted and attrs.RETRY_OF not in trial.user_attrs and trial.number not in retried:
            study.enqueue_trial(trial.params, user_attrs={attrs.RETRY_OF: trial.number}, skip_if_exists=False)
            enqueued.append(trial.number)
    if enqueued:
        logger.warning("re-enqueued interrupted trials %s with their parameters", enqueued)
    return enqueued


def _driver_alive(driver: object) -> bool:
    """Whether the trial's driver still runs; another host's counts as gone (one driver per study)."""
    process = ProcessId.parse(driver)
    return process is not None and str(process) != driver_id() and bool(is_running(process))
