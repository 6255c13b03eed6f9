"""``rayfed.run_many``: several runs at once, whose concurrent training calls share one stack where they can.

UNDER DEVELOPMENT (issue 64, branch issue-64a): the signature is final; today the runs run one after another,
as ``rayfed.run`` runs each of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.engine.result import RunResult
from rayfed.tracking.runs import run

__all__ = ["run_many"]


def run_many(
    configs: Sequence[RunConfig], *, callbacks: Sequence[Sequence[Callback]] | None = None, resume: bool = False
) -> list[RunResult]:
    """Run every config of ``configs`` (or resume each from its ``run_dir``), each with its own callbacks
    (``callbacks[i]`` for ``configs[i]``, e.g. a tuner's pruning callback) and trackers, as :func:`rayfed.run`
    runs one; returns their results in the order of ``configs``.

    UNDER DEVELOPMENT: the runs do not pack yet; they run one after another.
    """
    per_run = list(callbacks) if callbacks is not None else [() for _ in configs]
    return [run(config, callbacks=own, resume=resume) for config, own in zip(configs, per_run, strict=True)]
