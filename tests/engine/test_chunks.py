"""Balanced, deterministic client batches and the seeded sampling."""

from __future__ import annotations

import numpy as np

from rayfed.execution.executor import make_chunks
from rayfed.util.seeding import client_seed, sample_clients


def test_chunks_cover_each_client_once_and_balance_sizes() -> None:
    sizes = np.array([100, 1, 1, 1, 50, 50, 2, 2, 90, 3])
    chunks = make_chunks(np.arange(10), sizes, 3)
    flat = sorted(c for chunk in chunks for c in chunk)
    assert flat == list(range(10))
    loads = [sizes[c].sum() for c in chunks]
    assert max(loads) - min(loads) <= 50


def test_chunks_are_deterministic_and_ordered() -> None:
    sizes = np.random.default_rng(0).integers(1, 100, size=50)
    a, b = make_chunks(np.arange(50), sizes, 4), make_chunks(np.arange(50), sizes, 4)
    assert a == b and [c[0] for c in a] == sorted(c[0] for c in a)


def test_sampling_respects_join_ratio_and_seed() -> None:
    picked = sample_clients(seed=1, round_index=3, num_clients=100, join_ratio=0.1)
    assert len(picked) == 10 and len(set(picked)) == 10 and list(picked) == sorted(picked)
    assert np.array_equal(picked, sample_clients(1, 3, 100, 0.1))
    assert not np.array_equal(picked, sample_clients(1, 4, 100, 0.1))
    assert np.array_equal(sample_clients(1, 0, 5, 1.0), np.arange(5))


def test_client_seed_depends_on_seed_round_and_client() -> None:
    seeds = {client_seed(s, r, c) for s in (0, 1) for r in (0, 1) for c in (0, 1)}
    assert len(seeds) == 8
