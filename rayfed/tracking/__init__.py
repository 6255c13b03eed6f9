"""Runs shown in the experiment trackers researchers already use: TensorBoard, MLflow, Weights & Biases.

``engine.loggers`` names the trackers (:data:`rayfed.config.TRACKERS`); the run's :class:`Tracking` callback
then gives each of them, through the tool's own library:

* every round's metrics, named as the columns of ``rounds.parquet`` (``accuracy``, ``train_loss``, ...), at
  step = the round counted from 1 as the progress bar counts it (the initial model, ``engine.eval_initial``,
  at step 0); a metric a round has not (NaN: no evaluation that round) is left out;
* the run's config as hyper-parameters (dotted field paths);
* per-client distributions where the tool has them (TensorBoard and W&B histograms of each round's client
  accuracies, training losses and update norms);
* when the run finishes, its figures (``rayfed plot``'s, drawn into ``<run_dir>/figures``).

A resumed run appends to the same logged run: ``<run_dir>/tracking.json`` keeps each tracker's run id and the
last step the tool confirmed holding (its writes flushed and checked, :mod:`rayfed.tracking.state`), so a run
killed at any moment resumes by sending each tracker the rounds it lacks, none twice; a tracker added on resume
receives the earlier rounds first, and a ``tracking.json`` lost is rebuilt from the trackers' own records. An
Optuna study files each trial's run under the study (:class:`StudyLink`).

The engine knows no tracker: :func:`run` (``rayfed.run``, ``rayfed run``) adds the :class:`Tracking` callback.
A tracker whose package is missing is refused by the plan (:func:`rayfed.config.check_installed`), and one
whose folder, settings or ``tracking.json`` cannot take the run by :meth:`Tracking.before_run`, before
anything is written, each in one line naming the fix.
"""

from __future__ import annotations

from rayfed.tracking.callback import Tracking
from rayfed.tracking.runs import run, with_trackers
from rayfed.tracking.state import STATE_FILE
from rayfed.tracking.study_link import StudyLink
from rayfed.tracking.tools import check_services

__all__ = ["Tracking", "StudyLink", "STATE_FILE", "check_services", "run", "with_trackers"]
