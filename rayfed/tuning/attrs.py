"""Names of the user attributes rayfed stores on trials and studies (visible in optuna-dashboard).

Trial attributes:

* ``rayfed.engine.run_dir``: the trial's run directory (config, metrics, checkpoints).
* ``rayfed.driver``: ``host:pid:start`` of the process that ran the trial (see :mod:`rayfed.tuning.resume`).
* ``rayfed.best_accuracy``, ``rayfed.final_accuracy``, ``rayfed.rounds_run``: the run's summary.
* ``rayfed.pruned_round``: the round after which the pruner stopped the trial.
* ``rayfed.error``: the error that failed the trial (a trial without it that failed was interrupted).
* ``rayfed.retry_of``: the number of the interrupted trial that this trial repeats.

Study attributes: ``rayfed.base_config`` and ``rayfed.space``, the setup a resumed study must keep;
``rayfed.plugins``, the files of its code outside rayfed with their digests
(:meth:`~rayfed.util.plugin_sources.PluginSource.record`), which a resumed study must run byte for byte unless a
change is accepted (``--accept-plugin``), and ``rayfed.plugins_accepted``, each change accepted.
"""

from __future__ import annotations

__all__ = [
    "RUN_DIR",
    "DRIVER",
    "ROUNDS_RUN",
    "PRUNED_ROUND",
    "ERROR",
    "RETRY_OF",
    "BASE_CONFIG",
    "SPACE",
    "PLUGINS",
    "PLUGINS_ACCEPTED",
]

RUN_DIR = "rayfed.engine.run_dir"  # a study's attribute name, kept as studies have recorded it
DRIVER = "rayfed.driver"
ROUNDS_RUN = "rayfed.rounds_run"
PRUNED_ROUND = "rayfed.pruned_round"
ERROR = "rayfed.error"
RETRY_OF = "rayfed.retry_of"
BASE_CONFIG = "rayfed.base_config"
SPACE = "rayfed.space"
PLUGINS = "rayfed.plugins"
PLUGINS_ACCEPTED = "rayfed.plugins_accepted"
