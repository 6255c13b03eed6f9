"""The engine's own value of a round: the author's :class:`~rayfed.algorithms.RoundContext` and what the engine's
system model and privacy decided of the round beside it.

A method's halves read the round's number, seed, learning rate and sampled clients (the ``RoundContext`` every
``aggregate`` receives); what only the engine decides and the workers and the server apply travels here: a partial
client's step budget (a deadline's partial work, docs/system.md), each update's arrival version (asynchronous
aggregation, handed to the server half that declares
:class:`~rayfed.algorithms.declarations.AsynchronousAggregation`), the clients a round planned (DP-FedAvg's fixed
denominator) and adaptive clipping's clip norm, or a method's parts' bounds (docs/privacy.md).
A ``RoundFacts`` is a ``RoundContext``, so the engine hands the one value to its workers, its server and the halves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.algorithms import RoundContext

__all__ = ["RoundFacts"]


@dataclass(frozen=True)
class RoundFacts(RoundContext):
    """One round as the engine runs it (module docstring); every field beyond the context's defaults to "none"."""

    step_budget: np.ndarray | None = None
    """With a system model's partial work (``system.late_work="partial"``, :mod:`rayfed.system.rounds`): int64, one
    per sampled client, the local steps it takes before it must upload, in the phases the budget covers
    (``Phase.budgeted``; the others train whole) (-1: all its phases' steps); None: all."""
    arrives_at: np.ndarray | None = None
    """Asynchronous aggregation (:mod:`rayfed.system.schedule`): int64, one per sampled client, the model version
    its update is applied to make (the round is the version it trains from); None in synchronous rounds."""
    planned: np.ndarray | None = None
    """With a system model (:mod:`rayfed.system.rounds`): int64, sorted, every client the round sampled, those whose
    work does not count (dropped, offline, late, surplus) too, which DP-FedAvg's fixed denominator counts
    (:mod:`rayfed.execution.privacy`); None: :attr:`sampled`."""
    clip_norm: float | None = None
    """With adaptive clipping (``privacy.adaptive_quantile``, :mod:`rayfed.privacy.adaptive`): the round's clip norm
    C_t; None: ``privacy.clip_norm``."""
    part_bounds: tuple[float, ...] | None = None
    """With adaptive clipping of a method that uploads parts (:class:`~rayfed.algorithms.private_uploads.
    PartwiseUpload`): each part's bound B_k,t this round, in declared order; None: each part's
    :meth:`~rayfed.algorithms.private_uploads.UploadPart.norm` of ``privacy.clip_norm``."""

    def planned_clients(self) -> np.ndarray:
        """Every client the round planned: :attr:`planned`, else (no system model) :attr:`sampled`."""
        return self.sampled if self.planned is None else self.planned

    def budget_of(self, client_id: int) -> int | None:
        """The local steps client ``client_id`` may take this round, or None for all (:attr:`step_budget`)."""
        if self.step_budget is None:
            return None
        budget = int(self.step_budget[np.searchsorted(self.sampled, client_id)])
        return None if budget < 0 else budget

    @classmethod
    def of(cls, ctx: RoundContext) -> RoundFacts:
        """``ctx`` itself if it is one, else the round ``ctx`` names with no engine facts (a round driven by hand,
        as tests and benchmarks drive a worker or the server)."""
        return ctx if isinstance(ctx, RoundFacts) else cls(ctx.round, ctx.seed, ctx.lr, ctx.sampled)
