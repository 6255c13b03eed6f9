"""The ``privacy`` section of a run's config: which mechanism protects the clients' uploads, and how much.

Off by default (``privacy.mechanism="off"``): then nothing of it runs and every number of a run is what it is
without this section. docs/privacy.md gives each field's formula and the name pfl-research, Flower, Opacus and
TensorFlow Federated give it.

>>> PrivacyConfig(mechanism="central", clip_norm=0.5, noise_multiplier=1.0).enabled
True
>>> PrivacyConfig(mechanism="central", clip_norm=0.0)
Traceback (most recent call last):
...
rayfed.util.errors.ConfigError: privacy.clip_norm must be a number > 0 (inf: no clipping, with \
privacy.noise_multiplier=0 only), but got privacy.clip_norm=0.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.validation import check, check_choice, check_real, is_int, is_real

__all__ = ["PrivacyConfig", "MECHANISMS", "ACCOUNTANTS", "WEIGHTINGS", "SECURE_AGGREGATIONS"]

MECHANISMS = ("off", "central", "local")
"""No privacy; the server noises the clipped sum once (DP-FedAvg); each client noises its own clipped update."""
ACCOUNTANTS = ("rdp", "pld")
"""dp-accounting's Rényi-DP accountant, or its privacy-loss-distribution accountant."""
SECURE_AGGREGATIONS = ("off", "secagg", "secagg_plus")
"""No secure aggregation's cost; SecAgg's (Bonawitz et al. 2017) or SecAgg+'s (Bell et al. 2020) on the clock."""
WEIGHTINGS = ("uniform", "samples")
"""Each client's clipped update counts once (w_i = 1), or by its training samples (w_i = n_i / max_j n_j)."""


