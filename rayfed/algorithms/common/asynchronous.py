"""What the asynchronous methods (FedAsync, FedBuff) share: their params, the staleness weights, and a server that
keeps each client's update until the server step it arrives in.

The engine simulates asynchronous aggregation in virtual time (:mod:`rayfed.system.schedule`, docs/system.md): a
round is a model version v. The clients launched from version v train as one call from θ_v, and the server receives
their uploads right after, in that round's aggregation; but each update belongs to the server step that makes the
version it arrives at (the arrival versions the server hands it: :class:`AsynchronousAggregation`), after the
updates that reach the server before it. So the server keeps them: per version still to make, the sum of the
updates that make it, each weighted by s(t − τ) of its staleness t − τ (τ = v the version it trained from, t + 1 the
version it makes), as FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019,
arXiv:1903.03934, Sec. 5.2) defines s:

    constant:    s(t − τ) = 1
    polynomial:  s(t − τ) = (t − τ + 1)^(−a)                            (FedBuff's experiments: a = 1/2)
    hinge:       s(t − τ) = 1 if t − τ ≤ b, else 1 / (a (t − τ − b) + 1)

Each round's aggregation then applies the kept sum of the version it makes (:meth:`KeptUpdatesServer.apply`, the
method's rule). What the server keeps is part of its state (checkpoints): the updates in flight are at most the
concurrency C, so it holds at most C + 2 models.

With privacy (:class:`~rayfed.algorithms.private_uploads.ModelRowsUpload`, docs/privacy.md) its clients' rows
arrive clipped, θ_τ + Δ̃_k with ‖Δ̃_k‖ ≤ C; the server keeps, beside each version's sum, every client's summed weight
in it, counts a launch whose update was rejected as a zero update (θ_τ itself: its arrival stays in the step, and
FedBuff's K stays the schedule's), and adds to each step's sum the noise of a sum to which one client adds at most
b_t = max_i Σ_{k from i} s(t − τ_k) clipped updates (:data:`~rayfed.algorithms.private_uploads.StepNoise`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from rayfed.algorithms.common.global_model import GlobalModelServer
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.declarations import AsynchronousAggregation
from rayfed.algorithms.hooks import RoundContext
from rayfed.algorithms.private_uploads import ModelRowsUpload, StepNoise
from rayfed.algorithms.sizing import model_state_bytes
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented
from rayfed.util.validation import check_choice, check_int, check_real

__all__ = ["STALENESS", "staleness_weight", "AsynchronousParams", "KeptUpdatesServer"]

STALENESS = ("constant", "polynomial", "hinge")
"""FedAsync's staleness functions s(t − τ)."""
_PARAMS = "algorithm.params."
_KEPT, _KEPT_META, _KEPT_CLIENTS = "kept/", "kept_meta", "kept_clients/"
"""State names of the kept sums (one per version), of their (version, weight, count) rows, and with privacy of each
version's (client, summed weight) rows."""


def staleness_weight(staleness: np.ndarray, kind: str, a: float, b: int) -> np.ndarray:
    """s(t − τ) of each staleness t − τ (module docstring), in float64.

    >>> staleness_weight(np.array([0, 3, 8]), "polynomial", 0.5, 0).tolist()
    [1.0, 0.5, 0.3333333333333333]
    >>> staleness_weight(np.array([0, 4, 6]), "hinge", 10.0, 4).tolist()
    [1.0, 1.0, 0.047619047619047616]
    """
    lag = np.asarray(staleness, dtype=np.float64)
    if kind == "constant":
        return np.ones_like(lag)
    if kind == "polynomial":
        return (lag + 1.0) ** -a
    return np.where(lag <= b, 1.0, 1.0 / (a * (lag - b) + 1.0))


@dataclass(frozen=True)
class AsynchronousParams:
    """The asynchronous schedule's and the staleness weights' params every asynchronous method has (its server half,
    a :class:`KeptUpdatesServer`, declares the schedule they shape: :class:`AsynchronousAggregation`)."""

    concurrency: int = documented(
        10,
        "C, the clients training at once: a client that reports frees its slot for a new one (FedBuff's concurrency, "
        "FedScale's max_concurrency); at most the clients ever online.",
    )
    staleness: str = documented(
        "polynomial",
        "s(t - tau), the weight of an update of staleness t - tau: constant (1), polynomial ((t - tau + 1)^-a) or "
        "hinge (1 up to b, then 1 / (a (t - tau - b) + 1)), FedAsync's three.",
    )
    staleness_a: float = documented(0.5, "a of the polynomial and hinge staleness functions (FedBuff: 1/2).")
    staleness_b: int = documented(4, "b of the hinge staleness function: the staleness weighted 1.")

    def __post_init__(self) -> None:
        check_int(_PARAMS + "concurrency", self.concurrency, low=1)
        check_choice(_PARAMS + "staleness", self.staleness, STALENESS)
        check_real(_PARAMS + "staleness_a", self.staleness_a, low=0)
        check_int(_PARAMS + "staleness_b", self.staleness_b, low=0)

    @property
    def buffer(self) -> int:
        """K, the updates each server step applies (FedAsync: one)."""
        return 1

    def weight(self, staleness: np.ndarray) -> np.ndarray:
        """s(t − τ) of each update's staleness."""
        return staleness_weight(staleness, self.staleness, self.staleness_a, self.staleness_b)


