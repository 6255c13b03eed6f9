"""``ClientWorker``: the Ray actor that trains and evaluates batches of virtual clients.

It is a thin shell over :class:`rayfed.execution.client_runner.ClientRunner`; the driver feeds it
through :class:`rayfed.actors.worker_pool.WorkerPool`.
"""

from __future__ import annotations

from typing import Any

import ray

from rayfed.algorithms import RoundContext
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.reports import EvalReport

__all__ = ["ClientWorker"]


def keep_freed_memory() -> bool:
    """Let glibc keep freed buffers of up to 32 MiB in this process's heap (Linux only).

    A worker allocates and frees the same MB-sized buffers thousands of times per round
    (activations, gradients, each client's contribution). By default glibc maps many of them
    fresh and unmaps them on free, so their pages fault in again on every use; with these
    limits they stay in the heap and are reused (benchmarks/README.md has the measurement).
    A worker owns its process, so it changes only its own allocator. Returns False where
    ``mallopt`` is unavailable, and then does nothing.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))


@ray.remote
class ClientWorker:
    """Ray actor running a :class:`~rayfed.execution.client_runner.ClientRunner`."""

    def __init__(self, *args: Any) -> None:
        keep_freed_memory()
        self.runner = ClientRunner(*args)

    @ray.method(num_returns=2)
    def train(self, broadcast: Any, ctx: RoundContext, client_ids: list[int], states: dict) -> tuple[Any, Any]:
        """Returns (summed contribution, (reports, new states)) as two objects: the first goes to the server."""
        result = self.runner.train(broadcast, ctx, client_ids, states)
        return result.contribution, (result.reports, result.states)

    def evaluate(self, broadcast: Any, ctx: RoundContext, client_ids: list[int], states: dict) -> list[EvalReport]:
        return self.runner.evaluate(broadcast, ctx, client_ids, states)

    def node_and_pid(self) -> tuple[str, int]:
        import os

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def exit(self) -> None:
        """End this actor once its running call is done (a clean exit, before the pool kills it)."""
        ray.actor.exit_actor()
