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
last step it received, and rounds run again after the checkpoint (which give the same numbers) are not sent
twice. A tracker added on resume receives the earlier rounds first. An Optuna study files each trial's run
under the study (:class:`StudyLink`).

A tracker whose package is missing is refused by :func:`check_installed` before anything is written, naming
the extra that installs it.
"""

from __future__ import annotations

from rayfed.tracking.callback import Tracking
from rayfed.tracking.registry import STATE_FILE, StudyLink, check_installed

__all__ = ["Tracking", "StudyLink", "check_installed", "STATE_FILE"]
