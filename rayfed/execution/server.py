"""The plain class behind the ``ServerActor``: owns the algorithm's server half.

It adds the round's partial contributions along the summation tree over the calls
(:mod:`rayfed.execution.summation`), not in the order they arrive, so results depend neither on worker
timing nor on where the calls ran, and refuses to fold a non-finite aggregate into the global state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from rayfed.algorithms import Contribution, RoundContext, ServerHalf, resolve
from rayfed.algorithms.declarations import AsynchronousAggregation
from rayfed.algorithms.private_uploads import ModelRowsUpload
from rayfed.config import RunConfig
from rayfed.execution.privacy import ServerPrivacy
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.summation import CallTree
from rayfed.train.problem import ProblemSpec

logger = logging.getLogger(__name__)

__all__ = ["Server"]


class Server:
    """Holds the global state; aggregates and broadcasts."""

    privacy: ServerPrivacy | None = None
    """The fixed denominator and central noise of DP-FedAvg (:mod:`rayfed.execution.privacy`); None: off."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        self.half: ServerHalf[object, Contribution] = resolve(config.algorithm).make_server(spec, initial)
        self.rows = isinstance(self.half, ModelRowsUpload)
        """Whether the half keeps each clipped row for its step (asynchronous aggregation), noising the steps."""
        if config.privacy.enabled:
            self.privacy = ServerPrivacy(config, spec.train_sizes)
            if isinstance(self.half, ModelRowsUpload):
                self.half.protect(self.privacy.step_noise)

    def broadcast(self) -> Any:
        return self.half.broadcast()

    def aggregate(self, ctx: RoundContext, *parts: Contribution | None) -> dict[str, float]:
        """Add the calls' partial contributions ``parts`` (in call order) along the tree, and fold them into the
        state."""
        return self.aggregate_subtrees(ctx, len(parts), {range(i, i + 1): part for i, part in enumerate(parts)})

    def aggregate_subtrees(
        self, ctx: RoundContext, calls: int, pieces: Mapping[range, Contribution | None]
    ) -> dict[str, float]:
        """Complete the round's summation tree over ``calls`` calls from ``pieces``, the sums of subtrees that
        cover every call (single calls, or what a node added up), and fold the total into the state. ``ctx`` is the
        engine's :class:`RoundFacts` (a bare ``RoundContext``: a round without arrivals or a clip norm of its own)."""
        ctx = RoundFacts.of(ctx)
        total = CallTree(calls).total(pieces) if calls else None
        bytes_received = sum(p.nbytes for p in pieces.values() if p is not None)
        # A sum may overflow where its parts did not; the rows of a concatenation were each found finite on their
        # workers (rayfed.execution.settlement), so reading them once more here could find nothing.
        if total is not None and total.sum_is_one_part and not total.is_finite():
            logger.warning("round %d: aggregate is not finite; the global state is kept", ctx.round)
            total = None
        private: dict[str, float] = {}
        if self.privacy is not None and not self.rows:  # the fixed denominator and the noise, uploads or not
            empty = self.privacy.empty(self.half) if total is None else total
            total, private = self.privacy.privatized(ctx, empty, self.half)
        metrics = self._without_uploads(ctx) if total is None else self._aggregated(ctx, total)
        metrics.update(private)
        metrics["server_bytes_received"] = float(bytes_received)
        return metrics

    def _aggregated(self, ctx: RoundFacts, total: Contribution) -> dict[str, float]:
        """The half's aggregation of the round's total; an asynchronous half's with each update's arrival
        (:class:`AsynchronousAggregation`)."""
        if isinstance(self.half, AsynchronousAggregation):
            return dict(self.half.aggregate_arriving(ctx, total, ctx.arrives_at))
        return dict(self.half.aggregate(ctx, total))

    def _without_uploads(self, ctx: RoundFacts) -> dict[str, float]:
        """A round without an acceptable update leaves the state as it is: answered here, for every method, but
        one that kept earlier uploads for this round's step (:class:`AsynchronousAggregation`)."""
        if isinstance(self.half, AsynchronousAggregation):
            if self.privacy is not None and self.rows:  # the round's launches still arrive, as zero updates
                return dict(self.half.aggregate_arriving(ctx, None, ctx.arrives_at))
            return dict(self.half.step_without_uploads(ctx))
        return {"clients_aggregated": 0.0}

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.half.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.half.load_state_dict(state)

    def memory_bytes(self) -> int:
        """Bytes of state the server half holds now (the scaling benchmark reads it)."""
        return sum(int(value.nbytes) for value in self.half.state_dict().values())
