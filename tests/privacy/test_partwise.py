"""Uploads protected part by part (rayfed.algorithms.private_uploads.PartwiseUpload, cwFedAvg): every part of every
client clipped to its own bound, stacked and one by one alike; each part's sum noised with its own spread; and
cwFedAvg's step from the parts' sums equal to Eq. 6 where nothing is clipped or noised."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from rayfed.algorithms.cwfedavg_equations import classwise_average
from rayfed.algorithms.cwfedavg_private import CWFEDAVG_PARTS, client_parts, private_step
from rayfed.algorithms.fedproto import ClassSums
from rayfed.algorithms.fedproto_private import private_prototypes, prototype_parts
from rayfed.algorithms.private_uploads import PartwiseClient, PartwiseUpload, PrivateParts, UploadPart
from rayfed.config import RunConfig
from rayfed.execution.privacy import ClientPrivacy, ServerPrivacy
from rayfed.execution.round_facts import RoundFacts

PARTS = (UploadPart("update"), UploadPart("row", bound=1.0))


class _Client(PartwiseClient):
    """Each client's parts: its trained vector (an update) and a row 3·x (norm up to 3, beyond its bound 1)."""

    def private_parts(self, message: Any, job: Any, upload: Any) -> tuple[Any, ...]:
        return job.trained, 3 * job.row


class _Server(PartwiseUpload):
    upload_parts = PARTS

    def part_sizes(self) -> tuple[int, ...]:
        return 200, 100


def _config(**privacy: object) -> RunConfig:
    return RunConfig().override({f"privacy.{key}": value for key, value in privacy.items()})


def _ctx(round_index: int, sampled: int) -> RoundFacts:
    return RoundFacts(round=round_index, seed=0, lr=0.1, sampled=np.arange(sampled))


def _jobs(count: int) -> list[SimpleNamespace]:
    generator = torch.Generator().manual_seed(3)
    return [
        SimpleNamespace(
            client_id=cid,
            num_train=5 + cid,
            trained=torch.randn(40, generator=generator) * (cid + 1),
            row=torch.softmax(torch.randn(4, generator=generator), 0),
        )
        for cid in range(count)
    ]


def test_each_part_of_each_client_is_clipped_to_its_own_bound_stacked_and_alone() -> None:
    for mechanism in ("central", "local"):
        config = _config(mechanism=mechanism, clip_norm=0.7, noise_multiplier=0.0)
        privacy = ClientPrivacy(config, "m", _Client(), PARTS)
        jobs = _jobs(5)
        summed, made = privacy.stack([None] * 5, jobs, None, None, _ctx(1, 5))
        each = made()
        for job, part in zip(jobs, each):
            alone = privacy.one([None], job, None, _ctx(1, 5))
            assert isinstance(alone, PrivateParts) and alone.sizes == (40, 4)
            torch.testing.assert_close(alone.total, part.total)
            update, row = alone.total[:40], alone.total[40:]
            assert float(torch.linalg.vector_norm(update)) <= 0.7 * (1 + 1e-6)
            assert float(torch.linalg.vector_norm(row)) <= 1 + 1e-6  # 3·p̃ held to the row's bound
        assert summed.weight == 5.0 and summed.count == 5
        torch.testing.assert_close(summed.total, sum(part.total for part in each))


def test_local_noise_is_each_parts_own_and_seeded_by_the_client() -> None:
    privacy = ClientPrivacy(_config(mechanism="local", clip_norm=0.5, noise_multiplier=2.0), "m", _Client(), PARTS)
    zero = SimpleNamespace(client_id=7, num_train=1, trained=torch.zeros(4000), row=torch.zeros(1000))
    noised = privacy.one([None], zero, None, _ctx(0, 1)).total.numpy()
    again = privacy.one([None], zero, None, _ctx(0, 1)).total.numpy()
    z = 2.0 * math.sqrt(2)  # two parts: z·√2 each
    assert np.array_equal(noised, again)
    assert abs(noised[:4000].std() / (z * 0.5) - 1) < 0.05 and abs(noised[4000:].std() / (z * 1.0) - 1) < 0.1


