"""Optuna studies over any config field: search spaces, pruning, parallel trials on Ray, durable storage.

>>> from rayfed.tuning import FloatParam, tune, best_trials_table
>>> study = tune(config, {"algorithm.params.wdr_lambda": FloatParam(1, 5000, log=True)},
...              n_trials=30, study_name="lambda", parallel_trials=2)  # doctest: +SKIP
>>> print(best_trials_table(study))  # doctest: +SKIP

See ``docs/tuning.md`` for the space file format, resuming and optuna-dashboard.
"""

from rayfed.tuning.pruning import PRUNERS, PruningCallback, make_pruner
from rayfed.tuning.report import best_trials_table, write_plots
from rayfed.tuning.resume import finished_trials, recover_interrupted
from rayfed.tuning.space import CategoricalParam, FloatParam, IntParam, Param, SearchSpace, load_space
from rayfed.tuning.storage import default_storage_url, open_storage
from rayfed.tuning.study import OBJECTIVES, tune

__all__ = [
    "tune",
    "OBJECTIVES",
    "SearchSpace",
    "FloatParam",
    "IntParam",
    "CategoricalParam",
    "Param",
    "load_space",
    "PruningCallback",
    "make_pruner",
    "PRUNERS",
    "open_storage",
    "default_storage_url",
    "finished_trials",
    "recover_interrupted",
    "best_trials_table",
    "write_plots",
]