P = TypeVar("P", bound=AsynchronousParams)


class KeptUpdatesServer(GlobalModelServer[P, ClientVectors], AsynchronousAggregation, ModelRowsUpload):
    """θ_g, and per version still to make the sum of the weighted updates that make it (module docstring). Its
    clients upload their trained models whole (``WholeModelsClient``), rows that privacy clips
    (:class:`ModelRowsUpload`)."""

    def __init__(self, params: P, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.kept: dict[int, tuple[np.ndarray, float, int]] = {}
        """Version -> (Σ weight × update, Σ weight, count) of the updates that arrive to make it."""
        self.noise: StepNoise | None = None
        """With privacy (:meth:`protect`): each step's noise; None: off."""
        self.weights_of: dict[int, dict[int, float]] = {}
        """With privacy, version -> client -> the summed weights of its updates that arrive to make it."""

    def protect(self, noise: StepNoise) -> None:
        """Count rejected launches as zero updates and noise every step (module docstring)."""
        self.noise = noise

    @classmethod
    def privacy_conflict(cls, params: Any, privacy: Any) -> str:
        """Local DP counts one release per client per step, which a buffer of K > 1 updates cannot promise; the
        staleness weights replace ``privacy.weighting``'s; adaptive clipping's count and secure aggregation's charged
        instance are a synchronous round's."""
        name = "algorithm.params.buffer_size"
        if privacy.mechanism == "local" and params.buffer > 1:
            return (
                f"privacy.mechanism='local' counts one release per client per server step, but {name}="
                f"{params.buffer} lets one client bring several updates to a step: use privacy.mechanism='central' "
                f"or {name}=1"
            )
        if privacy.weighting != "uniform":
            return (
                f"privacy.weighting={privacy.weighting!r} weighs a round's clients by their samples, but an "
                "asynchronous step weighs each update by its staleness alone: leave privacy.weighting='uniform'"
            )
        if privacy.adaptive:
            return (
                f"privacy.adaptive_quantile={privacy.adaptive_quantile:g} adapts the clip norm from a synchronous "
                "round's count of unclipped updates, which an asynchronous step does not have: leave "
                "privacy.adaptive_quantile out"
            )
        if privacy.secure_aggregation != "off":
            return (
                f"privacy.secure_aggregation={privacy.secure_aggregation!r} charges an instance of a synchronous "
                "round's clients, not an asynchronous step's K updates: set privacy.secure_aggregation='off'"
            )
        return ""

    @classmethod
    def server_state_bytes(cls, params: Any, spec: ProblemSpec) -> int:
        """θ_g, a sum, and at most one kept update per client in flight."""
        return (2 + params.concurrency) * model_state_bytes(spec)

    @abc.abstractmethod
    def update_of(self, models: np.ndarray) -> np.ndarray:
        """What the server keeps of each uploaded model (rows) launched from the current θ_g, before its weight."""

    @abc.abstractmethod
    def apply(self, total: np.ndarray, weight: float, count: int) -> dict[str, float]:
        """Fold the kept sum of the version being made (``count`` updates whose weights sum to ``weight``) into θ_g."""

    def weights(self, staleness: np.ndarray) -> np.ndarray:
        """Each kept update's weight: s(t − τ) by default."""
        return self.params.weight(staleness)

    @classmethod
    def schedule(cls, params: Any) -> tuple[int, int]:
        """C and K of ``params`` (:class:`AsynchronousParams`)."""
        return params.concurrency, params.buffer

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        """A round driven by hand, without a schedule: its updates make the next version, with staleness 0."""
        return self.aggregate_arriving(ctx, contribution, None)

    def aggregate_arriving(
        self, ctx: RoundContext, contribution: ClientVectors | None, arrives_at: np.ndarray | None
    ) -> dict[str, float]:
        """Keep the uploads of the clients launched from version ``ctx.round``, each for the version it arrives at
        (``arrives_at``, one per sampled client; None: the next one), then make version ``ctx.round + 1`` from the
        updates kept for it. ``contribution`` None (with privacy: no upload arrived): the launches as zero updates."""
        self._keep(ctx, contribution, arrives_at)
        return self.step_without_uploads(ctx)

    def step_without_uploads(self, ctx: RoundContext) -> dict[str, float]:
        """Make version ``ctx.round + 1`` from the updates kept for it; the server asks this alone in a round
        without an acceptable upload (none launched from ``ctx.round`` arrives, or their sum was not finite). With
        privacy that round's launches count as zero updates first (the server hands them as ``aggregate_arriving``
        with no contribution)."""
        made = self.kept.pop(ctx.round + 1, None)
        if made is None:
            return {"clients_aggregated": 0.0}
        total, weight, count = made
        shares = self.weights_of.pop(ctx.round + 1, {})
        noise = None if self.noise is None else self.noise(ctx.round, total.shape[0], max(shares.values(), default=0))
        if noise is not None:  # the step's release: its sum, noised for the most one client adds to it
            total = (total + noise).astype(np.float32)
        return {"clients_aggregated": float(count), **self.apply(total, weight, count)}

    def _keep(self, ctx: RoundContext, contribution: ClientVectors | None, arrives_at: np.ndarray | None) -> None:
        """Keep each upload for the version it arrives at; with privacy also each launch the round planned that sent
        nothing (rejected), as the zero update θ_τ (module docstring)."""
        ids = np.zeros(0, np.int64) if contribution is None else contribution.client_ids
        if arrives_at is None:  # no schedule (a round driven by hand): every update makes the next version
            rows, launches = np.arange(len(ids)), len(ids)
            arrives_at = np.full(launches, ctx.round + 1, dtype=np.int64)
        else:
            rows, launches = _launch_rows(ctx.sampled, ids), len(arrives_at)
        updates = None if contribution is None else self.update_of(contribution.matrix())
        if self.noise is not None:  # every planned launch arrives: the uploads, then the rest as zero updates
            missing = np.setdiff1d(np.arange(launches), rows)
            zero = self.update_of(self.global_vector[None, :])
            rows = np.concatenate([rows, missing])
            updates = np.concatenate([zero[:0] if updates is None else updates, np.repeat(zero, len(missing), 0)])
            ids = np.concatenate([ids, np.asarray(ctx.sampled, np.int64)[missing]])
        if updates is None or not len(rows):
            return
        arrives = arrives_at[rows]
        weights = self.weights(arrives - 1 - ctx.round)
        for version in np.unique(arrives).tolist():
            chosen = arrives == version
            added = weights[chosen].astype(np.float32) @ updates[chosen]
            total, weight, count = self.kept.get(version, (np.zeros_like(added), 0.0, 0))
            self.kept[version] = (total + added, weight + float(weights[chosen].sum()), count + int(chosen.sum()))
            if self.noise is not None:
                shares = self.weights_of.setdefault(version, {})
                for client, share in zip(ids[chosen].tolist(), weights[chosen].tolist()):
                    shares[client] = shares.get(client, 0.0) + share

    def extra_state(self) -> dict[str, np.ndarray]:
        """The kept sums (none when none is kept, so a fresh server's state is θ_g alone), and with privacy each
        version's clients' summed weights."""
        if not self.kept:
            return {}
        versions = sorted(self.kept)
        meta = np.array([[v, self.kept[v][1], self.kept[v][2]] for v in versions], dtype=np.float64)
        shares = {
            f"{_KEPT_CLIENTS}{v}": np.array(sorted(self.weights_of[v].items()), dtype=np.float64).reshape(-1, 2)
            for v in sorted(self.weights_of)
        }
        return {_KEPT_META: meta, **{f"{_KEPT}{v}": self.kept[v][0] for v in versions}, **shares}

    def load_extra_state(self, state: Mapping[str, np.ndarray]) -> None:
        meta = np.asarray(state.get(_KEPT_META, np.zeros((0, 3))))
        self.kept = {
            int(v): (np.array(state[f"{_KEPT}{int(v)}"], dtype=np.float32), float(w), int(n)) for v, w, n in meta
        }
        self.weights_of = {
            int(name[len(_KEPT_CLIENTS) :]): {int(c): float(w) for c, w in np.asarray(rows)}
            for name, rows in state.items()
            if name.startswith(_KEPT_CLIENTS)
        }


def _launch_rows(sampled: np.ndarray, client_ids: np.ndarray) -> np.ndarray:
    """The row of ``sampled`` (sorted; a client launched twice from one version is there twice, each launch with
    its own arrival) that each upload of ``client_ids`` answers: a client's k-th upload its k-th launch, so that
    every launch's update is kept for its own arrival, never a repeated client's first.

    >>> _launch_rows(np.array([0, 0, 1, 2]), np.array([2, 0, 1, 0])).tolist()
    [3, 0, 2, 1]
    """
    ids = np.asarray(client_ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    first = np.searchsorted(ids[order], ids[order])  # the first upload of each one's client, in sorted order
    rows = np.empty(len(ids), dtype=np.int64)
    rows[order] = np.searchsorted(sampled, ids[order]) + np.arange(len(ids)) - first
    return rows
