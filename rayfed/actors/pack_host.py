"""A pack of runs as the one unit Ray schedules: one task, with one worker's resources, that hosts the pack.

The runs of a pack (:func:`rayfed.run_many`) train as lanes of one stack, which is launch-bound on one device:
spreading a pack's clients over several workers would only split the stack again. So a pack of
``engine.backend="ray"`` runs is one Ray task, placed by Ray where one worker of the runs' engine fits
(``engine.num_cpus_per_worker`` CPUs and ``engine.num_gpus_per_worker`` GPUs: the bundle each of those runs asks
for a worker, the device its stacks would train on alone), which runs the plain pack runner it is handed
(:mod:`rayfed.packs.hosted`): the pack's drivers as threads of that process, their clients trained in it
(:func:`~rayfed.execution.stack_merger.training_backend`). Several packs run at once, each where Ray places it.

What the host needs of its node: the driver's working directory and the runs' directories, at the same paths
(storage every node mounts, on a cluster of several nodes), and the checkpoint key the driver's node reads
(:mod:`rayfed.provenance.checkpoint_key`), so that a run continues from either. A run's code outside rayfed
reaches the host as it reaches a run's workers (:class:`~rayfed.util.plugins.WithCode`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import ray

from rayfed.config import EngineConfig

__all__ = ["one_worker", "host", "gather", "where"]


def one_worker(engine: EngineConfig) -> EngineConfig:
    """``engine`` asking for the one worker a pack's host is: what :func:`~rayfed.actors.cluster.check_resources`
    checks before the host is asked for."""
    return dataclasses.replace(engine, num_workers=1, max_workers=0)


def _hosted(work: Callable[..., Any], *args: Any) -> Any:
    return work(*args)


def host(engine: EngineConfig, work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` as one Ray task with one worker's resources of ``engine``, never retried (its runs resume
    from their checkpoints, not from round 0); returns its ObjectRef."""
    task = ray.remote(_hosted).options(
        num_cpus=engine.num_cpus_per_worker, num_gpus=engine.num_gpus_per_worker, max_retries=0
    )
    return task.remote(work, *args)


def gather(refs: Sequence[Any]) -> list[Any]:
    """The hosts' values, or each one's error as its value (a host that died: its node lost, out of memory). Ctrl-C
    here ends every host as a kill would (each run resumes from its last checkpoint) and is raised again."""
    values: list[Any] = []
    try:
        for ref in refs:
            try:
                values.append(ray.get(ref))
            except ray.exceptions.RayError as error:
                values.append(error)
    except KeyboardInterrupt:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    return values


def where() -> str:
    """The node and process this host runs on, in words (what the driver's log says of a pack)."""
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "-"
    return f"host {socket.gethostname()} (Ray node {node[:8]}), pid {os.getpid()}"
