"""``ServerActor``: the Ray actor that owns the global state (a shell over :class:`rayfed.execution.server.Server`)."""

from __future__ import annotations

import os
import sys
from typing import Any

import ray

from rayfed.execution.server import Server
from rayfed.execution.summation import pieces_of
from rayfed.util.plugins import WithCode

__all__ = ["ServerActor"]


@ray.remote(num_cpus=0)
class ServerActor:
    """Holds the algorithm's server half. ``broadcast`` returns the round's message, which Ray
    stores once in the object store; every worker reads that same object by reference."""

    def __init__(self, shipped: WithCode, *args: Any) -> None:
        """``shipped``: the run's config with its code beside it (:class:`~rayfed.util.plugins.WithCode`), then the
        server's other arguments."""
        self.server = Server(shipped.config, *args)
        torch = sys.modules.get("torch")  # imported only by server halves that compute with it
        if torch is not None:
            torch.set_num_threads(1)

    def broadcast(self) -> Any:
        return self.server.broadcast()

    def aggregate(self, ctx: Any, calls: int, spans: list[range | None], *received: Any) -> dict[str, float]:
        """Aggregate the round's ``calls`` calls from the sums ``received`` (each named by its span, or by its own
        spans where that is None: :func:`rayfed.execution.summation.pieces_of`). Ray resolves the ObjectRefs in
        ``received`` before the call: their arrays are read zero-copy."""
        return self.server.aggregate_subtrees(ctx, calls, pieces_of(spans, received))

    def state_dict(self) -> dict[str, Any]:
        return self.server.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)

    def memory_bytes(self) -> int:
        return self.server.memory_bytes()

    def peak_rss_bytes(self) -> int:
        """Peak resident memory of this actor's process (for the scaling benchmark)."""
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this actor runs on, whose object store receives what it fetches."""
        return ray.get_runtime_context().get_node_id()
