"""DP-FedAvg where the halves run (docs/privacy.md): the worker clips (and with local DP noises) each client's
upload, the server noises the round's sum once and averages it over the clients the round planned.

Off (``privacy.mechanism="off"``) neither exists and no number changes. On, only a method whose server half
declares :class:`~rayfed.algorithms.private_uploads.ModelUpload` runs (the plan refuses the others), and its
clients' uploads are checked to be the model it declares.

Worker, client i of the round (θ_g its start, n_i its training samples, w_i its weight: 1, or n_i with
``privacy.weighting="samples"``)::

    θ̃_i = θ_g + Δ_i · min(1, C/‖Δ_i‖)         (rayfed.privacy.clipping; θ_i itself where ‖Δ_i‖ ≤ C)
    local DP: θ̃_i += N(0, σ² I)               (σ = z·C, seeded by the run, the round and the client)
    upload w_i θ̃_i and w_i                     (a stack's in one product)

Server, the round planned the set P and received U ⊆ P (Σ_U w_i θ̃_i, Σ_U w_i)::

    θ_g' = (Σ_U w_i θ̃_i + (W_P − W_U) θ_g + N(0, (σ w_max)² I)) / W_P      (central; no noise with local DP)

W_P is fixed by the plan, not by who reported (McMahan et al. 2018's fixed denominator): Σ_P w_i, times n/|P| where
a system model's over-commitment draws |P| > n clients to keep n of them, or q·Σ_all w_i with Poisson sampling (the
expected weight, q·N with uniform weights). A planned client that sent nothing (rejected, or with a system model
dropped, offline, late or surplus) counts as a zero update, and a round in which none did still releases θ_g
plus the noise. w_max is the largest weight any client can have (1, or the largest training split), the sum's
sensitivity in units of the clip.

With adaptive clipping (``privacy.adaptive_quantile``, :mod:`rayfed.privacy.adaptive`) the round's clip norm C_t
comes with its context, each client also sends the bit 1[‖Δ_i‖ ≤ C_t] (a :class:`ClippedSum`), and the server
reports the noised fraction of unclipped updates, from which the engine makes C_{t+1}; the update's noise then
uses the multiplier z_Δ left to it beside the count's noise.

A method that uploads several parts (:class:`~rayfed.algorithms.private_uploads.PartwiseUpload`, cwFedAvg) has
each client's parts x_ik clipped to their own bounds B_k (``privacy.clip_norm`` for an update), lane by lane, and
summed weighted (:class:`PrivateParts`); the server adds N(0, (z_k B_k w_max)² I) to each part's sum, z_k = z·√P
for P parts (with local DP each client adds N(0, (z_k B_k)² I) to its own), and hands the noised sums over W_P to
the server half, which folds them its own way. With adaptive clipping each part's bound B_k,t comes with the
round's context, each client counts the parts it had within them (:attr:`PrivateParts.unclipped`), the server
reports each part's noised fraction (``unclipped_fraction_k``, k = 1..P), and the parts' noise uses z_k = z_Δ·√P,
z_Δ being the updates' share beside the P counts' noise (:func:`rayfed.privacy.adaptive.update_noise_multiplier`).

An asynchronous method (:class:`~rayfed.algorithms.private_uploads.ModelRowsUpload`, FedAsync, FedBuff) has each
client's row clipped as a model (:class:`ClientPrivacy`, as above, kept one row per client), and the server noises
each server step's staleness-weighted sum, N(0, (z C b_t)² I) with b_t the most one client adds to it
(:meth:`ServerPrivacy.step_noise`), inside the half, where the step is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfed.algorithms import Contribution
from rayfed.algorithms.contributions import ClientVectors, WeightedState, WeightedSum
from rayfed.algorithms.private_uploads import (
    ModelUpload,
    PartwiseClient,
    PartwiseUpload,
    PrivateParts,
    UploadPart,
    part_multiplier,
)
from rayfed.config import RunConfig
from rayfed.execution.round_facts import RoundFacts
from rayfed.privacy.adaptive import default_count_noise, noised_fraction, update_noise_multiplier
from rayfed.privacy.noise import COUNT_STREAM, SERVER_STREAM, gaussian_noise
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import participants

__all__ = ["ClippedSum", "ClientPrivacy", "ServerPrivacy", "UNCLIPPED", "part_fraction", "part_scales", "round_bounds"]

UNCLIPPED = "unclipped_fraction"
"""The server metric of adaptive clipping: b̃_t, the noised fraction of the round's updates left unclipped."""


