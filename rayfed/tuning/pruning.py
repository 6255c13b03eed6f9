"""Report each round's accuracy to an Optuna trial and stop the run when its pruner says so.

The pruners themselves are Optuna's, registered by name in :data:`PRUNERS` and built
with :func:`make_pruner`: ``median`` (:class:`optuna.pruners.MedianPruner`),
``successive_halving``, ``hyperband`` (resource = rounds) or ``none``.

A pruner judges a trial only after its **warm-up rounds** (:func:`default_warmup`: a quarter of the run's rounds
unless told): a federated run's first rounds are noisy, most of all at a high learning rate on non-IID clients, and
a pruner that judges them stops good trials (``rayfed tune --pruner median`` without a warm-up pruned 7 of 14
trials after their first round, one at almost the best learning rate). Every round is still reported, so the
pruner compares the trials' later rounds with the others' at the same round.
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

__all__ = ["PruningCallback", "make_pruner", "PRUNERS", "default_warmup", "check_warmup", "warmup_rounds"]

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


def default_warmup(rounds: int) -> int:
    """Warm-up rounds of a run of ``rounds`` rounds unless told: a quarter of them, rounded down (none under 4).

    >>> default_warmup(50), default_warmup(3)
    (12, 0)
    """
    return rounds // 4


def check_warmup(warmup_rounds: object, field: str = "warmup_rounds") -> int:
    """``warmup_rounds`` as it is when it is an integer >= 0; else a ConfigError naming ``field``."""
    if isinstance(warmup_rounds, bool) or not isinstance(warmup_rounds, int) or warmup_rounds < 0:
        raise ConfigError(
            f"{field} must be an integer >= 0 (rounds a trial trains before the pruner may stop it; 0: from its "
            f"first round), but got {field}={warmup_rounds!r}"
        )
    return warmup_rounds


def warmup_rounds(told: int | None, rounds: int) -> int:
    """The warm-up rounds of ``tune(pruner_warmup=told)`` for runs of ``rounds``: ``told`` when it is an integer
    >= 0 (else a ConfigError naming ``pruner_warmup``), :func:`default_warmup` when None."""
    return default_warmup(rounds) if told is None else check_warmup(told, "pruner_warmup")


class PruningCallback(Callback):
    """Reports ``record.accuracy`` as the intermediate value of step ``record.round``; asks the pruner only once the
    trial has trained more than ``warmup_rounds`` rounds (rounds 0 .. warmup_rounds - 1 are never judged, as
    Optuna's ``n_warmup_steps``, and neither is the initial evaluation, round -1).

    Rounds without evaluation (NaN accuracy) are skipped. When ``trial.should_prune()``
    is true the run is stopped at once (``after_round`` returns True, so the engine
    releases the trial's workers) and :attr:`pruned_round` holds the round; the caller
    then raises ``optuna.TrialPruned(f"pruned at round {pruned_round}")`` after ``run``
    returns, as optuna-integration's adapters do.
    """

    def __init__(self, trial: optuna.Trial, warmup_rounds: int = 0) -> None:
        self.trial = trial
        self.warmup_rounds = check_warmup(warmup_rounds)
        self.pruned_round: int | None = None

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        return self.judge(record)

    def judge(self, record: RoundRecord) -> bool:
        """Report ``record`` to the trial; whether its pruner stops it there (where the run trains elsewhere,
        :mod:`rayfed.packs.lane_host`, the driver judges its rounds with this)."""
        if math.isnan(record.accuracy):
            return False
        self.trial.report(record.accuracy, step=record.round)
        if record.round >= self.warmup_rounds and self.trial.should_prune():
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
