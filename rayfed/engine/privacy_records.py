"""A run's differential privacy at the engine (docs/privacy.md): the checks that refuse it before anything is
written, and the ε it records after every round (``rounds.parquet``'s ``epsilon``, ``summary.json``'s).

ε after t rounds depends on the config alone (the sampling, the noise multiplier, δ), so a resumed run records
what the first attempt would have, and ``privacy.target_epsilon`` is checked over ``train.rounds`` before round 0:
a run that would exceed it never starts (nothing needs to stop it mid-way).

With adaptive clipping the engine carries the clip norm from round to round (:class:`PrivacyLedger`): round t's
C_t travels in its context, the server reports the noised unclipped fraction b̃_t, and C_{t+1} follows from both
(:func:`rayfed.privacy.adaptive.next_clip_norm`). Both are columns of ``rounds.parquet`` (``clip_norm``,
``server_unclipped_fraction``), so a resumed run takes C up from its history. A method that uploads P parts adapts
each part's bound B_k alike (round t's bounds in its context's ``part_bounds``), and records them as ``clip_norm_k``
beside ``server_unclipped_fraction_k``, k = 1..P. rounds.parquet is read up to the checkpoint's round on a resume
(:mod:`rayfed.provenance.resume_point`), so the bounds a resumed round uses are the first attempt's, to the bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rayfed.algorithms import ResolvedAlgorithm, resolve
from rayfed.algorithms.private_uploads import (
    ModelRowsUpload,
    ModelUpload,
    UploadPart,
    declared_parts,
    privacy_refusal,
)
from rayfed.config import RunConfig
from rayfed.execution.privacy import UNCLIPPED, part_fraction
from rayfed.execution.round_facts import RoundFacts
from rayfed.privacy.accountant import Accounting, accounting_of
from rayfed.privacy.adaptive import default_count_noise, next_clip_norm, update_noise_multiplier
from rayfed.privacy.settings import PrivacyConfig
from rayfed.scheduling.system_setup import is_asynchronous
from rayfed.system.rounds import round_sizes
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import participants

__all__ = ["EPSILON", "CLIP_NORM", "run_accounting", "check_privacy", "PrivacyLedger", "privacy_summary"]

EPSILON = "epsilon"
"""The column of ``rounds.parquet`` (and the entry of ``summary.json``): ε at ``privacy.delta`` after the round."""
CLIP_NORM = "clip_norm"
"""The column of ``rounds.parquet`` with adaptive clipping: the round's clip norm C_t."""


def run_accounting(config: RunConfig) -> Accounting | None:
    """The accountant's analysis of ``config``'s run (:func:`rayfed.privacy.accountant.accounting_of`); None
    without privacy. The sampling is the one the round planned, not who reported (docs/privacy.md, "With a
    system model"): Poisson with probability join_ratio; else ⌊join_ratio·N⌋ drawn, or with a system model the
    ⌊n · over_commit⌋ a round samples, uniform among all N only while every client is always online. An
    asynchronous method's round is a server step, whose clients start as slots free up: no amplification, each step
    the Gaussian mechanism under replacing one client's data (docs/privacy.md, "Asynchronous aggregation")."""
    if not config.privacy.enabled:
        return None
    clients, ratio, system = config.data.num_clients, config.engine.join_ratio, config.system
    if is_asynchronous(resolve(config.algorithm)):  # a round per server step; clients start as slots free up
        return accounting_of(config.privacy, clients, clients, uniform=False, per="server step")
    if config.engine.participation == "poisson":
        return accounting_of(config.privacy, clients, participants(clients, ratio), ratio)
    if not system.enabled:
        return accounting_of(config.privacy, clients, participants(clients, ratio))
    wanted, drawn = round_sizes(clients, ratio, system.over_commit)
    # An over-committed round that draws every client keeps n of them by finish time: one client added could take
    # another's place, so only the replace-one analysis without amplification holds, as among clients online.
    uniform = system.availability == "always" and (drawn < clients or drawn == wanted)
    return accounting_of(config.privacy, clients, drawn, uniform=uniform)


def check_privacy(config: RunConfig, algorithm: ResolvedAlgorithm) -> None:
    """Refuse, in one line naming the field and the fix, a run whose privacy cannot hold: a method whose upload the
    mechanism cannot protect (or not with these settings: its ``privacy_conflict``), secure aggregation without a
    clock to charge, an accountant without an analysis of the run's sampling, or ε over ``train.rounds`` above
    ``privacy.target_epsilon``."""
    privacy = config.privacy
    if not privacy.enabled:
        return
    server_half = algorithm.algorithm.server_half
    refusal = privacy_refusal(algorithm.name, server_half, privacy.mechanism)
    if not refusal and issubclass(server_half, ModelUpload | ModelRowsUpload):
        conflict = server_half.privacy_conflict(algorithm.server_params, privacy)
        refusal = f"algorithm.name={algorithm.name!r} with privacy: {conflict}" if conflict else ""
    if refusal:
        raise ConfigError(refusal)
    if privacy.secure_aggregation != "off" and not config.system.enabled:
        raise ConfigError(
            f"privacy.secure_aggregation={privacy.secure_aggregation!r} charges its messages on the virtual clock, "
            "which needs a system model, but system.devices='off': set system.devices (docs/system.md), or "
            "privacy.secure_aggregation='off'"
        )
    accounting = run_accounting(config)
    assert accounting is not None
    if privacy.adaptive:
        _check_count_noise(privacy, accounting, len(declared_parts(algorithm.algorithm.server_half)) or 1)
    if privacy.target_epsilon is not None:
        rounds = config.train.rounds
        epsilon = accounting.epsilon(rounds)
        if epsilon > privacy.target_epsilon:
            raise ConfigError(
                f"privacy.target_epsilon={privacy.target_epsilon:g} cannot be met: epsilon after train.rounds="
                f"{rounds} rounds is {epsilon:.4g} at privacy.delta={privacy.delta:g} with "
                f"privacy.noise_multiplier={privacy.noise_multiplier:g}; raise the noise multiplier (`rayfed "
                f"privacy --target-epsilon {privacy.target_epsilon:g}` with the run's options names the one it "
                "needs) or lower train.rounds"
            )


