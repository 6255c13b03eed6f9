"""``tune``: an Optuna study whose trials are ordinary rayfed runs.

Each trial is ``run(base_config.override(params))`` with the same seed as the base
config and its own run directory ``<study_dir>/trial_0003``. Every round's pooled
accuracy is reported to the trial (:class:`~rayfed.tuning.pruning.PruningCallback`),
so Optuna's pruner can stop a bad trial early; the study lives in durable storage
(:mod:`rayfed.tuning.storage`) and resumes where it stopped (:mod:`rayfed.tuning.resume`).

Parallel trials run in driver threads (``study.optimize(n_jobs=parallel_trials)``).
Ray is joined or started once for the whole study; each trial's run creates its own
``ClientWorker`` actors (``engine.num_workers`` x ``engine.num_cpus_per_worker``, or with
``engine.num_workers=0`` an even share of the cluster's workers: :mod:`rayfed.tuning.parallel`)
on the shared cluster and releases them when it ends or is pruned. Only the driver
talks to the Optuna storage.

>>> study = tune(config, {"train.lr": FloatParam(1e-3, 1e-1, log=True)}, n_trials=20,
...              study_name="lr", parallel_trials=2)  # doctest: +SKIP
>>> study.best_params  # doctest: +SKIP
{'train.lr': 0.0213...}
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
import pyarrow as pa
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

import rayfed.tuning.attrs as attrs
from rayfed.config import RunConfig, check_installed, saved_differences
from rayfed.engine import RunResult, run
from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.interrupts import StudyInterrupted, was_terminated
from rayfed.engine.metrics import RoundRecord
from rayfed.tracking import StudyLink, Tracking, check_services
from rayfed.tuning.parallel import stopping_parallel_trials
from rayfed.tuning.pruning import PruningCallback, make_pruner
from rayfed.tuning.resume import driver_id, finished_trials, recover_interrupted
from rayfed.tuning.space import SearchSpace, load_space
from rayfed.tuning.storage import open_storage, storage_errors
from rayfed.tuning.study_code import check_same_code, record_code
from rayfed.util import plugins
from rayfed.util.errors import ConfigError

__all__ = ["tune", "OBJECTIVES", "SAMPLERS", "session_seed"]

logger = logging.getLogger(__name__)

SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed),
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
}
"""Samplers by name, each made from its seed for one session of a study (:func:`session_seed`)."""

OBJECTIVES: dict[str, Callable[[RunResult], float]] = {
    "best": lambda result: result.best_accuracy,
    "final": lambda result: result.final_accuracy,
}
_LAYOUT_ONLY = ("engine.", "run_dir", "plugins")  # may change between sessions of one study: they do not change results


def tune(
    base_config: RunConfig,
    space: SearchSpace | Mapping[str, Any] | str | Path,
    *,
    n_trials: int,
    study_name: str = "rayfed",
    study_dir: str | Path | None = None,
    storage: str | BaseStorage | None = None,
    direction: Literal["maximize", "minimize"] = "maximize",
    objective: str | Callable[[RunResult], float] = "best",
    pruner: str | optuna.pruners.BasePruner = "median",
    sampler: str | optuna.samplers.BaseSampler = "tpe",
    seed: int | None = None,
    parallel_trials: int = 1,
    timeout_s: float | None = None,
    catch: tuple[type[Exception], ...] = (),
    callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
    trial_callbacks: Callable[[optuna.Trial], Sequence[Callback]] | None = None,
) -> optuna.Study:
    """Run (or resume) a study until it holds ``n_trials`` finished trials; return it.

    Parameters
    ----------
    base_config
        The run every trial starts from; its ``seed`` is every trial's seed and its
        ``run_dir`` is ignored (trials run in ``<study_dir>/trial_NNNN``).
    space
        A :class:`SearchSpace`, a mapping ``path -> Param | spec``, or a YAML/TOML/JSON
        file; validated against ``base_config`` before any trial runs.
    n_trials
        Finished trials wanted (complete, pruned, or failed with an error). Trials
        finished by an earlier session of the study count; interrupted ones are retried.
    study_name, study_dir
        The study's name in the storage, and the folder of its trials' run directories
        (default ``runs/tune/<study_name>``).
    storage
        ``None`` (``sqlite:///<study_dir>/study.db``), an Optuna storage URL,
        ``journal:///path/study.log``, or an ``optuna.storages.BaseStorage``.
    direction, objective
        ``objective`` is ``"best"`` (best round accuracy, as the papers report),
        ``"final"`` (last evaluated round), or a function of the :class:`RunResult`.
        Accuracy objectives are maximised; ``direction="minimize"`` needs a callable
        objective and ``pruner="none"`` (the pruner sees round accuracies).
    pruner
        ``"median"``, ``"successive_halving"``, ``"hyperband"``, ``"none"``, or an Optuna pruner.
    sampler, seed
        A name in :data:`SAMPLERS` (``"tpe"``, the default, or ``"random"``), seeded for this session
        with :func:`session_seed` of ``seed`` (default ``base_config.seed``) and the trials the study
        already holds, so a resumed or extended study samples new points instead of proposing the
        earlier trials' parameters again; or an Optuna sampler, used as it is (its state is the
        caller's). With ``parallel_trials > 1`` Optuna reseeds the sampler per thread, so which
        parameters are tried is no longer reproducible (each trial's result still is).
    parallel_trials
        Trials running at once. With ``engine.backend="ray"`` each needs ``engine.num_workers`` x
        ``engine.num_cpus_per_worker`` CPUs; with ``engine.num_workers=0`` each takes an even share of the
        workers the cluster holds.
    timeout_s, catch, callbacks
        Passed to ``study.optimize`` (``callbacks`` are Optuna's, called after each trial).
    trial_callbacks
        ``trial -> [rayfed Callback, ...]``: extra callbacks for each trial's run.

    Raises
    ------
    ConfigError
        For an invalid space or argument, or an existing study created with another
        base config or space; nothing has run then.
    ResourceError
        When ``parallel_trials`` trials cannot all get their Ray workers at once (or a worker each).
    StudyInterrupted
        On Ctrl-C (a KeyboardInterrupt): each running trial stops (with parallel trials, after its
        current round), checkpoints its run and is retried when the study resumes.
    """
    _check_arguments(n_trials, parallel_trials, study_name, direction, objective, sampler)
    check_installed(base_config.engine.loggers)
    objective_fn = OBJECTIVES[objective] if isinstance(objective, str) else objective
    space = load_space(space) if isinstance(space, (str, Path)) else space
    space = space if isinstance(space, SearchSpace) else SearchSpace(space)
    space.validate(base_config)
    resolved_pruner = make_pruner(pruner, rounds=base_config.train.rounds)
    if direction == "minimize" and not isinstance(resolved_pruner, optuna.pruners.NopPruner):
        raise ConfigError(
            "direction='minimize' needs pruner='none': pruners compare round accuracies, which are maximised"
        )
    study_dir = Path(study_dir if study_dir is not None else Path("runs") / "tune" / study_name)
    check_services(base_config.engine.loggers, study_dir)
    if base_config.engine.backend == "ray":  # the cluster refused before the storage is written
        from rayfed.actors import check_resources

        check_resources(base_config.engine)
    with storage_errors(storage, study_dir):
        study = optuna.create_study(
            storage=open_storage(storage, study_dir),
            sampler=None if isinstance(sampler, str) else sampler,
            pruner=resolved_pruner,
            study_name=study_name,
            direction=direction,
            load_if_exists=True,
        )
    _check_same_study(study, base_config, space, direction)
    _check_trial_dirs(study, study_dir)
    recover_interrupted(study)
    if isinstance(sampler, str):
        told = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))
        study.sampler = SAMPLERS[sampler](session_seed(base_config.seed if seed is None else seed, told))
    remaining = n_trials - len(finished_trials(study))
    if remaining <= 0:
        logger.info("study %r already holds %d finished trials; nothing to run", study_name, n_trials - remaining)
        return study
    parent = None
    if "mlflow" in base_config.engine.loggers:
        from rayfed.tracking.mlflow_tracker import study_run

        parent = study_run(study_name, study_dir, {"space": space.to_dict(), **base_config.to_dict()})

    def optimize(base: RunConfig) -> None:
        runner = _TrialRunner(base, space, study_name, study_dir, objective_fn, trial_callbacks, parent)
        with stopping_parallel_trials(runner.stop, parallel_trials), _quiet_interrupted_trials(runner.interrupted):
            study.optimize(
                runner,
                n_trials=remaining,
                n_jobs=parallel_trials,
                timeout=timeout_s,
                catch=catch,
                callbacks=list(callbacks),
            )

    try:
        if base_config.engine.backend == "local":
            optimize(base_config)
            return study
        from rayfed.actors import ray_session
        from rayfed.tuning.parallel import check_cluster_fits, trial_workers

        # one Ray for the whole study; each trial's run reuses it
        with ray_session(base_config.engine, plugins.run_sources(base_config)):
            trial_base = base_config.override(trial_workers(base_config.engine, parallel_trials))
            check_cluster_fits(trial_base.engine, parallel_trials)
            optimize(trial_base)
        return study
    except KeyboardInterrupt as stop:  # each interrupted trial checkpointed its run and is retried on resume
        finished = len(finished_trials(study))
        raise StudyInterrupted(study_name, finished, n_trials, terminated=was_terminated(stop)) from None


def session_seed(seed: int, told: int) -> int:
    """The sampler's seed for a session of a study that already holds ``told`` finished trials: ``seed`` for a
    new study, else a seed drawn from both (``numpy.random.SeedSequence``), so that each session continues
    the search with new points rather than replaying the first session's."""
    if told == 0:
        return seed
    return int(np.random.SeedSequence([seed, told]).generate_state(1)[0])


class _TrialRunner:
    """The objective: one run per trial, reporting rounds, stopping when pruned."""

    def __init__(
        self,
        base: RunConfig,
        space: SearchSpace,
        study_name: str,
        study_dir: Path,
        objective: Callable[[RunResult], float],
        trial_callbacks: Callable[[optuna.Trial], Sequence[Callback]] | None,
        mlflow_parent_run_id: str | None,
    ) -> None:
        self.base, self.space, self.study_name, self.study_dir = base, space, study_name, study_dir
        self.objective, self.trial_callbacks = objective, trial_callbacks
        self.mlflow_parent_run_id = mlflow_parent_run_id
        """The study's own MLflow run, in which each trial's is nested (with MLflow among engine.loggers)."""
        self.driver = driver_id()
        self.stop = threading.Event()
        """Set by Ctrl-C while trials run in threads: each stops after its current round."""
        self.interrupted: set[int] = set()
        """Numbers of the trials stopped by Ctrl-C (retried when the study resumes)."""

    def __call__(self, trial: optuna.Trial) -> float:
        try:
            return self._trial(trial)
        except KeyboardInterrupt:  # in its run or around it (Ctrl-C between two trials lands in one of them)
            self.interrupted.add(trial.number)
            raise

    def _trial(self, trial: optuna.Trial) -> float:
        trial.set_user_attr(attrs.DRIVER, self.driver)
        params = self.space.suggest(trial)
        run_dir = (self.study_dir / f"trial_{trial.number:04d}").resolve()
        trial.set_user_attr(attrs.RUN_DIR, str(run_dir))
        pruning = PruningCallback(trial)
        extra = list(self.trial_callbacks(trial)) if self.trial_callbacks else []
        callbacks = [pruning, _StopWhenSet(self.stop), *extra]
        if self.base.engine.loggers:
            link = StudyLink(self.study_name, self.study_dir, trial.number, self.mlflow_parent_run_id)
            callbacks.append(Tracking(self.base.engine.loggers, link))
        try:
            result = run(self.base.override({**params, "run_dir": str(run_dir)}), callbacks=callbacks)
        except Exception as e:  # an error, not an interruption: the trial counts as finished and is not retried
            trial.set_user_attr(attrs.ERROR, f"{type(e).__name__}: {e}")
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


class _StopWhenSet(Callback):
    """Ends a trial's run after its current round once ``stop`` is set, as Ctrl-C would (KeyboardInterrupt)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        if self.stop.is_set():
            raise KeyboardInterrupt
        return False


@contextmanager
def _quiet_interrupted_trials(interrupted: set[int]) -> Iterator[None]:
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


def _check_arguments(
    n_trials: int,
    parallel_trials: int,
    study_name: str,
    direction: str,
    objective: str | Callable[..., float],
    sampler: str | optuna.samplers.BaseSampler,
) -> None:
    if isinstance(sampler, str) and sampler not in SAMPLERS:
        raise ConfigError(
            f"sampler must be one of {', '.join(map(repr, SAMPLERS))} or an Optuna sampler, but got sampler={sampler!r}"
        )
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(f"n_trials must be an integer >= 1, but got n_trials={n_trials!r}")
    if isinstance(parallel_trials, bool) or not isinstance(parallel_trials, int) or parallel_trials < 1:
        raise ConfigError(f"parallel_trials must be an integer >= 1, but got parallel_trials={parallel_trials!r}")
    if not isinstance(study_name, str) or not study_name:
        raise ConfigError(f"study_name must be a non-empty string, but got study_name={study_name!r}")
    if direction not in ("maximize", "minimize"):
        raise ConfigError(f"direction must be 'maximize' or 'minimize', but got direction={direction!r}")
    if isinstance(objective, str):
        if objective not in OBJECTIVES:
            raise ConfigError(
                f"objective must be one of {', '.join(map(repr, OBJECTIVES))} or a function of the RunResult, "
                f"but got objective={objective!r}"
            )
        if direction != "maximize":
            raise ConfigError(
                f"objective={objective!r} is an accuracy and is maximised, but got direction={direction!r}"
            )
    elif not callable(objective):
        raise ConfigError(f"objective must be a name or a function of the RunResult, but got objective={objective!r}")


def _check_same_study(study: optuna.Study, base: RunConfig, space: SearchSpace, direction: str) -> None:
    """A resumed study must keep its base config (engine layout aside, compared as data: nothing it names is
    imported), space, direction and code outside rayfed (:mod:`rayfed.tuning.study_code`)."""
    if study.direction.name.lower() != direction:
        raise ConfigError(
            f"study {study.study_name!r} exists with direction={study.direction.name.lower()!r}, "
            f"but got direction={direction!r}; choose another study_name"
        )
    saved = study.user_attrs
    spec = space.to_dict()
    if attrs.BASE_CONFIG not in saved:
        study.set_user_attr(attrs.BASE_CONFIG, json.loads(base.to_json()))
        study.set_user_attr(attrs.SPACE, spec)
        record_code(study, base)
        return
    check_same_code(study, base)
    changed = saved_differences(saved[attrs.BASE_CONFIG], base, ignore=_LAYOUT_ONLY)
    changed += _space_changes(saved.get(attrs.SPACE) or {}, spec)
    if changed:
        raise ConfigError(
            f"study {study.study_name!r} was created with another base config or search space "
            f"({'; '.join(changed)}); only engine.* may change when a study resumes. "
            "Choose another study_name for the new setup"
        )


def _space_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"space <path>: old -> new"`` for each searched field whose distribution differs (``SearchSpace.to_dict``)."""
    return [
        f"space {path}: {old.get(path)!r} -> {new.get(path)!r}"
        for path in sorted(set(old) | set(new))
        if old.get(path) != new.get(path)
    ]


def _check_trial_dirs(study: optuna.Study, study_dir: Path) -> None:
    """Refuse a study_dir holding trial directories that are not this study's (another study's results)."""
    known = {t.number for t in study.get_trials(deepcopy=False)}
    foreign = sorted(p.name for p in study_dir.glob("trial_*") if p.is_dir() and _number(p.name) not in known)
    if foreign:
        raise ConfigError(
            f"study_dir={str(study_dir)!r} holds run directories that are not trials of study "
            f"{study.study_name!r} ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
            "choose another study_dir, or the storage that holds those trials"
        )


def _number(name: str) -> int | None:
    tail = name.removeprefix("trial_")
    return int(tail) if tail.isdigit() else None
