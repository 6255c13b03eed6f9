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


def test_which_clients_share_a_call_and_a_stack_never_depends_on_the_pool(tmp_path) -> None:
    """A round's calls depend on its clients alone, and a call's stacks on its clients and engine.stack_size: so
    FedClassAvg, whose stacked and sequential steps part by rounding (docs/algorithms.md), gives the same numbers
    on any pool."""
    from rayfed import RunConfig
    from rayfed.engine.simulation import Simulation
    from tests.conftest import runner_and_server, tiny_overrides

    calls, stacks = [], []
    for workers in (1, 2, 3):
        config = RunConfig().override(
            tiny_overrides(
                tmp_path / f"w{workers}",
                **{"engine.num_workers": workers, "engine.vectorize": "on", "engine.stack_size": 3},
            )
        )
        round_calls = Simulation(config)._calls(None, _context(), np.arange(config.data.num_clients)).chunks
        runner, _ = runner_and_server(config, tmp_path / f"r{workers}")
        for call in round_calls:
            jobs = [runner.job(cid, _context(), None) for cid in call]
            stacks.append((workers, [[job.client_id for job in stack] for stack in runner._stacks(jobs)]))
        calls.append(round_calls)
    assert calls[0] == calls[1] == calls[2] and len(calls[0]) > 1
    by_pool = {w: [s for pool, s in stacks if pool == w] for w in (1, 2, 3)}
    assert by_pool[1] == by_pool[2] == by_pool[3]


def _context():
    from rayfed.algorithms import RoundContext

    return RoundContext(round=0, seed=0, lr=0.01, sampled=np.arange(10))
