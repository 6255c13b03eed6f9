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
on the shared cluster and releases them when it ends or is pruned; or, where their runs may
share a stack, the trials at once train packed in one host (:mod:`rayfed.packs.lane_host`).
Only the driver talks to the Optuna storage.

>>> study = tune(config, {"train.lr": FloatParam(1e-3, 1e-1, log=True)}, n_trials=20,
...              study_name="lr", parallel_trials=2)  # doctest: +SKIP
>>> study.best_params  # doctest: +SKIP
{'train.lr': 0.0213...}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

import rayfed.tuning.attrs as attrs
from rayfed.config import RunConfig, check_installed, saved_differences
from rayfed.engine import RunResult
from rayfed.engine.callbacks import Callback
from rayfed.engine.interrupts import StudyInterrupted, was_terminated
from rayfed.packs.lane_host import lane_host
from rayfed.tracking import check_services
from rayfed.tuning.parallel import (
    OneClaimAtATime,
    TrialStop,
    check_cluster_fits,
    stopping_parallel_trials,
    stops_recorded,
    trial_workers,
)
from rayfed.tuning.pruning import check_warmup, make_pruner, warmup_rounds
from rayfed.tuning.resume import finished_trials, recover_interrupted
from rayfed.tuning.space import SearchSpace, load_space
from rayfed.tuning.storage import open_storage, storage_errors
from rayfed.tuning.study_code import check_same_code, record_code
from rayfed.tuning.trials import TrialRunner, packed, packs, quiet_interrupted_trials
from rayfed.util import plugins
from rayfed.util.errors import ConfigError

__all__ = ["tune", "OBJECTIVES", "SAMPLERS", "session_seed"]

logger = logging.getLogger(__name__)

