"""The plain pack runner: the runs of one pack, each in a thread of its own with its whole driver, their stacks
merged by one :class:`~rayfed.execution.stack_merger.StackMerger`; in the caller's process (the local backend) or
in a pack's host on Ray (:func:`hosted_pack`, which :mod:`rayfed.actors.pack_host` runs)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle

from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.engine.result import RunResult
from rayfed.execution.stack_merger import StackMerger
from rayfed.tracking.runs import run
from rayfed.util.errors import ConfigError
from rayfed.util.plugins import WithCode

__all__ = ["PackOutcome", "run_pack", "hosted_pack"]


@dataclass
class PackOutcome:
    """What the runs of one pack gave: each run's result or error (in the pack's order), and how they met."""

    results: list[RunResult | None]
    errors: list[BaseException | None]
    merged: int = 0
    """Stacks trained with another run's (:attr:`StackMerger.merged`): that the runs really shared stacks."""
    where: str = field(default="this process")
    """Where the pack trained, in words."""


def run_pack(configs: Sequence[RunConfig], callbacks: Sequence[Sequence[Callback]], resume: bool) -> PackOutcome:
    """Run (or resume) ``configs`` together, each with its ``callbacks`` in a thread of its own as
    :func:`rayfed.run` runs it, their stacks merged; a run that fails leaves the others to finish."""
    merger = StackMerger()
    merger.expect(len(configs))
    outcome = PackOutcome([None] * len(configs), [None] * len(configs))

    def one(index: int) -> None:
        with merger.turn():
            try:
                outcome.results[index] = run(configs[index], callbacks=callbacks[index], resume=resume)
            except BaseException as error:  # noqa: BLE001 - raised by run_many once every run has ended
                outcome.errors[index] = error

    threads = [threading.Thread(target=one, args=(index,), name=f"rayfed-run-{index}") for index in range(len(configs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcome.merged = merger.merged
    return outcome


def hosted_pack(runs: Sequence[tuple[WithCode, Sequence[Callback]]], resume: bool, cwd: str) -> PackOutcome:
    """:func:`run_pack` as a pack's host on Ray runs it: each config received with its code, in the driver's
    working directory ``cwd`` (relative run directories and data roots mean there what they mean to the driver),
    every error made one the driver can unpickle."""
    from rayfed.actors.pack_host import where

    configs = [shipped.config for shipped, _ in runs]
    if not Path(cwd).is_dir():
        missing = ConfigError(
            f"the pack's host on {where()} has no folder {cwd!r}, the driver's working directory: on a Ray cluster "
            "of several nodes, keep the runs' directories on storage every node mounts at the same path, and start "
            "the driver there"
        )
        return PackOutcome([None] * len(configs), [missing] * len(configs), where=where())
    before = os.getcwd()
    os.chdir(cwd)  # the host's process, whose threads are all this pack's runs
    try:
        outcome = run_pack(configs, [list(own) for _, own in runs], resume)
    finally:
        os.chdir(before)
    outcome.errors = [_portable(error) for error in outcome.errors]
    outcome.where = where()
    return outcome


def _portable(error: BaseException | None) -> BaseException | None:
    """``error``, or where it does not survive pickling (an exception whose ``__init__`` takes other arguments than
    its ``args``), a RuntimeError that says it in the same words."""
    if error is None:
        return None
    try:
        cloudpickle.loads(cloudpickle.dumps(error))
    except Exception:  # noqa: BLE001 - pickling fails in many ways; each gives the same plain error
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