@section("privacy")
@dataclass(frozen=True)
class PrivacyConfig:
    """User-level differential privacy of the clients' uploads (DP-FedAvg) and its accounting."""

    mechanism: str = documented(
        "off",
        "off (no privacy), central (DP-FedAvg: each update clipped, their sum noised once on the server), or "
        "local (each client noises its own clipped update before it uploads).",
    )
    clip_norm: float = documented(
        1.0,
        "C: each client's update θ_i − θ_g is scaled to an L2 norm of at most C (inf: no clipping, allowed only "
        "with noise_multiplier=0, a check of the path).",
    )
    noise_multiplier: float = documented(
        1.0, "z: the Gaussian noise's standard deviation is z·C (on the sum, or on each client's update)."
    )
    delta: float = documented(1e-5, "δ of the (ε, δ) guarantee the accountant reports ε at; in (0, 1).")
    accountant: str = documented(
        "rdp",
        "rdp (Rényi DP, Mironov 2017; the run's sampling: without replacement, or Poisson) or pld (privacy loss "
        "distributions; not for a fixed number drawn without replacement: engine.join_ratio=1, or "
        "engine.participation='poisson').",
    )
    target_epsilon: float | None = documented(
        None, "Refuse the run before it starts when ε after train.rounds rounds would exceed it; None: no budget."
    )
    weighting: str = documented(
        "uniform",
        "uniform (every clipped update counts once: the sum's sensitivity is C) or samples (by training samples, "
        "w_i = n_i / max_j n_j ≤ 1, the DP-FedAvg paper's weighted estimator: sensitivity C in units of w).",
    )
    adaptive_quantile: float | None = documented(
        None,
        "γ of adaptive clipping (Andrew et al. 2021): the clip norm follows this quantile of the update norms, "
        "starting at clip_norm; None: a fixed clip norm. Central DP only.",
    )
    adaptive_lr: float = documented(0.2, "η_C, the step of the clip norm's geometric update (the paper's 0.2).")
    count_noise: float | None = documented(
        None,
        "σ_b, the Gaussian noise on the count of unclipped updates (adaptive clipping); None: m/20 for m clients "
        "a round, the paper's choice. It must exceed noise_multiplier/2 (noise_multiplier·√P/2 for a method that "
        "uploads P parts, one count each).",
    )

    secure_aggregation: str = documented(
        "off",
        "off, secagg (Bonawitz et al. CCS 2017) or secagg_plus (Bell et al. CCS 2020): charge each client the "
        "protocol's key agreement and secret shares, and its masked vector's wider elements, on the virtual clock "
        "as upload bytes (needs a system model; docs/privacy.md, 'Secure aggregation's cost').",
    )
    secagg_neighbours: int | None = documented(
        None,
        "k, the clients each one shares keys with in SecAgg+'s graph (Bell et al.: O(log n)); None: ⌈log2 n⌉ for "
        "the n clients a round samples. secure_aggregation='secagg_plus' only.",
    )

    def __post_init__(self) -> None:
        check_choice("privacy.mechanism", self.mechanism, MECHANISMS)
        check_choice("privacy.secure_aggregation", self.secure_aggregation, SECURE_AGGREGATIONS)
        if self.secagg_neighbours is not None:
            check(
                is_int(self.secagg_neighbours) and self.secagg_neighbours >= 1,
                "privacy.secagg_neighbours",
                self.secagg_neighbours,
                "an integer >= 1",
            )
            check(
                self.secure_aggregation == "secagg_plus",
                "privacy.secure_aggregation",
                self.secure_aggregation,
                "'secagg_plus' where privacy.secagg_neighbours is set (or leave privacy.secagg_neighbours out)",
            )
        check(
            self.secure_aggregation == "off" or self.mechanism != "off",
            "privacy.mechanism",
            self.mechanism,
            f"'central' or 'local' where privacy.secure_aggregation={self.secure_aggregation!r} (or set it 'off')",
        )
        check_choice("privacy.accountant", self.accountant, ACCOUNTANTS)
        check_choice("privacy.weighting", self.weighting, WEIGHTINGS)
        check(
            is_real(self.clip_norm) and self.clip_norm > 0 and not math.isnan(self.clip_norm),
            "privacy.clip_norm",
            self.clip_norm,
            "a number > 0 (inf: no clipping, with privacy.noise_multiplier=0 only)",
        )
        check_real("privacy.noise_multiplier", self.noise_multiplier, low=0)
        check_real("privacy.delta", self.delta, low=0, high=1, low_open=True, high_open=True)
        if self.target_epsilon is not None:
            check_real("privacy.target_epsilon", self.target_epsilon, low=0, low_open=True)
        if self.adaptive_quantile is not None:
            check_real(
                "privacy.adaptive_quantile", self.adaptive_quantile, low=0, high=1, low_open=True, high_open=True
            )
            if self.mechanism == "local" or math.isinf(self.clip_norm):
                raise ConfigError(
                    f"privacy.adaptive_quantile={self.adaptive_quantile:g} adapts a finite clip norm on the server: "
                    f"use privacy.mechanism='central' with a finite privacy.clip_norm, or leave adaptive_quantile out"
                )
        check_real("privacy.adaptive_lr", self.adaptive_lr, low=0, low_open=True)
        if self.count_noise is not None:
            check_real("privacy.count_noise", self.count_noise, low=0)
        if math.isinf(self.clip_norm) and self.noise_multiplier > 0:
            raise ConfigError(
                f"privacy.clip_norm=inf (no clipping) leaves the sensitivity unbounded, so "
                f"privacy.noise_multiplier={self.noise_multiplier:g} has no finite noise: set a finite "
                "privacy.clip_norm, or privacy.noise_multiplier=0"
            )

    @property
    def adaptive(self) -> bool:
        """Whether the clip norm adapts (adaptive clipping)."""
        return self.adaptive_quantile is not None

    @property
    def enabled(self) -> bool:
        """Whether any mechanism runs."""
        return self.mechanism != "off"

    @property
    def noise_std(self) -> float:
        """σ = z·C, the standard deviation of the Gaussian noise in units of a weight-1 update (0 without noise)."""
        return 0.0 if self.noise_multiplier == 0 else self.noise_multiplier * self.clip_norm
