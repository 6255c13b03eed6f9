"""``rayfed.run_many``: several runs at once, whose concurrent stacks share one stack where they can.

Runs that may share a stack (:func:`~rayfed.execution.run_packs.pack_runs`: stacking on, a method that stacks, the
same model, sample shapes, batches, epochs, method structure and engine, while seeds, partitions, learning rates and
a method's floats differ) run together, each in a thread of its own with its whole driver, handing their stacks to
one :class:`~rayfed.execution.stack_merger.StackMerger` (:mod:`rayfed.packs.pack_threads`; docs/architecture.md,
"Runs that share one stack"). On the local backend a pack runs in this process; a pack of
``engine.backend="ray"`` runs is one Ray task with one worker's resources (:mod:`rayfed.actors.pack_host`), in which
its runs train their clients in-process (:func:`~rayfed.execution.stack_merger.training_backend`), the packs that
share a Ray at once, each where Ray places it (:mod:`rayfed.packs.ray_packs`); then the local packs, one after
another. Every other run runs as ``rayfed.run`` runs it, one after another, and the log says in one line which ran
alone and why. Packing never changes a number (each run's rounds are those of the run alone, within the stacked
path's float tolerance) and is never an error: a run records its own config, backend included, and resumes packed
or alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.engine.result import RunResult
from rayfed.execution.run_packs import pack_runs
from rayfed.packs.pack_threads import PackOutcome, run_pack
from rayfed.packs.ray_packs import run_packs_on_ray
from rayfed.tracking.runs import run

logger = logging.getLogger(__name__)

__all__ = ["run_many"]


def run_many(
    configs: Sequence[RunConfig], *, callbacks: Sequence[Sequence[Callback]] | None = None, resume: bool = False
) -> list[RunResult]:
    """Run every config of ``configs`` (or resume each from its ``run_dir``), each with its own callbacks
    (``callbacks[i]`` for ``configs[i]``: a tuner's pruning callback stops its own run alone) and trackers, as
    :func:`rayfed.run` runs one; runs that may share a stack train packed into one (module docstring). Returns
    their results in the order of ``configs``. A run that fails does not stop the others: once every run has ended,
    the first failure is raised (the others' results are in their run directories). A pack of Ray runs receives
    its runs' callbacks pickled, as Ray sends a task's arguments: each one's class importable on the pack's host, or
    defined in ``__main__`` (runs whose callbacks do not pickle train alone)."""
    configs = [RunConfig.of(config) for config in configs]
    own = [list(c) for c in callbacks] if callbacks is not None else [[] for _ in configs]
    if len(own) != len(configs):
        raise ValueError(
            f"callbacks holds {len(own)} lists for {len(configs)} configs; give one list of callbacks per config"
        )
    plan = pack_runs(configs)
    if plan.alone and len(configs) > 1:
        logger.info("rayfed.run_many: %s", plan.line([f"run {index}" for index in range(len(configs))]))
    results: list[RunResult | None] = [None] * len(configs)
    errors: list[BaseException | None] = [None] * len(configs)
    on_ray = [pack for pack in plan.packs if configs[pack[0]].engine.backend == "ray"]
    alone = list(plan.alone)
    if on_ray:
        outcomes, unsent = run_packs_on_ray(on_ray, configs, own, resume)
        for pack, outcome in outcomes.items():
            _settle(pack, outcome, results, errors)
        alone = sorted([*alone, *unsent])
    for pack in plan.packs:
        if pack not in on_ray:
            logger.info("rayfed.run_many: runs %s share one stack", ", ".join(map(str, pack)))
            _settle(pack, run_pack([configs[i] for i in pack], [own[i] for i in pack], resume), results, errors)
    for index in alone:
        try:
            results[index] = run(configs[index], callbacks=own[index], resume=resume)
        except Exception as error:  # noqa: BLE001 - raised below, once every run has ended
            errors[index] = error
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    return [result for result in results if result is not None]


def _settle(
    pack: tuple[int, ...],
    outcome: PackOutcome | BaseException,
    results: list[RunResult | None],
    errors: list[BaseException | None],
) -> None:
    """Put a pack's results and errors in their runs' places, and log where it trained and how its runs met (an
    error that kept the pack from training is each of its runs')."""
    runs = ", ".join(map(str, pack))
    if isinstance(outcome, BaseException):
        logger.warning("rayfed.run_many: runs %s could not train: %s", runs, outcome)
        for index in pack:
            errors[index] = outcome
        return
    logger.info(
        "rayfed.run_many: runs %s shared one stack in %s: %d of their stacks trained with another run's",
        runs,
        outcome.where,
        outcome.merged,
    )
    for index, result, error in zip(pack, outcome.results, outcome.errors):
        results[index], errors[index] = result, error