def _check_count_noise(privacy: PrivacyConfig, accounting: Accounting, counts: int) -> None:
    """Refuse adaptive clipping whose ``counts`` noised counts (one per uploaded part) would take all of the noise
    budget: z_Δ = (z⁻² − P·(2σ_b)⁻²)^(−1/2) needs 2σ_b > z·√P (:mod:`rayfed.privacy.adaptive`)."""
    count = default_count_noise(accounting.per_round) if privacy.count_noise is None else privacy.count_noise
    if math.isinf(update_noise_multiplier(privacy.noise_multiplier, count, counts)):
        least = privacy.noise_multiplier * math.sqrt(counts) / 2
        parts = f"·√{counts} (one count for each of the {counts} parts it uploads)" if counts > 1 else ""
        raise ConfigError(
            f"privacy.count_noise={count:g} leaves no noise for the updates: adaptive clipping needs it above "
            f"privacy.noise_multiplier{parts}/2={least:g} (Andrew et al. 2021, Section 3.2); raise "
            "privacy.count_noise"
        )


class PrivacyLedger:
    """What the engine keeps of a run's privacy between rounds: the accountant's analysis, and with adaptive
    clipping the next round's clip norm (module docstring). Without privacy it adds nothing."""

    def __init__(self, config: RunConfig, history: Sequence[Mapping[str, Any]], algorithm: ResolvedAlgorithm) -> None:
        self.privacy = config.privacy
        self.accounting = run_accounting(config)
        self.parts: tuple[UploadPart, ...] = declared_parts(algorithm.algorithm.server_half)
        """The parts the method uploads, each with a bound of its own; (): a model."""
        self.bounds = tuple(part.norm(self.privacy.clip_norm) for part in self.parts) or (self.privacy.clip_norm,)
        """The next round's clip norm C, or each part's bound B_k (adaptive clipping), taken up from the history of
        a resumed run."""
        done = [row for row in history if row["round"] >= 0]
        if self.privacy.adaptive and done:
            names = self._names()
            self._advance([done[-1][bound] for bound, _ in names], [done[-1][f"server_{key}"] for _, key in names])

    def _names(self) -> list[tuple[str, str]]:
        """(the bound's column, the server metric of its noised fraction) of the model, or of each part."""
        if not self.parts:
            return [(CLIP_NORM, UNCLIPPED)]
        return [(f"{CLIP_NORM}_{k + 1}", part_fraction(k)) for k in range(len(self.parts))]

    def _advance(self, bounds: Sequence[float], fractions: Sequence[float]) -> None:
        quantile = self.privacy.adaptive_quantile
        assert quantile is not None
        ceilings = [part.ceiling for part in self.parts] or [math.inf]
        self.bounds = tuple(
            next_clip_norm(bound, fraction, quantile, self.privacy.adaptive_lr, ceiling)
            for bound, fraction, ceiling in zip(bounds, fractions, ceilings)
        )

    def context(self, ctx: RoundFacts) -> RoundFacts:
        """``ctx`` with the round's clip norm, or its parts' bounds, where they adapt."""
        if not self.privacy.adaptive:
            return ctx
        if self.parts:
            return dataclasses.replace(ctx, part_bounds=self.bounds)
        return dataclasses.replace(ctx, clip_norm=self.bounds[0])

    def columns(self, ctx: RoundFacts, extra: Mapping[str, float]) -> dict[str, float]:
        """The privacy columns of the row of round ``ctx.round`` (-1: the initial model, ε = 0), whose server
        metrics are ``extra``; the clip norm moves on to the next round's. None without privacy."""
        if self.accounting is None:
            return {}
        columns = {EPSILON: self.accounting.epsilon(ctx.round + 1)}
        bounds = ctx.part_bounds if self.parts else (None if ctx.clip_norm is None else (ctx.clip_norm,))
        if self.privacy.adaptive and bounds is not None:
            names = self._names()
            columns.update({column: float(bound) for (column, _), bound in zip(names, bounds)})
            if ctx.round >= 0:
                self._advance(bounds, [extra.get(key, math.nan) for _, key in names])
        return columns


def privacy_summary(history: Sequence[Mapping[str, Any]], config: RunConfig) -> dict[str, Any]:
    """``summary.json``'s entries of a private run (none without privacy): the final ε and its δ."""
    if not config.privacy.enabled:
        return {}
    rounds = [row for row in history if row["round"] >= 0]
    epsilon = float(rounds[-1][EPSILON]) if rounds else 0.0
    return {EPSILON: epsilon if math.isfinite(epsilon) else None, "delta": config.privacy.delta}
