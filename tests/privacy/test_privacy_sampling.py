"""Privacy beside the sampling and the systems model: Poisson sampling's accountant against dp-accounting used
directly (RDP and PLD), a sample that is not uniform claiming no amplification, the fixed denominator of a planned
round whoever reported, secure aggregation's bytes against the papers' formulas by hand, and the one-line
refusals of the new knobs."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from rayfed import ConfigError, RunConfig
from rayfed.algorithms.contributions import WeightedSum
from rayfed.algorithms.private_uploads import ModelUpload
from rayfed.execution.privacy import ServerPrivacy
from rayfed.execution.round_facts import RoundFacts
from rayfed.privacy.accountant import accounting_of
from rayfed.privacy.secure_aggregation import overhead_bytes
from rayfed.privacy.settings import PrivacyConfig
from rayfed.util.seeding import poisson_sample

ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


def test_poisson_samplings_rdp_epsilon_is_dp_accountings_own() -> None:
    privacy = PrivacyConfig(mechanism="central", noise_multiplier=1.1, delta=1e-6)
    accounting = accounting_of(privacy, num_clients=100, per_round=10, poisson_rate=0.1)
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=ADD_OR_REMOVE)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 40)
    assert accounting.epsilon(40) == accountant.get_epsilon(1e-6)


def test_poisson_samplings_pld_epsilon_is_dp_accountings_own() -> None:
    privacy = PrivacyConfig(mechanism="central", noise_multiplier=1.5, delta=1e-5, accountant="pld")
    accounting = accounting_of(privacy, num_clients=40, per_round=8, poisson_rate=0.2)  # no longer refused
    accountant = dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.5)), 5)
    assert accounting.epsilon(5) == accountant.get_epsilon(1e-5)
    every = accounting_of(privacy, num_clients=40, per_round=40, poisson_rate=1.0)  # q = 1: every client
    assert every.epsilon(5) < math.inf and every.epsilon(5) > accounting.epsilon(5)


def test_a_sample_among_the_clients_online_claims_no_amplification() -> None:
    privacy = PrivacyConfig(mechanism="central", noise_multiplier=2.0)
    accounting = accounting_of(privacy, num_clients=50, per_round=5, uniform=False)
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(2.0 / 2), 10)  # replace-one: the sum moves by 2C
    assert accounting.epsilon(10) == accountant.get_epsilon(1e-5)
    assert accounting.epsilon(10) > accounting_of(privacy, num_clients=50, per_round=5).epsilon(10)


def test_poisson_sampling_is_seeded_and_joins_at_its_rate() -> None:
    clients = np.arange(200)
    first = [poisson_sample(7, t, clients, 0.05) for t in range(400)]
    again = [poisson_sample(7, t, clients, 0.05) for t in range(400)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    counts = np.array([len(ids) for ids in first])
    assert abs(counts.mean() - 10.0) < 4 * math.sqrt(200 * 0.05 * 0.95 / 400)  # Binomial(200, q)'s mean
    assert (counts == 0).sum() == 0 or counts.min() == 0  # a round may take none
    assert not np.array_equal(first[0], poisson_sample(8, 0, clients, 0.05))


class _Reference(ModelUpload):
    def privacy_reference(self) -> np.ndarray:
        return np.full(4, 2.0, np.float32)


def _server(**overrides: object) -> ServerPrivacy:
    config = RunConfig().override({"data.num_clients": 20, "privacy.mechanism": "central", **overrides})
    return ServerPrivacy(config, None)


def test_the_denominator_is_the_plan_whoever_reported() -> None:
    received = WeightedSum(np.full(4, 3.0, np.float32), 1.0, 1)  # one client sent θ = 3, θ_g = 2
    planned = RoundFacts(round=0, seed=0, lr=0.1, sampled=np.array([3]), planned=np.array([1, 3, 8, 9]))
    no_noise = {"privacy.noise_multiplier": 0.0, "engine.join_ratio": 0.2}
    folded, _ = _server(**no_noise).privatized(planned, received, _Reference())
    assert folded.weight == 4.0 and np.allclose(folded.average(), 2.25)  # 3 dropped: zero updates
    committed = _server(**{**no_noise, "engine.join_ratio": 0.1})  # n = 2 of the 4 drawn (over-commitment)
    assert committed.privatized(planned, received, _Reference())[0].weight == 2.0
    poisson = _server(**{**no_noise, "engine.participation": "poisson", "engine.join_ratio": 0.25})
    assert poisson.privatized(planned, received, _Reference())[0].weight == 0.25 * 20  # q·N, the expected count


def test_a_round_without_uploads_still_releases_the_noised_sum() -> None:
    server = _server(**{"privacy.noise_multiplier": 1.0, "privacy.clip_norm": 0.5})
    ctx = RoundFacts(round=3, seed=0, lr=0.1, sampled=np.array([], dtype=np.int64), planned=np.array([2, 5]))
    folded, _ = server.privatized(ctx, server.empty(_Reference()), _Reference())
    noise = folded.average() - 2.0
    assert folded.weight == 2.0 and folded.count == 0 and np.all(noise != 0)
    assert np.allclose(np.abs(noise).mean(), 0.5 / 2 * math.sqrt(2 / math.pi), rtol=0.9)  # z·C/m in scale


def test_secaggs_bytes_are_the_papers_formula_by_hand() -> None:
    # n = 5 clients, a float32 upload of 1,000 elements: 2·5·256 + (5·5 − 4)·256 key and share bits, and
    # 1,000 · ⌈log2 5⌉ = 3,000 more bits for the masked elements.
    assert overhead_bytes("secagg", 5, 4000.0) == math.ceil((2 * 5 * 256 + 21 * 256 + 1000 * 3) / 8)
    # SecAgg+ with k = 2 neighbours: a neighbourhood of 3 in the key and share terms, still ⌈log2 n⌉ bits.
    plus = overhead_bytes("secagg_plus", 100, 4000.0, neighbours=2)
    assert plus == math.ceil((2 * 3 * 256 + 11 * 256 + 1000 * 7) / 8)
    assert overhead_bytes("secagg_plus", 100, 4000.0) == math.ceil((2 * 8 * 256 + 36 * 256 + 7000) / 8)  # k = 7
    assert overhead_bytes("secagg", 1, 4000.0) == 0.0 and overhead_bytes("off", 9, 4000.0) == 0.0
    per_client = overhead_bytes("secagg", 5, np.array([4000.0, 8000.0]))
    assert np.array_equal(per_client, [(7936 + 3000) / 8, (7936 + 6000) / 8])  # one upload each


@pytest.mark.parametrize(("clients", "elements", "expansion"), [(2**10, 2**20, 1.73), (2**14, 2**24, 1.98)])
def test_secaggs_formula_gives_the_papers_expansion(clients: int, elements: int, expansion: float) -> None:
    # Bonawitz et al.'s abstract: 16-bit inputs cost 1.73x (2^10 clients, 2^20 elements) and 1.98x (2^14, 2^24)
    # the bits sent in the clear. In rayfed's float32 terms: an upload of `elements` 4-byte values, whose
    # overhead beside 16-bit inputs is the keys, the shares and ⌈log2 n⌉ bits an element.
    overhead_bits = 8 * overhead_bytes("secagg", clients, 4.0 * elements)
    assert round((16 * elements + overhead_bits) / (16 * elements), 2) == expansion


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"privacy.secure_aggregation": "secagg+"}, "privacy.secure_aggregation must be one of"),
        ({"privacy.secure_aggregation": "secagg_plus", "privacy.secagg_neighbours": 0}, "an integer >= 1"),
        ({"privacy.secure_aggregation": "secagg", "privacy.secagg_neighbours": 3}, "'secagg_plus' where"),
        ({"privacy.mechanism": "off", "privacy.secure_aggregation": "secagg"}, "privacy.mechanism must be"),
        ({"engine.participation": "bernoulli"}, "engine.participation must be one of"),
        ({"engine.participation": "poisson", "system.devices": "equal"}, "engine.participation must be 'fixed'"),
    ],
)
def test_bad_values_of_the_new_knobs_are_refused_in_one_line(overrides: dict, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RunConfig().override({"privacy.mechanism": "central", **overrides})
    assert says in str(refused.value) and "\n" not in str(refused.value)