def test_the_server_noises_each_parts_sum_with_its_own_spread() -> None:
    # Many rounds of zero sums: each part's noise is N(0, (z·√P·B_k)²) per coordinate, the sum over W_P.
    clip, z, rounds = 0.4, 1.5, 50
    server = ServerPrivacy(_config(mechanism="central", clip_norm=clip, noise_multiplier=z), None)
    zero = PrivateParts(np.zeros(300, np.float32), 6.0, 6, (200, 100))
    noised = [server.privatized(_ctx(t, 8), zero, _Server())[0] for t in range(rounds)]
    assert all(isinstance(n, PrivateParts) and n.weight == 8.0 and n.unit == 1.0 for n in noised)
    empty = server.empty(_Server())  # a round without uploads: the parts' zero sums, noised alike
    assert isinstance(empty, PrivateParts) and empty.sizes == (200, 100) and not empty.total.any()
    update = np.stack([n.split()[0] for n in noised])
    row = np.stack([n.split()[1] for n in noised])
    for values, bound in ((update, clip), (row, 1.0)):
        expected = z * math.sqrt(2) * bound
        error = 3 * math.sqrt(2 / values.size)  # three standard errors of a sample deviation
        assert abs(values.std() / expected - 1) < error


def test_with_adaptive_clipping_each_part_is_clipped_to_its_rounds_bound_and_counted() -> None:
    # The round's bounds B_k,t (not the config's): every part within its own, and each part's bit 1[‖x_ik‖ ≤ B_k,t]
    # counted, stacked and one by one alike.
    config = _config(mechanism="central", clip_norm=0.7, noise_multiplier=0.0, adaptive_quantile=0.5)
    privacy = ClientPrivacy(config, "m", _Client(), PARTS)
    jobs = _jobs(5)
    bounds = (15.0, 1.9)  # the updates' norms are 4.8 to 32, the rows' 1.5 to 2.3
    ctx = RoundFacts(round=1, seed=0, lr=0.1, sampled=np.arange(5), part_bounds=bounds)
    summed, made = privacy.stack([None] * 5, jobs, None, None, ctx)
    for job, part in zip(jobs, made()):
        alone = privacy.one([None], job, None, ctx)
        torch.testing.assert_close(alone.total, part.total)
        assert torch.equal(alone.unclipped, part.unclipped)
        for piece, bound in zip((alone.total[:40], alone.total[40:]), bounds):
            assert float(torch.linalg.vector_norm(piece)) <= bound * (1 + 1e-6)
    norms = [[float(torch.linalg.vector_norm(x)) for x in (job.trained, 3 * job.row)] for job in jobs]
    expected = [sum(row[k] <= bound for row in norms) for k, bound in enumerate(bounds)]
    assert summed.unclipped.tolist() == expected == [2, 3]


def test_with_adaptive_clipping_the_server_noises_each_part_with_its_share_and_counts_each_part() -> None:
    # z_k = z_Δ·√P with z_Δ = (z⁻² − P(2σ_b)⁻²)^(−1/2), times the round's B_k,t; each part's noised fraction
    # (Σ (b_ik − ½) + N(0, σ_b²)) / m + ½ reported as unclipped_fraction_k.
    clip, z, count_noise, rounds = 0.4, 1.5, 2.0, 50
    config = _config(
        mechanism="central", clip_norm=clip, noise_multiplier=z, adaptive_quantile=0.5, count_noise=count_noise
    )
    server = ServerPrivacy(config, None)
    bounds = (0.3, 0.8)
    zero = PrivateParts(np.zeros(300, np.float32), 6.0, 6, (200, 100), unclipped=np.array([2.0, 6.0], np.float32))
    contexts = [RoundFacts(round=t, seed=0, lr=0.1, sampled=np.arange(8), part_bounds=bounds) for t in range(rounds)]
    results = [server.privatized(ctx, zero, _Server()) for ctx in contexts]
    z_part = (z**-2 - 2 * (2 * count_noise) ** -2) ** -0.5 * math.sqrt(2)
    for k, bound in enumerate(bounds):
        values = np.stack([noised.split()[k] for noised, _ in results])
        assert abs(values.std() / (z_part * bound) - 1) < 3 * math.sqrt(2 / values.size)
    fractions = np.array([[metrics[f"unclipped_fraction_{k}"] for k in (1, 2)] for _, metrics in results])
    centred = np.array([(2 - 3) / 8 + 0.5, (6 - 3) / 8 + 0.5])
    spread = (fractions - centred) * 8 / count_noise  # N(0, 1) draws, one per part and round
    assert abs(spread.mean()) < 4 / math.sqrt(spread.size) and abs(spread.std() - 1) < 4 / math.sqrt(spread.size)
    assert isinstance(server.empty(_Server()).unclipped, np.ndarray)  # a round without uploads counts zeros


