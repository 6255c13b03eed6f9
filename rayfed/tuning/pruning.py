"""Report each round's accuracy to an Optuna trial and stop the run when its pruner says so.

The pruners themselves are Optuna's, registered by name in :data:`PRUNERS` and built
with :func:`make_pruner`: ``median`` (:class:`optuna.pruners.MedianPruner`),
``successive_halving``, ``hyperband`` (resource = rounds) or ``none``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import optuna
import pyarrow as pa

from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.metrics import RoundRecord
from rayfed.util.errors import ConfigError
from rayfed.util.registry import Registry

__all__ = ["PruningCallback", "make_pruner", "PRUNERS"]

PRUNERS: Registry[Callable[[int], optuna.pruners.BasePruner]] = Registry("pruner", field="pruner")
"""Pruner name -> ``rounds -> pruner`` (``rounds``: the run's ``train.rounds``)."""


@PRUNERS.register("median")
def _median(rounds: int) -> optuna.pruners.BasePruner:
    return optuna.pruners.MedianPruner()


@PRUNERS.register("successive_halving")
def _successive_halving(rounds: int) -> optuna.pruners.BasePruner:
    return optuna.pruners.SuccessiveHalvingPruner()


@PRUNERS.register("hyperband")
def _hyperband(rounds: int) -> optuna.pruners.BasePruner:
    return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(rounds, 1))


@PRUNERS.register("none")
def _none(rounds: int) -> optuna.pruners.BasePruner:
    return optuna.pruners.NopPruner()


class PruningCallback(Callback):
    """Reports ``record.accuracy`` as the intermediate value of step ``record.round``.

    Rounds without evaluation (NaN accuracy) are skipped. When ``trial.should_prune()``
    is true the run is stopped at once (``after_round`` returns True, so the engine
    releases the trial's workers) and :attr:`pruned_round` holds the round; the caller
    then raises ``optuna.TrialPruned(f"pruned at round {pruned_round}")`` after ``run``
    returns, as optuna-integration's adapters do.
    """

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.pruned_round: int | None = None

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        if math.isnan(record.accuracy):
            return False
        self.trial.report(record.accuracy, step=record.round)
        if self.trial.should_prune():
            self.pruned_round = record.round
            return True
        return False


def make_pruner(name: str | optuna.pruners.BasePruner, *, rounds: int) -> optuna.pruners.BasePruner:
    """An Optuna pruner by name (or as given); ``rounds`` (the run's ``train.rounds``) is Hyperband's maximum resource.

    >>> type(make_pruner("median", rounds=10)).__name__
    'MedianPruner'
    """
    if isinstance(name, optuna.pruners.BasePruner):
        return name
    if not isinstance(name, str):
        raise ConfigError(
            f"pruner must be one of {', '.join(map(repr, PRUNERS.names()))} or an optuna.pruners.BasePruner, "
            f"but got pruner={name!r}"
        )
    return PRUNERS.get(name)(rounds)
