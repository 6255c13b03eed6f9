"""DP-FedAvg where the halves run: the worker's clipped uploads, stacked and one by one, and the server's fixed
denominator and noise, whose spread is the formula's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from rayfed.algorithms.contributions import WeightedState, WeightedSum
from rayfed.algorithms.private_uploads import ModelUpload
from rayfed.config import RunConfig
from rayfed.execution.privacy import ClientPrivacy, ClippedSum, ServerPrivacy
from rayfed.execution.round_facts import RoundFacts


class _Reference(ModelUpload):
    def __init__(self, vector: np.ndarray) -> None:
        self.vector = vector

    def privacy_reference(self) -> np.ndarray:
        return self.vector


def _config(**privacy: object) -> RunConfig:
    return RunConfig().override({f"privacy.{key}": value for key, value in privacy.items()})


def _ctx(round_index: int, sampled: int) -> RoundFacts:
    return RoundFacts(round=round_index, seed=0, lr=0.1, sampled=np.arange(sampled))


def test_a_stacks_upload_is_its_clients_one_by_one() -> None:
    for mechanism in ("central", "local"):
        privacy = ClientPrivacy(_config(mechanism=mechanism, clip_norm=0.3, noise_multiplier=0.5), "fedavg")
        generator = torch.Generator().manual_seed(0)
        start = torch.randn(50, generator=generator)
        states = start + torch.randn(4, 50, generator=generator)
        jobs = [
            SimpleNamespace(client_id=cid, round=2, num_train=10 + cid, trained=states[i])
            for i, cid in enumerate([1, 4, 5, 9])
        ]
        summed, made = privacy.stack([WeightedState()] * 4, jobs, states, start.expand(4, -1), _ctx(2, 4))
        parts = made()
        for job, part in zip(jobs, parts):
            alone = privacy.one([WeightedState()], job, start, _ctx(2, 4))
            assert torch.equal(alone.total, part.total) and alone.weight == part.weight == 1.0
        assert summed.count == 4 and summed.weight == 4.0
        torch.testing.assert_close(summed.total, sum(part.total for part in parts))


def test_an_upload_that_is_not_the_declared_model_is_refused() -> None:
    privacy = ClientPrivacy(_config(mechanism="central"), "mine")
    job = SimpleNamespace(client_id=0, round=0, num_train=5, trained=torch.zeros(6))
    for made in ([WeightedSum.of(np.zeros(6, np.float32), 5.0)], [WeightedState(), WeightedState((slice(0, 3),))]):
        try:
            privacy.one(made, job, torch.zeros(6), _ctx(0, 1))
        except Exception as refused:
            assert "algorithm 'mine' declares its upload a model" in str(refused)
        else:
            raise AssertionError(f"{made} was noised as if it were the declared model")


def test_a_shared_part_is_clipped_and_summed_alone() -> None:
    # Arrange: a model of 6 numbers whose first 2 and last 2 are uploaded (a shared body), the middle kept
    privacy = ClientPrivacy(_config(mechanism="central", clip_norm=1.0, noise_multiplier=0.0), "mine")
    shared = WeightedState((slice(0, 2), slice(4, 6)))
    start = torch.zeros(6)
    jobs = [SimpleNamespace(client_id=i, round=0, num_train=5, trained=torch.full((6,), 3.0 * i)) for i in range(3)]
    states = torch.stack([job.trained for job in jobs])
    # Act
    summed, _ = privacy.stack([shared] * 3, jobs, states, start.expand(3, -1), _ctx(0, 3))
    alone = [privacy.one([shared], job, start, _ctx(0, 3)) for job in jobs]
    # Assert: 4 columns, each client's within the clip (norm 2 in 4 equal columns: 0.5 each), the stack's the sum
    assert summed.total.shape == (4,) and summed.weight == 3.0
    np.testing.assert_allclose(summed.total.numpy(), np.full(4, 1.0), rtol=1e-6)
    np.testing.assert_allclose(sum(a.total for a in alone).numpy(), summed.total.numpy(), rtol=1e-6)


def test_a_planned_client_that_sent_nothing_counts_as_a_zero_update() -> None:
    server = ServerPrivacy(_config(mechanism="central", noise_multiplier=0.0), None)
    reference = np.full(3, 2.0, np.float32)
    received = WeightedSum(np.array([3.0, 3.0, 3.0], np.float32), 1.0, 1)  # one of four planned sent θ = 3
    folded, _ = server.privatized(_ctx(0, 4), received, _Reference(reference))
    assert folded.weight == 4.0 and np.allclose(folded.average(), 2.25)  # θ_g + (1/4)·1


def test_the_servers_noise_has_the_formulas_spread() -> None:
    # Many rounds of a fixed zero update: the noised mean's deviation from θ_g is N(0, (z·C/m)²) per coordinate.
    clip, z, planned, size, rounds = 0.5, 1.2, 8, 400, 60
    server = ServerPrivacy(_config(mechanism="central", clip_norm=clip, noise_multiplier=z), None)
    reference = np.zeros(size, np.float32)
    zero = WeightedSum(np.zeros(size, np.float32), float(planned), planned)
    means = np.stack(
        [server.privatized(_ctx(t, planned), zero, _Reference(reference))[0].average() for t in range(rounds)]
    )
    samples = means.size
    expected = z * clip / planned
    assert abs(means.std() - expected) < 4 * expected / np.sqrt(2 * samples)  # the std's sampling error
    assert abs(means.mean()) < 4 * expected / np.sqrt(samples)
    again = server.privatized(_ctx(5, planned), zero, _Reference(reference))[0].average()
    assert np.array_equal(again, means[5])  # the same round draws the same bits


def test_local_dp_adds_no_server_noise() -> None:
    server = ServerPrivacy(_config(mechanism="local", noise_multiplier=3.0), None)
    received = WeightedSum(np.ones(5, np.float32), 2.0, 2)
    assert np.array_equal(
        server.privatized(_ctx(0, 2), received, _Reference(np.zeros(5, np.float32)))[0].total, received.total
    )


def test_adaptive_clippings_bits_are_counted_alike_stacked_and_one_by_one() -> None:
    privacy = ClientPrivacy(_config(mechanism="central", clip_norm=1.0, adaptive_quantile=0.5), "fedavg")
    ctx = RoundFacts(round=0, seed=0, lr=0.1, sampled=np.arange(4), clip_norm=2.0)
    start = torch.zeros(8)
    states = torch.stack([torch.full((8,), value) for value in (0.1, 0.5, 1.0, 3.0)])  # norms 0.28, 1.4, 2.8, 8.5
    jobs = [SimpleNamespace(client_id=i, round=0, num_train=5, trained=states[i]) for i in range(4)]
    summed, made = privacy.stack([WeightedState()] * 4, jobs, states, start.expand(4, -1), ctx)
    parts = made()
    assert isinstance(summed, ClippedSum) and float(summed.unclipped) == 2.0  # within C_t = 2, not the config's 1
    ones = [privacy.one([WeightedState()], job, start, ctx) for job in jobs]
    assert [float(p.unclipped) for p in parts] == [float(p.unclipped) for p in ones] == [1.0, 1.0, 0.0, 0.0]
    assert float((parts[0] + parts[1] + parts[2]).unclipped) == 2.0
    server = ServerPrivacy(_config(mechanism="central", adaptive_quantile=0.5, count_noise=0.0), None)
    on_host = ClippedSum(summed.total.numpy(), summed.weight, summed.count, float(summed.unclipped))
    _, metrics = server.privatized(ctx, on_host, _Reference(np.zeros(8, np.float32)))
    assert metrics == {"unclipped_fraction": 0.5}
