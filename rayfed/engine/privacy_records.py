"""A run's differential privacy at the engine (docs/privacy.md): the checks that refuse it before anything is
written, and the ε it records after every round (``rounds.parquet``'s ``epsilon``, ``summary.json``'s).

ε after t rounds depends on the config alone (the sampling, the noise multiplier, δ), so a resumed run records
what the first attempt would have, and ``privacy.target_epsilon`` is checked over ``train.rounds`` before round 0:
a run that would exceed it never starts (nothing needs to stop it mid-way).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.algorithms.private_uploads import privacy_refusal
from rayfed.config import RunConfig
from rayfed.privacy.accountant import Accounting, accounting_of
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import participants

__all__ = ["EPSILON", "run_accounting", "check_privacy", "privacy_columns", "privacy_summary"]

EPSILON = "epsilon"
"""The column of ``rounds.parquet`` (and the entry of ``summary.json``): ε at ``privacy.delta`` after the round."""


def run_accounting(config: RunConfig) -> Accounting | None:
    """The accountant's analysis of ``config``'s run (:func:`rayfed.privacy.accountant.accounting_of`); None
    without privacy."""
    if not config.privacy.enabled:
        return None
    clients = config.data.num_clients
    return accounting_of(config.privacy, clients, participants(clients, config.engine.join_ratio))


def check_privacy(config: RunConfig, algorithm: ResolvedAlgorithm) -> None:
    """Refuse, in one line naming the field and the fix, a run whose privacy cannot hold: a method whose upload
    the mechanism cannot protect, a system model (not covered yet), an accountant without an analysis of the
    run's sampling, or ε over ``train.rounds`` above ``privacy.target_epsilon``."""
    privacy = config.privacy
    if not privacy.enabled:
        return
    refusal = privacy_refusal(algorithm.name, algorithm.algorithm.server_half, privacy.mechanism)
    if refusal:
        raise ConfigError(refusal)
    if config.system.enabled:
        raise ConfigError(
            f"privacy.mechanism={privacy.mechanism!r} does not yet account for a system model's sampling among "
            f"the clients online (system.devices={config.system.devices!r}): set system.devices='off' or "
            "privacy.mechanism='off'"
        )
    accounting = run_accounting(config)
    assert accounting is not None
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


def privacy_columns(accounting: Accounting | None, round_index: int) -> dict[str, float]:
    """A ``rounds.parquet`` row's privacy columns after round ``round_index`` (-1: the initial model, ε = 0);
    none without privacy."""
    if accounting is None:
        return {}
    return {EPSILON: accounting.epsilon(round_index + 1)}


def privacy_summary(history: Sequence[Mapping[str, Any]], config: RunConfig) -> dict[str, Any]:
    """``summary.json``'s entries of a private run (none without privacy): the final ε and its δ."""
    if not config.privacy.enabled:
        return {}
    rounds = [row for row in history if row["round"] >= 0]
    epsilon = float(rounds[-1][EPSILON]) if rounds else 0.0
    return {EPSILON: epsilon if math.isfinite(epsilon) else None, "delta": config.privacy.delta}
