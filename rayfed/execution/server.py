"""The plain class behind the ``ServerActor``: owns the algorithm's server half.

It merges the round's partial contributions in a fixed order (by client batch, not by
arrival), so results do not depend on worker timing, and refuses to fold a non-finite
aggregate into the global state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from rayfed.algorithms import Contribution, RoundContext, ServerHalf, resolve
from rayfed.algorithms.contributions import sum_contributions
from rayfed.config import RunConfig
from rayfed.train.problem import ProblemSpec

logger = logging.getLogger(__name__)

__all__ = ["Server"]


class Server:
    """Holds the global state; aggregates and broadcasts."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        self.half: ServerHalf[object, Contribution] = resolve(config.algorithm).make_server(spec, initial)

    def broadcast(self) -> Any:
        return self.half.broadcast()

    def aggregate(self, ctx: RoundContext, *parts: Contribution | None) -> dict[str, float]:
        """Sum the partial contributions in the order given and fold them into the state."""
        total = sum_contributions(parts)
        bytes_received = sum(p.nbytes for p in parts if p is not None)
        if total is not None and not total.is_finite():
            logger.warning("round %d: aggregate is not finite; the global state is kept", ctx.round)
            total = None
        metrics = dict(self.half.aggregate(ctx, total))
        metrics["server_bytes_received"] = float(bytes_received)
        return metrics

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.half.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.half.load_state_dict(state)

    def memory_bytes(self) -> int:
        return self.half.memory_bytes()
