"""Optuna studies over any config field: search spaces, pruning, parallel trials on Ray, durable storage.

>>> from rayfed.tuning import FloatParam, tune, best_trials_table
>>> study = tune(config, {"algorithm.params.wdr_lambda": FloatParam(1, 5000, log=True)},
...              n_trials=30, study_name="lambda", parallel_trials=2)  # doctest: +SKIP
>>> print(best_trials_table(study))  # doctest: +SKIP

See ``docs/tuning.md`` for the space file format, resuming and optuna-dashboard.

The names are imported on first use (:mod:`rayfed.util.lazy`), so building the ``rayfed tune``
command line does not import the engine (torch, Ray).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfed.util.lazy import lazy_exports

if TYPE_CHECKING:  # the same names for type checkers; at run time __getattr__ imports them
    from rayfed.tuning.progress import TrialLines, round_lines  # noqa: F401
    from rayfed.tuning.pruning import PRUNERS, PruningCallback, make_pruner  # noqa: F401
    from rayfed.tuning.report import best_trials_table, write_plots  # noqa: F401
    from rayfed.tuning.resume import finished_trials, recover_interrupted  # noqa: F401
    from rayfed.tuning.space import (  # noqa: F401
        CategoricalParam,
        FloatParam,
        IntParam,
        Param,
        SearchSpace,
        load_space,
    )
    from rayfed.tuning.storage import default_storage_url, open_storage  # noqa: F401
    from rayfed.tuning.study import OBJECTIVES, SAMPLERS, tune  # noqa: F401

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "rayfed.tuning.study": ("tune", "OBJECTIVES", "SAMPLERS"),
        "rayfed.tuning.space": ("SearchSpace", "FloatParam", "IntParam", "CategoricalParam", "Param", "load_space"),
        "rayfed.tuning.pruning": ("PruningCallback", "make_pruner", "PRUNERS"),
        "rayfed.tuning.progress": ("TrialLines", "round_lines"),
        "rayfed.tuning.storage": ("open_storage", "default_storage_url"),
        "rayfed.tuning.resume": ("finished_trials", "recover_interrupted"),
        "rayfed.tuning.report": ("best_trials_table", "write_plots"),
    },
)