def part_fraction(part: int) -> str:
    """The server metric of adaptive clipping of a method's part ``part`` (0-based): its noised unclipped fraction,
    named by the part's number k = 1..P."""
    return f"{UNCLIPPED}_{part + 1}"


def round_bounds(parts: Sequence[UploadPart], ctx: RoundFacts, clip_norm: float) -> tuple[float, ...]:
    """B_k,t, each part's bound in round ``ctx``: the round's adaptive bounds, else each part's own for
    ``clip_norm``."""
    return ctx.part_bounds if ctx.part_bounds is not None else tuple(part.norm(clip_norm) for part in parts)


@dataclass
class ClippedSum(WeightedSum):
    """A :class:`WeightedSum` of clipped models with the count of those left unclipped (adaptive clipping's bits,
    Σ_i 1[‖Δ_i‖ ≤ C_t]: a number, or a 0-d tensor while on a worker's device)."""

    unclipped: Any = 0.0

    def __add__(self, other: WeightedSum) -> ClippedSum:
        assert isinstance(other, ClippedSum)
        total = WeightedSum.__add__(self, other)
        return ClippedSum(total.total, total.weight, total.count, self.unclipped + other.unclipped)

    __iadd__ = __add__


class ClientPrivacy:
    """A worker's clipping (and local noise) of its clients' model uploads."""

    def __init__(
        self,
        config: RunConfig,
        method: str,
        client_half: Any = None,
        parts: tuple[UploadPart, ...] = (),
        rows: bool = False,
    ) -> None:
        self.privacy, self.seed, self.method = config.privacy, config.seed, method
        self.partwise = client_half if isinstance(client_half, PartwiseClient) and parts else None
        """The client half whose clients' parts are clipped one by one (a PartwiseUpload method); None: a model."""
        self.parts = parts
        self.rows = rows
        """Whether each client's clipped model goes up as a row of its own (a ModelRowsUpload method)."""

    def weights(self, sizes: Sequence[int]) -> list[int]:
        """w_i of clients of ``sizes`` training samples: n_i (``weighting="samples"``) or 1."""
        return list(sizes) if self.privacy.weighting == "samples" else [1] * len(sizes)

    def clip_norm(self, ctx: RoundFacts) -> float:
        """The round's clip norm: C_t with adaptive clipping, else ``privacy.clip_norm``."""
        return self.privacy.clip_norm if ctx.clip_norm is None else ctx.clip_norm

    def declared(self, uploads: Sequence[Any], trained: Any, starts: Any) -> tuple[Any, Any]:
        """The uploaded columns of the trained states and starts (L, S): the whole model, or the parts every one of
        ``uploads`` declares (the same :class:`WeightedState` for all: a method's shared part)."""
        for upload in uploads:
            if not isinstance(upload, WeightedState) or upload != uploads[0]:
                raise ConfigError(
                    f"privacy.mechanism={self.privacy.mechanism!r}: algorithm {self.method!r} declares its upload "
                    f"a model (ModelUpload) but its client uploaded {type(upload).__name__}"
                    f"{' of other parts' if isinstance(upload, WeightedState) else ''}: set privacy.mechanism='off'"
                )
        return uploads[0].selected(trained), uploads[0].selected(starts)

    def clipped(self, trained: Any, starts: Any, ids: Sequence[int], ctx: RoundFacts) -> Any:
        """The clipped (and locally noised) models of clients ``ids`` (L, S') from their uploaded columns of the
        trained states and starts (:meth:`declared`), on their device."""
        from rayfed.privacy.clipping import clipped_model
        from rayfed.train.host import to_device

        models = clipped_model(trained, starts, self.clip_norm(ctx))
        if self.privacy.mechanism != "local" or self.privacy.noise_std == 0:
            return models
        size, std = trained.shape[-1], self.privacy.noise_std
        noise = np.stack([gaussian_noise(self.seed, ctx.round, 1 + cid, size, std) for cid in ids])
        return models + to_device([noise], models.device)[0]

    def _summed(self, models: Any, weights: list[int], trained: Any, starts: Any, ctx: RoundFacts) -> WeightedSum:
        """Σ w_i θ̃_i in one product, with the unclipped count where the clip norm adapts."""
        summed = WeightedState().of_stack(models, weights)
        if not self.privacy.adaptive:
            return summed
        from rayfed.privacy.clipping import unclipped

        bits = unclipped(trained, starts, self.clip_norm(ctx)).sum()
        return ClippedSum(summed.total, summed.weight, summed.count, bits)

    def _private_parts(
        self, message: Any, jobs: Sequence[Any], uploads: Sequence[Any], ctx: RoundFacts
    ) -> PrivateParts:
        """Σ_i w_i x̃_i of the clients ``jobs``: each part of each client clipped to its bound over a (L, S_k) stack
        of their parts (one call, no read-back), with local DP noised per client, then summed in one product."""
        import torch

        from rayfed.privacy.clipping import clipped_delta, within
        from rayfed.train.host import to_device

        assert self.partwise is not None
        bounds = round_bounds(self.parts, ctx, self.privacy.clip_norm)
        made = [self.partwise.private_parts(message, job, upload) for job, upload in zip(jobs, uploads)]
        stacks = [torch.stack([row[k] for row in made]) for k in range(len(self.parts))]
        pieces = [clipped_delta(stack, bound) for stack, bound in zip(stacks, bounds)]
        sizes = tuple(int(piece.shape[-1]) for piece in pieces)
        clipped = torch.cat(pieces, dim=-1)
        if self.privacy.mechanism == "local" and self.privacy.noise_multiplier > 0:
            scale = part_scales(bounds, sizes, part_multiplier(self.privacy.noise_multiplier, self.parts))
            noise = np.stack([gaussian_noise(self.seed, ctx.round, 1 + job.client_id, sum(sizes), 1.0) for job in jobs])
            clipped = clipped + to_device([noise * scale], clipped.device)[0]
        weights = self.weights([job.num_train for job in jobs])
        total = to_device([np.asarray(weights, dtype=np.float32)], clipped.device)[0] @ clipped
        unclipped: Any = 0.0
        if self.privacy.adaptive:  # each part's count of clients within its bound, adaptive clipping's bits
            unclipped = torch.stack([within(stack, bound).sum() for stack, bound in zip(stacks, bounds)])
        return PrivateParts(total, float(sum(weights)), len(jobs), sizes, unclipped=unclipped)

    def _rows(self, uploads: Sequence[Any], jobs: Sequence[Any], states: Any, starts: Any, ctx: RoundFacts) -> Any:
        """The clipped (and locally noised) models of ``jobs`` as their rows (a ModelRowsUpload method), once each
        upload is found to be its client's row."""
        for upload, job in zip(uploads, jobs):
            if not isinstance(upload, ClientVectors) or upload.client_ids.tolist() != [job.client_id]:
                raise ConfigError(
                    f"privacy.mechanism={self.privacy.mechanism!r}: algorithm {self.method!r} declares its upload "
                    f"its clients' models as rows (ModelRowsUpload) but client {job.client_id} uploaded "
                    f"{type(upload).__name__}: set privacy.mechanism='off'"
                )
        models = self.clipped(states, starts, [job.client_id for job in jobs], ctx)
        ids = np.array([job.client_id for job in jobs], np.int64)
        return ClientVectors((models,), ids, np.array([job.num_train for job in jobs], np.float64))

    def one(self, uploads: Sequence[Any], job: Any, start: Any, ctx: RoundFacts, message: Any = None) -> Contribution:
        """One client's upload (``uploads``: what its client half declared): its clipped model weighted by w_i, its
        clipped parts (``message``: the round's broadcast, which they are measured from), or its clipped row."""
        if self.partwise is not None:
            return self._private_parts(message, [job], uploads, ctx)
        if self.rows:
            return self._rows(uploads, [job], job.trained[None, :], start[None, :], ctx)
        trained, starts = self.declared(uploads, job.trained[None, :], start[None, :])
        models = self.clipped(trained, starts, [job.client_id], ctx)
        if self.privacy.adaptive:
            return self._summed(models, self.weights([job.num_train]), trained, starts, ctx)
        return WeightedSum.of(models[0], self.weights([job.num_train])[0])

    def stack(
        self,
        uploads: Sequence[Any],
        jobs: Sequence[Any],
        states: Any,
        starts: Any,
        ctx: RoundFacts,
        message: Any = None,
    ) -> tuple[Contribution, Callable[[], list[Contribution]]]:
        """A stack's summed upload (one product), and each client's, made only when asked (a call with a rejected
        update), from the stack's trained states and starts (or its clients' parts, measured from ``message``)."""
        if self.partwise is not None:
            return self._private_parts(message, jobs, uploads, ctx), lambda: [
                self._private_parts(message, [job], [upload], ctx) for job, upload in zip(jobs, uploads)
            ]
        if self.rows:
            rows = self._rows(uploads, jobs, states, starts, ctx)
            block, ids, sizes = rows.blocks[0], rows.client_ids, rows.sizes
            return rows, lambda: [
                ClientVectors((block[r : r + 1],), ids[r : r + 1], sizes[r : r + 1]) for r in range(len(ids))
            ]
        states, starts = self.declared(uploads, states, starts)
        models = self.clipped(states, starts, [job.client_id for job in jobs], ctx)
        weights = self.weights([job.num_train for job in jobs])

        def parts() -> list[Contribution]:
            rows = [slice(r, r + 1) for r in range(len(jobs))]
            return [self._summed(models[r], weights[r], states[r], starts[r], ctx) for r in rows]

        return self._summed(models, weights, states, starts, ctx), parts


