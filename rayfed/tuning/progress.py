"""What ``rayfed tune`` prints while a study runs: a line per round of each trial, and one per finished trial.

Trials may run at once (``--parallel``), so both are lines on stderr, never bars that would overwrite each
other: each trial's run reports its rounds as ``rayfed run`` does in a log
(:class:`~rayfed.engine.callbacks.ProgressBar` with ``lines``)::

    trial_0003: 4/20 round (acc=0.8123, best=0.8200, loss=0.234, s=1.23)

and :class:`TrialLines`, an Optuna callback, says how each trial ended and where the study stands::

    trial_0003 complete: 0.8412 after 20 rounds (train.lr=0.02134); 3 of 40 trials finished, best trial_0001: 0.85
"""

from __future__ import annotations

import sys

import optuna
from optuna.trial import FrozenTrial, TrialState

import rayfed.tuning.attrs as attrs
from rayfed.engine.callbacks import Callback, ProgressBar
from rayfed.tuning.report import format_value
from rayfed.tuning.resume import finished_trials

__all__ = ["round_lines", "TrialLines", "trial_line"]


def round_lines(trial: optuna.Trial) -> list[Callback]:
    """``tune``'s ``trial_callbacks``: the trial's run prints one line per round."""
    return [ProgressBar(lines=True)]


class TrialLines:
    """``tune``'s Optuna callback: one line on stderr per trial that ends (:func:`trial_line`); ``wanted`` is the
    study's ``n_trials``. Optuna calls it for trials that complete, are pruned or fail with a caught error; an
    interrupted trial is said by the study's own last line."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        print(trial_line(study, trial, self.wanted), file=sys.stderr, flush=True)


def trial_line(study: optuna.Study, trial: FrozenTrial, wanted: int) -> str:
    """How ``trial`` ended, with its parameters, and the study's finished trials out of ``wanted`` and its best."""
    if trial.state == TrialState.COMPLETE:
        ended = (
            f"complete: {format_value(trial.value)} after {format_value(trial.user_attrs.get(attrs.ROUNDS_RUN))} rounds"
        )
    elif trial.state == TrialState.PRUNED:
        ended = f"pruned after round {format_value(trial.user_attrs.get(attrs.PRUNED_ROUND))}"
    else:
        error = trial.user_attrs.get(attrs.ERROR)
        ended = f"failed: {error}" if error else "interrupted: retried when the study resumes"
    params = ", ".join(f"{name}={format_value(value)}" for name, value in trial.params.items())
    best = _best(study)
    where = f"{len(finished_trials(study))} of {wanted} trials finished" + (
        f", best trial_{best.number:04d}: {format_value(best.value)}" if best is not None else ""
    )
    return f"trial_{trial.number:04d} {ended} ({params}); {where}"


def _best(study: optuna.Study) -> FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:  # no complete trial yet
        return None