def test_cwfedavgs_step_from_unclipped_parts_is_eq6() -> None:
    # Eq. 6 with n_i = 1: G_j ← Σ_i p̃_ij θ_i / Σ_i p̃_ij, from the parts' sums written around G_j.
    rng = np.random.default_rng(0)
    k, width, shared_width, clients = 3, 5, 4, 12
    heads = rng.normal(size=(k, width)).astype(np.float32)
    shared = rng.normal(size=shared_width).astype(np.float32)
    rows = rng.dirichlet(np.ones(k), size=clients).astype(np.float32)
    models = rng.normal(size=(clients, width)).astype(np.float32)
    others = rng.normal(size=(clients, shared_width)).astype(np.float32)
    parts = [
        client_parts(*map(torch.from_numpy, (rows[i], models[i], others[i], heads, shared))) for i in range(clients)
    ]
    update = sum(p[0] for p in parts).numpy()
    masses = sum(p[1] for p in parts).numpy()
    assert masses.min() >= 1  # every class holds more than one client's weight: no denominator held
    sums = PrivateParts(np.concatenate([update, masses]), float(clients), clients, (update.size, k))
    new_heads, new_shared, metrics = private_step(heads, shared, sums)
    np.testing.assert_allclose(new_heads, classwise_average(rows.T @ models, masses, heads), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(new_shared, others.mean(axis=0), rtol=1e-4, atol=1e-5)
    assert metrics["classes_held_to_one_client"] == 0
    assert [p.bound for p in CWFEDAVG_PARTS] == [None, 1.0]


def test_fedprotos_prototypes_from_unclipped_parts_are_its_aggregation() -> None:
    # Without clipping or noise, C̄_j ← C̄_j + Σ_i r_ij (C_ij − C̄_j) / Σ_i r_ij is the aggregation's mean of the
    # holders' prototypes (client_mean: each once; count: by |D_ij|/|D_i|); a class nobody holds keeps its own.
    rng = np.random.default_rng(1)
    k, d, clients = 4, 6, 5
    previous = rng.normal(size=(k, d)).astype(np.float32)
    counts = rng.integers(0, 9, size=(clients, k)).astype(np.float64)
    counts[:, 3] = 0  # nobody holds class 3
    means = np.where(counts[..., None] > 0, rng.normal(size=(clients, k, d)), 0).astype(np.float32)
    upload = ClassSums(
        torch.from_numpy(means.sum(0)), torch.from_numpy(counts.sum(0)), torch.from_numpy(means.sum(0)), None
    )
    assert upload.counts.shape == (k,)
    for aggregation in ("client_mean", "count"):
        parts = [
            prototype_parts(
                torch.from_numpy(means[i]), torch.from_numpy(counts[i]), torch.from_numpy(previous), aggregation
            )
            for i in range(clients)
        ]
        update, masses = (sum(p[n] for p in parts).numpy() for n in (0, 1))
        unit = 1e-3  # no class held to a floor here
        sums = PrivateParts(np.concatenate([update, masses]), float(clients), clients, (update.size, k), unit)
        new, present, seen = private_prototypes(previous, np.zeros(k, bool), sums, aggregation)
        held = (counts > 0).astype(np.float64)  # count, weight 1: |D_ij|/|D_i| (privacy.weighting=samples: |D_ij|)
        weights = counts / counts.sum(1, keepdims=True) if aggregation == "count" else held
        expected = (weights[..., None] * means).sum(0)[:3] / weights.sum(0)[:3, None]
        np.testing.assert_allclose(new[:3], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(new[3], previous[3])
        assert seen.tolist() == [True, True, True, False] and present.tolist() == seen.tolist()