class ServerPrivacy:
    """The server's half of the mechanism: the fixed denominator and, for central DP, the round's noise."""

    def __init__(self, config: RunConfig, train_sizes: np.ndarray | None) -> None:
        self.privacy, self.seed = config.privacy, config.seed
        samples = self.privacy.weighting == "samples"
        if samples and train_sizes is None:
            raise ValueError("privacy.weighting='samples' needs the clients' training sizes on the server")
        self.sizes = train_sizes if samples else None
        self.max_weight = float(np.max(train_sizes)) if samples and train_sizes is not None else 1.0
        per_round = participants(config.data.num_clients, config.engine.join_ratio)
        self.wanted = per_round
        """n, the clients a round keeps: the share of an over-committed plan the denominator counts."""
        poisson = config.engine.participation == "poisson"
        self.poisson_rate = config.engine.join_ratio if poisson else None
        """q of Poisson sampling; None: a fixed number a round."""
        self.num_clients = config.data.num_clients
        self.all_weight = float(config.data.num_clients if self.sizes is None else np.sum(self.sizes))
        count_noise = self.privacy.count_noise
        self.count_noise = default_count_noise(per_round) if count_noise is None else count_noise
        """σ_b, the noise on the count of unclipped updates (adaptive clipping)."""
        z = self.privacy.noise_multiplier
        self.update_multiplier = update_noise_multiplier(z, self.count_noise) if self.privacy.adaptive else z
        """The update's noise multiplier: z, or z_Δ beside the count's noise (:mod:`rayfed.privacy.adaptive`)."""

    def planned_weight(self, ctx: RoundFacts) -> float:
        """W_P, the weight of the clients the round planned (module docstring): fixed by the plan, whoever
        reported."""
        if self.poisson_rate is not None:
            return self.poisson_rate * self.all_weight
        planned = ctx.planned_clients()
        weight = float(len(planned)) if self.sizes is None else float(np.sum(self.sizes[planned]))
        return weight * (self.wanted / len(planned)) if len(planned) > self.wanted else weight

    def planned_count(self, ctx: RoundFacts) -> float:
        """m, the clients the round planned, as :meth:`planned_weight` counts them with unit weights."""
        if self.poisson_rate is not None:
            return self.poisson_rate * self.num_clients
        planned = ctx.planned_clients()
        return float(min(len(planned), self.wanted))

    def empty(self, half: Any) -> WeightedSum:
        """The sum of a round in which no planned client's upload arrived: nothing, which :meth:`privatized`
        completes with zero updates and noises, so every round releases the mechanism the accountant counts."""
        if isinstance(half, PartwiseUpload):  # zero sums of its parts, each noised as a round's would be
            sizes = half.part_sizes()
            bits = np.zeros(len(sizes), np.float32) if self.privacy.adaptive else 0.0
            return PrivateParts(np.zeros(sum(sizes), np.float32), 0.0, 0, sizes, unclipped=bits)
        assert isinstance(half, ModelUpload)
        zeros = np.zeros_like(half.privacy_reference())
        return ClippedSum(zeros, 0.0, 0) if self.privacy.adaptive else WeightedSum(zeros, 0.0, 0)

    def privatized(self, ctx: RoundFacts, total: Contribution, half: Any) -> tuple[WeightedSum, dict[str, float]]:
        """The round's sum as the server half folds it, completed to the planned weight with θ_g and noised, and
        with adaptive clipping the noised unclipped fraction b̃_t (module docstring)."""
        planned = self.planned_weight(ctx)
        if isinstance(half, PartwiseUpload):
            assert isinstance(total, PrivateParts)
            return self._noised_parts(ctx, total, half.upload_parts, planned), self._part_fractions(ctx, total)
        assert isinstance(total, WeightedSum) and isinstance(half, ModelUpload)  # the plan refused the rest
        summed = total.total
        if planned != total.weight:  # a planned client sent nothing: a zero update, θ_g
            summed = summed + np.float32(planned - total.weight) * half.privacy_reference()
        clip = self.privacy.clip_norm if ctx.clip_norm is None else ctx.clip_norm
        std = 0.0 if self.update_multiplier == 0 else self.update_multiplier * clip * self.max_weight
        if self.privacy.mechanism == "central" and std > 0:
            summed = summed + gaussian_noise(self.seed, ctx.round, SERVER_STREAM, summed.shape[0], std)
        return WeightedSum(summed, planned, total.count), self.unclipped_fraction(ctx, total)

    def _noised_parts(
        self, ctx: RoundFacts, total: PrivateParts, parts: Sequence[UploadPart], planned: float
    ) -> PrivateParts:
        """The parts' sums, each noised with N(0, (z_k B_k,t w_max)²) for central DP, over the planned weight."""
        summed = total.total
        if self.privacy.mechanism == "central" and self.privacy.noise_multiplier > 0:
            z = self.privacy.noise_multiplier
            z = update_noise_multiplier(z, self.count_noise, len(parts)) if self.privacy.adaptive else z
            bounds = round_bounds(parts, ctx, self.privacy.clip_norm)
            scale = part_scales(bounds, total.sizes, part_multiplier(z, parts))
            noise = gaussian_noise(self.seed, ctx.round, SERVER_STREAM, summed.shape[0], 1.0) * scale
            summed = summed + noise * np.float32(self.max_weight)
        return PrivateParts(summed, planned, total.count, total.sizes, self.max_weight)

    def step_noise(self, round_index: int, size: int, bound: float) -> np.ndarray | None:
        """N(0, (z C b)² I) of size ``size`` for the server step of round ``round_index``, whose sum one client moves
        by at most ``bound`` (b) clipped updates (central DP; None with local DP or without noise): each step a
        Gaussian mechanism of multiplier z relative to its own sensitivity (docs/privacy.md)."""
        z = self.privacy.noise_multiplier
        if self.privacy.mechanism != "central" or z == 0 or bound == 0:
            return None
        return gaussian_noise(self.seed, round_index, SERVER_STREAM, size, z * self.privacy.clip_norm * bound)

    def unclipped_fraction(self, ctx: RoundFacts, total: Contribution) -> dict[str, float]:
        """``{UNCLIPPED: b̃_t}`` with adaptive clipping (the noised centred count over the planned m), else
        nothing."""
        if not self.privacy.adaptive:
            return {}
        assert isinstance(total, ClippedSum)  # every adaptive upload, and the empty sum, carries its bits
        return {UNCLIPPED: self._fractions(ctx, [float(total.unclipped)], total.count)[0]}

    def _part_fractions(self, ctx: RoundFacts, total: PrivateParts) -> dict[str, float]:
        """``{unclipped_fraction_k: b̃_k,t}`` for every part k with adaptive clipping, else nothing."""
        if not self.privacy.adaptive:
            return {}
        fractions = self._fractions(ctx, [float(bits) for bits in total.unclipped], total.count)
        return {part_fraction(k): fraction for k, fraction in enumerate(fractions)}

    def _fractions(self, ctx: RoundFacts, unclipped: Sequence[float], reported: int) -> list[float]:
        """b̃_k,t of each count in ``unclipped`` among ``reported`` clients, each noised with N(0, σ_b²) from the
        round's count stream (:func:`rayfed.privacy.adaptive.noised_fraction`)."""
        noise = gaussian_noise(self.seed, ctx.round, COUNT_STREAM, len(unclipped), self.count_noise)
        planned = self.planned_count(ctx)
        return [noised_fraction(bits, reported, float(draw), planned) for bits, draw in zip(unclipped, noise)]


def part_scales(bounds: Sequence[float], sizes: Sequence[int], part_noise: float) -> np.ndarray:
    """z_k·B_k for every coordinate of the concatenated parts: each part's noise standard deviation for a client of
    weight 1, from the parts' bounds B_k and their multiplier z_k (z·√P,
    :func:`~rayfed.algorithms.private_uploads.part_multiplier`)."""
    return np.concatenate([np.full(n, part_noise * bound, np.float32) for bound, n in zip(bounds, sizes)])
