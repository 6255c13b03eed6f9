"""``rayfed.run_many``: several runs at once, whose concurrent stacks share one stack where they can.

Runs that may share a stack (:func:`pack_plan`: the local backend, stacking on, a method that stacks, the same model,
dataset and local training but for the learning rate) run together, each in a thread of its own with its whole
driver, handing their stacks to one :class:`~rayfed.execution.stack_merger.StackMerger` (docs/architecture.md,
"How clients are packed into lanes"). Every other run runs as ``rayfed.run`` runs it, one after another, and the
log says in one line which ran alone and why. Packing never changes a number (each run's rounds are those of the
run alone, within the stacked path's float tolerance) and is never an error.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Hashable, Sequence

from rayfed.algorithms import resolve
from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.engine.result import RunResult
from rayfed.execution.client_runner import resolve_vectorize
from rayfed.execution.devices import pick_device
from rayfed.execution.stack_merger import StackMerger
from rayfed.tracking.runs import run

logger = logging.getLogger(__name__)

__all__ = ["run_many", "pack_plan", "PackPlan"]


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """Which of a list of runs share a stack (``packs``: groups of two or more positions) and which run alone
    (``alone``: position -> why)."""

    packs: list[list[int]]
    alone: dict[int, str]

    def line(self) -> str:
        """The one line the log gives of the runs that run alone, "" when every run packs."""
        if not self.alone:
            return ""
        reasons: dict[str, list[int]] = {}
        for index, reason in self.alone.items():
            reasons.setdefault(reason, []).append(index)
        parts = [f"run{'s' * (len(i) > 1)} {', '.join(map(str, i))}: {reason}" for reason, i in reasons.items()]
        return f"rayfed.run_many: {len(self.alone)} of the runs ran alone ({'; '.join(parts)})"


def _why_alone(config: RunConfig) -> str:
    """Why ``config`` cannot share a stack with another run ("" where it can)."""
    engine = config.engine
    if engine.backend != "local":
        return f"engine.backend={engine.backend!r} (runs share a stack on the local backend only)"
    if not resolve_vectorize(engine.vectorize, pick_device(engine.num_gpus_per_worker)):
        return f"engine.vectorize={engine.vectorize!r} trains one client at a time on this device"
    if not resolve(config.algorithm).capabilities.stacks:
        return f"algorithm {config.algorithm.name!r} does not stack its clients"
    return ""


def _pack_key(config: RunConfig) -> Hashable:
    """What runs sharing a stack have in common: their model, dataset and local training but for the rate."""
    train = dataclasses.replace(config.train, lr=1.0, lr_decay=1.0, rounds=1)
    return (
        repr(config.model),
        config.data.dataset,
        repr(train),
        config.algorithm.name,
        config.engine.num_gpus_per_worker > 0,
    )


def pack_plan(configs: Sequence[RunConfig]) -> PackPlan:
    """Group ``configs`` into runs that share a stack and runs that run alone, with the reason."""
    alone: dict[int, str] = {}
    groups: dict[Hashable, list[int]] = {}
    for index, config in enumerate(configs):
        reason = _why_alone(config)
        if reason:
            alone[index] = reason
        else:
            groups.setdefault(_pack_key(config), []).append(index)
    packs = [group for group in groups.values() if len(group) > 1]
    for group in groups.values():
        if len(group) == 1:
            alone[group[0]] = "no other run has its model, dataset, method and local training"
    return PackPlan(packs, dict(sorted(alone.items())))


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
    plan = pack_plan(configs)
    if plan.alone and len(configs) > 1:
        logger.info(plan.line())
    results: list[RunResult | None] = [None] * len(configs)
    errors: list[BaseException | None] = [None] * len(configs)
    for pack in plan.packs:
        logger.info("rayfed.run_many: runs %s share one stack", ", ".join(map(str, pack)))
        _run_pack(pack, configs, own, resume, results, errors)
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
