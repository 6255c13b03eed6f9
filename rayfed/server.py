"""The plain class behind the ``ServerActor``: owns the algorithm's server half.

It merges the round's partial contributions in a fixed order (by client batch, not by
arrival), so results do not depend on worker timing, and refuses to fold a non-finite
aggregate into the global state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import numpy as np

from rayfed.algorithms import ALGORITHMS, Broadcast, Contribution, ProblemSpec, RoundContext, ServerHalf
from rayfed.algorithms.contributions import sum_contributions
from rayfed.config import RunConfig

logger = logging.getLogger(__name__)

__all__ = ["Server"]


class Server:
    """Holds the global state; aggregates and broadcasts."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        algorithm = ALGORITHMS.get(config.algorithm.name)
        self.half: ServerHalf[object, Contribution] = algorithm.server_half(config.algorithm.params, spec, initial)

    def broadcast(self) -> Broadcast:
        return self.half.broadcast()

    def aggregate(self, ctx: RoundContext, *parts: Contribution | None) -> dict[str, float]:
        """Sum the partial contributions in the order given and fold them into the state."""
        start = time.perf_counter()
        total = sum_contributions(parts)
        bytes_received = sum(p.nbytes for p in parts if p is not None)
        if total is not None and not total.is_finite():
            logger.warning("round %d: aggregate is not finite; the global state is kept", ctx.round)
            total = None
        metrics = dict(self.half.aggregate(ctx, total))
        metrics["server_bytes_received"] = float(bytes_received)
        metrics["aggregate_s"] = time.perf_counter() - start
        return metrics

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.half.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.half.load_state_dict(state)

    def memory_bytes(self) -> int:
        return self.half.memory_bytes()
