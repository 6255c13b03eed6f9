"""The privacy package's parts: the config's one-line refusals, clipping over a stack and one client at a time,
the seeded noise, and the accountant against dp-accounting used directly."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch

from rayfed.privacy.accountant import accounting_of
from rayfed.privacy.clipping import clipped_delta, clipped_model
from rayfed.privacy.noise import gaussian_noise
from rayfed.privacy.settings import PrivacyConfig
from rayfed.util.errors import ConfigError


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("clip_norm", 0.0, "privacy.clip_norm must be a number > 0"),
        ("clip_norm", -1.0, "privacy.clip_norm must be a number > 0"),
        ("delta", 1.0, "privacy.delta must be a finite number in (0, 1)"),
        ("delta", 0.0, "privacy.delta must be a finite number in (0, 1)"),
        ("noise_multiplier", -0.5, "privacy.noise_multiplier must be a finite number >= 0"),
        ("mechanism", "centrl", "privacy.mechanism must be one of"),
        ("accountant", "prv", "privacy.accountant must be one of"),
        ("target_epsilon", 0.0, "privacy.target_epsilon must be a finite number > 0"),
    ],
)
def test_bad_values_are_refused_in_one_line(field: str, value: object, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        PrivacyConfig(**{"mechanism": "central", field: value})  # type: ignore[arg-type]
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_no_clipping_needs_no_noise() -> None:
    with pytest.raises(ConfigError, match="privacy.clip_norm=inf"):
        PrivacyConfig(mechanism="central", clip_norm=math.inf, noise_multiplier=1.0)
    assert PrivacyConfig(mechanism="central", clip_norm=math.inf, noise_multiplier=0.0).noise_std == 0.0


def _updates(lanes: int = 6, size: int = 257) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    start = torch.randn(size, generator=generator)
    scales = torch.tensor([0.0, 0.01, 0.5, 1.0, 3.0, 40.0])[:lanes, None]
    trained = start + scales * torch.randn(lanes, size, generator=generator)
    return trained, start.expand(lanes, -1)


@pytest.mark.parametrize("clip_norm", [0.1, 1.0, 5.0])
def test_every_clipped_update_is_within_the_clip_norm_stacked_and_one_by_one(clip_norm: float) -> None:
    trained, starts = _updates()
    stacked = clipped_model(trained, starts, clip_norm)
    one_by_one = torch.stack([clipped_model(trained[i], starts[i], clip_norm) for i in range(len(trained))])
    assert torch.equal(stacked, one_by_one)
    norms = torch.linalg.vector_norm((stacked - starts).double(), dim=1)
    assert (norms <= clip_norm * (1 + 1e-6)).all()  # float32 rounding of θ_g + Δ̃, never more
    assert (torch.linalg.vector_norm(clipped_delta(trained - starts, clip_norm), dim=1) <= clip_norm * (1 + 1e-6)).all()
    within = torch.linalg.vector_norm(trained - starts, dim=1) <= clip_norm
    assert torch.equal(stacked[within], trained[within])  # an update within the bound is uploaded bit for bit


def test_no_clipping_leaves_every_bit() -> None:
    trained, starts = _updates()
    assert torch.equal(clipped_model(trained, starts, math.inf), trained)


def test_the_noise_is_seeded_by_run_round_and_stream() -> None:
    one = gaussian_noise(7, 3, 0, 100, 2.0)
    assert np.array_equal(one, gaussian_noise(7, 3, 0, 100, 2.0))
    for other in (
        gaussian_noise(8, 3, 0, 100, 2.0),
        gaussian_noise(7, 4, 0, 100, 2.0),
        gaussian_noise(7, 3, 1, 100, 2.0),
    ):
        assert not np.array_equal(one, other)
    assert one.dtype == np.float32


def test_rdp_epsilon_of_fixed_size_sampling_is_dp_accountings_own() -> None:
    privacy = PrivacyConfig(mechanism="central", noise_multiplier=1.3, delta=1e-6)
    accounting = accounting_of(privacy, num_clients=50, per_round=5)
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(50, 5, dp_accounting.GaussianDpEvent(1.3 / 2))
    accountant.compose(event, 30)
    assert accounting.epsilon(30) == accountant.get_epsilon(1e-6)


def test_pld_epsilon_of_full_participation_is_dp_accountings_own() -> None:
    privacy = PrivacyConfig(mechanism="central", noise_multiplier=2.0, delta=1e-5, accountant="pld")
    accounting = accounting_of(privacy, num_clients=10, per_round=10)
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(2.0), 4)
    assert accounting.epsilon(4) == accountant.get_epsilon(1e-5)
    assert accounting.epsilon(0) == 0.0


def test_pld_is_refused_where_the_run_samples_a_fixed_number() -> None:
    with pytest.raises(ConfigError, match="privacy.accountant='pld' has no analysis of the fixed-size sampling"):
        accounting_of(PrivacyConfig(mechanism="central", accountant="pld"), num_clients=20, per_round=2)


def test_the_noise_for_a_target_meets_it() -> None:
    accounting = accounting_of(PrivacyConfig(mechanism="central"), num_clients=20, per_round=20)
    z = accounting.noise_for(4.0, 10)
    assert accounting.epsilon_at(z, 10) <= 4.0 + 1e-3
    assert accounting.epsilon_at(z * 0.95, 10) > 4.0


def test_the_clip_norm_moves_geometrically_toward_the_quantile() -> None:
    from rayfed.privacy.adaptive import next_clip_norm, update_noise_multiplier

    assert next_clip_norm(1.0, 0.5, 0.5, 0.2) == 1.0  # at the quantile it stays
    assert next_clip_norm(1.0, 0.0, 0.5, 0.2) == pytest.approx(math.exp(0.1))  # all clipped: it grows
    assert next_clip_norm(1.0, 1.0, 0.5, 0.2) == pytest.approx(math.exp(-0.1))  # none clipped: it shrinks
    assert next_clip_norm(2.0, math.nan, 0.5, 0.2) == 2.0  # a round without uploads keeps it
    z_update = update_noise_multiplier(1.0, 5.0)
    assert (z_update**-2 + (2 * 5.0) ** -2) ** -0.5 == pytest.approx(1.0)  # Theorem 1: together they are z
    assert math.isinf(update_noise_multiplier(1.0, 0.5))


def test_the_parts_counts_and_updates_compose_to_the_runs_multiplier_in_dp_accounting() -> None:
    # P parts, P centred count bits per client (sensitivity ½ each under adding one client): dp-accounting composing
    # the P updates' Gaussians (z_k = z_Δ·√P) with the P counts' (2σ_b) gives the ε of one Gaussian of z.
    import dp_accounting

    from rayfed.privacy.adaptive import next_clip_norm, noised_fraction, update_noise_multiplier

    z, count_noise, parts, delta = 0.8, 1.5, 2, 1e-5
    z_update = update_noise_multiplier(z, count_noise, parts)
    assert z_update == pytest.approx((z**-2 - parts * (2 * count_noise) ** -2) ** -0.5)
    releases = [dp_accounting.GaussianDpEvent(z_update * math.sqrt(parts))] * parts
    releases += [dp_accounting.GaussianDpEvent(2 * count_noise)] * parts
    epsilons = []
    for event in (dp_accounting.ComposedDpEvent(releases), dp_accounting.GaussianDpEvent(z)):
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(event, 10)
        epsilons.append(accountant.get_epsilon(delta))
    assert epsilons[0] == pytest.approx(epsilons[1], rel=1e-9)
    assert math.isinf(update_noise_multiplier(z, 0.99 * z * math.sqrt(parts) / 2, parts))  # 2σ_b must exceed z·√P
    assert noised_fraction(3.0, 4, 0.0, 4.0) == 0.75  # (Σ (b_i − ½) + 0) / m + ½
    assert next_clip_norm(0.9, 1.0, 0.5, 0.2, ceiling=1.0) < 0.9  # a statistic's bound shrinks to its quantile
    assert next_clip_norm(0.99, 0.0, 0.5, 0.2, ceiling=1.0) == 1.0  # but never above its own bound


def test_adaptive_clipping_is_refused_where_it_cannot_adapt() -> None:
    with pytest.raises(ConfigError, match="privacy.adaptive_quantile=0.5 adapts a finite clip norm"):
        PrivacyConfig(mechanism="local", adaptive_quantile=0.5)
    with pytest.raises(ConfigError, match="privacy.adaptive_quantile must be a finite number in"):
        PrivacyConfig(mechanism="central", adaptive_quantile=1.0)
