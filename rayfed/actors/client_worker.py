"""``ClientWorker``: the Ray actor that trains and evaluates batches of virtual clients.

It is a thin shell over :class:`rayfed.execution.client_runner.ClientRunner`; the driver feeds it
through :class:`rayfed.actors.worker_pool.WorkerPool`.
"""

from __future__ import annotations

from typing import Any

import ray

from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.reports import EvalReport
from rayfed.execution.round_facts import RoundFacts
from rayfed.util.allocator import keep_freed_memory
from rayfed.util.plugins import WithCode

__all__ = ["ClientWorker"]


@ray.remote
class ClientWorker:
    """Ray actor running a :class:`~rayfed.execution.client_runner.ClientRunner`."""

    def __init__(self, shipped: WithCode, *args: Any) -> None:
        """``shipped``: the run's config with its code beside it (:class:`~rayfed.util.plugins.WithCode`), then the
        runner's other arguments."""
        keep_freed_memory()
        self.runner = ClientRunner(shipped.config, *args)

    @ray.method(num_returns=2)
    def train(self, broadcast: Any, ctx: RoundFacts, client_ids: list[int], states: dict) -> tuple[Any, Any]:
        """Returns (summed contribution, (reports, new states)) as two objects: the first goes to the server (or to
        this node's agent, which adds up the node's calls: :mod:`rayfed.actors.node_agent`), the second to the
        driver."""
        result = self.runner.train(broadcast, ctx, client_ids, states)
        return result.contribution, (result.reports, result.states)

    def evaluate(self, broadcast: Any, ctx: RoundFacts, client_ids: list[int], states: dict) -> list[EvalReport]:
        return self.runner.evaluate(broadcast, ctx, client_ids, states)

    def node_and_pid(self) -> tuple[str, int]:
        import os

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def exit(self) -> None:
        """End this actor once its running call is done (a clean exit, before the pool kills it)."""
        ray.actor.exit_actor()