SAMPLERS: dict[str, Callable[[int, int], optuna.samplers.BaseSampler]] = {
    "tpe": lambda seed, parallel: optuna.samplers.TPESampler(seed=seed, constant_liar=parallel > 1),
    "random": lambda seed, parallel: optuna.samplers.RandomSampler(seed=seed),
}
"""Samplers by name, each made from its seed for one session of a study (:func:`session_seed`) and the trials it
runs at once: with more than one, TPE asks for its batch with Optuna's constant liar (each running trial counts as
a bad result while the next is sampled, so a batch spreads over the space rather than asking K times for one
point)."""

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
    pruner_warmup: int | None = None,
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
        The run every trial starts from; its ``seed`` is every trial's seed and its ``run_dir`` is ignored
        (trials run in ``<study_dir>/trial_NNNN``).
    space
        A :class:`SearchSpace`, a mapping ``path -> Param | spec``, or a YAML/TOML/JSON file; validated against
        ``base_config`` before any trial runs.
    n_trials
        Finished trials wanted (complete, pruned, or failed with an error; interrupted ones are retried).
    study_name, study_dir, storage
        The study's name in the storage; the folder of its trials' run directories (default
        ``runs/tune/<study_name>``); ``None`` (``sqlite:///<study_dir>/study.db``), an Optuna storage URL,
        ``journal:///path/study.log``, or an ``optuna.storages.BaseStorage``.
    direction, objective, pruner, pruner_warmup
        ``objective`` is ``"best"`` (best round accuracy, as the papers report), ``"final"`` (last evaluated
        round), or a function of the :class:`RunResult`. Accuracies are maximised; ``direction="minimize"``
        needs a callable objective and ``pruner="none"``. ``pruner``: ``"median"``, ``"successive_halving"``,
        ``"hyperband"``, ``"none"``, or an Optuna pruner; ``pruner_warmup``: rounds before it may judge a trial.
    sampler, seed
        A name in :data:`SAMPLERS`, seeded with :func:`session_seed` of ``seed`` (default ``base_config.seed``)
        and the trials the study holds, so that a resumed study samples new points (:data:`SAMPLERS`); or an
        Optuna sampler, used as it is. With ``parallel_trials > 1`` Optuna reseeds it per thread: which parameters
        are tried is then not reproducible (each trial's result still is).
    parallel_trials, timeout_s, catch, callbacks
        Passed to ``study.optimize`` (``callbacks``: Optuna's, after each trial). Trials at once that may share a
        stack train packed (:func:`~rayfed.tuning.trials.packs`; on Ray in one host: :mod:`rayfed.packs.lane_host`);
        else on Ray each needs ``engine.num_workers`` workers, or with 0 an even share (:mod:`rayfed.tuning.parallel`).
    trial_callbacks
        ``trial -> [rayfed Callback, ...]``: extra callbacks for each trial's run.

    Raises
    ------
    ConfigError, ResourceError
        For an invalid space or argument, a study created with another base config or space, or parallel
        trials that cannot all get their Ray workers at once; nothing has run then.
    StudyInterrupted
        On Ctrl-C or SIGTERM: each running trial stops (with parallel trials, after its current round),
        checkpoints its run and is retried when the study resumes (:mod:`rayfed.tuning.trials`).
    """
    _check_arguments(n_trials, parallel_trials, study_name, direction, objective, sampler, pruner_warmup)
    with stops_recorded() as stop:  # from before anything starts, a Ctrl-C is not lost (rayfed.tuning.parallel)
        study_dir = Path(study_dir if study_dir is not None else Path("runs") / "tune" / study_name)
        space, resolved_pruner = _checked_setup(base_config, space, pruner, direction, study_dir)
        study = _opened_study(base_config, space, study_name, study_dir, storage, direction, resolved_pruner)
        study.sampler = _sampler(study, sampler, base_config.seed if seed is None else seed, parallel_trials)
        remaining = n_trials - len(finished_trials(study))
        if remaining <= 0:
            logger.info("study %r already holds %d finished trials; nothing to run", study_name, n_trials - remaining)
            return study
        runner = _runner(base_config, space, study_name, study_dir, objective, trial_callbacks, stop, pruner_warmup)
        options = {"n_trials": remaining, "timeout": timeout_s, "catch": catch, "callbacks": list(callbacks)}
        try:
            _run_trials(study, runner, parallel_trials, options)
        except KeyboardInterrupt as error:  # each interrupted trial checkpointed its run and is retried on resume
            finished = len(finished_trials(study))
            raise StudyInterrupted(study_name, finished, n_trials, terminated=was_terminated(error)) from None
        return study


def _checked_setup(
    base: RunConfig,
    space: SearchSpace | Mapping[str, Any] | str | Path,
    pruner: str | optuna.pruners.BasePruner,
    direction: str,
    study_dir: Path,
) -> tuple[SearchSpace, optuna.pruners.BasePruner]:
    """Everything checked before the study's storage is written: the trackers, the search space (read and
    validated against ``base``), the pruner, and on Ray the cluster to join or this machine."""
    check_installed(base.engine.loggers)
    space = _checked_space(space, base)
    resolved_pruner = _checked_pruner(pruner, direction, base)
    check_services(base.engine.loggers, study_dir)
    if base.engine.backend == "ray":
        from rayfed.actors import check_resources

        check_resources(base.engine)
    return space, resolved_pruner


def _checked_space(space: SearchSpace | Mapping[str, Any] | str | Path, base: RunConfig) -> SearchSpace:
    """The search space, read from its file or mapping and validated against the base config."""
    space = load_space(space) if isinstance(space, (str, Path)) else space
    space = space if isinstance(space, SearchSpace) else SearchSpace(space)
    space.validate(base)
    return space


def _checked_pruner(
    pruner: str | optuna.pruners.BasePruner, direction: str, base: RunConfig
) -> optuna.pruners.BasePruner:
    """The pruner by name or as given; a minimised objective takes none (pruners compare round accuracies)."""
    resolved = make_pruner(pruner, rounds=base.train.rounds)
    if direction == "minimize" and not isinstance(resolved, optuna.pruners.NopPruner):
        raise ConfigError(
            "direction='minimize' needs pruner='none': pruners compare round accuracies, which are maximised"
        )
    return resolved


def _opened_study(
    base: RunConfig,
    space: SearchSpace,
    study_name: str,
    study_dir: Path,
    storage: str | BaseStorage | None,
    direction: Literal["maximize", "minimize"],
    pruner: optuna.pruners.BasePruner,
) -> optuna.Study:
    """The study, created or loaded from its storage, checked to be this setup's, its interrupted trials
    re-enqueued (:func:`~rayfed.tuning.resume.recover_interrupted`)."""
    with storage_errors(storage, study_dir):
        opened = open_storage(storage, study_dir)
        optuna.create_study(
            storage=opened, pruner=pruner, study_name=study_name, direction=direction, load_if_exists=True
        )
        study = OneClaimAtATime(study_name=study_name, storage=opened, pruner=pruner)
    _check_same_study(study, base, space, direction)
    _check_trial_dirs(study, study_dir)
    recover_interrupted(study)
    return study


def _sampler(
    study: optuna.Study, sampler: str | optuna.samplers.BaseSampler, seed: int, parallel: int
) -> optuna.samplers.BaseSampler:
    """An Optuna sampler as given; a sampler's name, made with this session's seed (:func:`session_seed`) for
    ``parallel`` trials at once (:data:`SAMPLERS`)."""
    if not isinstance(sampler, str):
        return sampler
    told = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))
    return SAMPLERS[sampler](session_seed(seed, told), parallel)


def _runner(
    base: RunConfig,
    space: SearchSpace,
    study_name: str,
    study_dir: Path,
    objective: str | Callable[[RunResult], float],
    trial_callbacks: Callable[[optuna.Trial], Sequence[Callback]] | None,
    stop: TrialStop,
    pruner_warmup: int | None,
) -> TrialRunner:
    """The study's objective: each trial a run scored by ``objective``, its pruner judging it after its warm-up
    (``pruner_warmup``, else a quarter of the rounds: :func:`~rayfed.tuning.pruning.warmup_rounds`)."""
    score = OBJECTIVES[objective] if isinstance(objective, str) else objective
    parent = _mlflow_parent(base, space, study_name, study_dir)
    warmup = warmup_rounds(pruner_warmup, base.train.rounds)
    return TrialRunner(
        base, space, study_name, study_dir, score, trial_callbacks, parent, stop=stop, warmup_rounds=warmup
    )


def _mlflow_parent(base: RunConfig, space: SearchSpace, study_name: str, study_dir: Path) -> str | None:
    """The study's own MLflow run, in which each trial's is nested, with MLflow among ``engine.loggers``."""
    if "mlflow" not in base.engine.loggers:
        return None
    from rayfed.tracking.mlflow_tracker import study_run

    return study_run(study_name, study_dir, {"space": space.to_dict(), **base.to_dict()})


def _run_trials(study: optuna.Study, runner: TrialRunner, parallel_trials: int, options: dict[str, Any]) -> None:
    """Run the study's trials: in this process, or on one Ray for the whole study (joined or started here), on
    which trials at once train packed in one host (:mod:`rayfed.packs.lane_host`) where their runs may share a
    stack, else each trial's run gets its share of the workers (:mod:`rayfed.tuning.parallel`)."""
    base = runner.base
    if base.engine.backend == "local":
        _optimize(study, packed(runner, parallel_trials), parallel_trials, options)
        return
    from rayfed.actors import ray_session

    with ray_session(base.engine, plugins.run_sources(base)):
        if packs(runner, parallel_trials):  # the trials' runs as lanes of one stack in one host
            with lane_host(base.engine, parallel_trials) as host:
                _optimize(study, replace(runner, host=host), parallel_trials, options)
            return
        trial_base = base.override(trial_workers(base.engine, parallel_trials))
        check_cluster_fits(trial_base.engine, parallel_trials)
        _optimize(study, replace(runner, base=trial_base), parallel_trials, options)


def _optimize(study: optuna.Study, runner: TrialRunner, parallel_trials: int, options: dict[str, Any]) -> None:
    """``study.optimize`` over ``runner``. Ctrl-C stops the running trials after their round, quietly; raises a
    KeyboardInterrupt once they have (:class:`~rayfed.tuning.parallel.TrialStop`)."""
    with stopping_parallel_trials(runner.stop, parallel_trials), quiet_interrupted_trials(runner.interrupted):
        study.optimize(runner, n_jobs=parallel_trials, **options)
    if runner.stop.is_set():  # Optuna's loop can end with every stopped trial's interruption left in its thread
        raise runner.stop.interruption()


def session_seed(seed: int, told: int) -> int:
    """The sampler's seed for a session of a study that already holds ``told`` finished trials: ``seed`` for a
    new study, else a seed drawn from both (``numpy.random.SeedSequence``), so that each session continues
    the search with new points rather than replaying the first session's."""
    if told == 0:
        return seed
    return int(np.random.SeedSequence([seed, told]).generate_state(1)[0])


def _check_arguments(
    n_trials: int,
    parallel_trials: int,
    study_name: str,
    direction: str,
    objective: str | Callable[..., float],
    sampler: str | optuna.samplers.BaseSampler,
    pruner_warmup: int | None,
) -> None:
    if pruner_warmup is not None:
        check_warmup(pruner_warmup, "pruner_warmup")
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
