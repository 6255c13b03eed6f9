"""``rayfed.run_many``: several runs at once, whose concurrent stacks share one stack where they can.

Runs that may share a stack (:func:`~rayfed.execution.run_packs.pack_runs`: the local backend, stacking on, a method
that stacks, the same model, sample shapes, batches, epochs and method structure, while seeds, partitions, learning
rates and a method's floats differ) run together, each in a thread of its own with its whole
driver, handing their stacks to one :class:`~rayfed.execution.stack_merger.StackMerger` (docs/architecture.md,
"How clients are packed into lanes"). Every other run runs as ``rayfed.run`` runs it, one after another, and the
log says in one line which ran alone and why. Packing never changes a number (each run's rounds are those of the
run alone, within the stacked path's float tolerance) and is never an error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.engine.result import RunResult
from rayfed.execution.run_packs import pack_runs
from rayfed.execution.stack_merger import StackMerger
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
    the first failure is raised (the others' results are in their run directories)."""
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
    for pack in plan.packs:
        logger.info("rayfed.run_many: runs %s share one stack", ", ".join(map(str, pack)))
        _run_pack(list(pack), configs, own, resume, results, errors)
    for index in plan.alone:
        try:
            results[index] = run(configs[index], callbacks=own[index], resume=resume)
        except Exception as error:  # noqa: BLE001 - raised below, once every run has ended
            errors[index] = error
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    return [result for result in results if result is not None]


def _run_pack(
    pack: list[int],
    configs: list[RunConfig],
    own: list[list[Callback]],
    resume: bool,
    results: list[RunResult | None],
    errors: list[BaseException | None],
) -> None:
    """Run the runs ``pack`` (positions) together, each in a thread of its own, their stacks merged."""
    merger = StackMerger()
    merger.expect(len(pack))

    def one(index: int) -> None:
        with merger.turn():
            try:
                results[index] = run(configs[index], callbacks=own[index], resume=resume)
            except BaseException as error:  # noqa: BLE001 - raised by run_many once every run has ended
                errors[index] = error

    threads = [threading.Thread(target=one, args=(index,), name=f"rayfed-run-{index}") for index in pack]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
