"""Held-out server data: drawn once from data.seed, left out of every client, recorded in the run directory."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig
from rayfed.client_runner import ClientRunner
from rayfed.config import DataConfig
from rayfed.data import load_dataset, load_partition
from rayfed.data.held_out import (
    HELD_OUT_FILE,
    HeldOutRequest,
    HeldOutSet,
    choose_held_out,
    load_held_out,
    partition_without,
)
from rayfed.engine import Simulation
from rayfed.errors import ConfigError
from tests.conftest import tiny_overrides


def test_balanced_draw_has_equal_class_counts_and_depends_only_on_the_seed() -> None:
    # Prepare: an unbalanced pool of 3 classes.
    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)
    request = HeldOutRequest(10, balanced=True)
    # Execute
    first = choose_held_out(labels, 3, request, seed=7)
    again = choose_held_out(labels, 3, request, seed=7)
    other = choose_held_out(labels, 3, request, seed=8)
    # Assert: 10 = 3 + 3 + 3 + 1 extra; sorted, unique, reproducible, seed-dependent.
    counts = np.bincount(labels[first], minlength=3)
    assert counts.sum() == 10 and sorted(counts.tolist()) == [3, 3, 4]
    assert np.array_equal(first, np.unique(first))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_uniform_draw_and_impossible_requests() -> None:
    labels = np.array([0] * 95 + [1] * 5)
    # A uniform draw ignores classes.
    assert len(choose_held_out(labels, 2, HeldOutRequest(20, balanced=False), seed=0)) == 20
    # A balanced set needs enough samples of every class; the error names the field.
    with pytest.raises(ConfigError, match="algorithm.params.public_size=20"):
        choose_held_out(labels, 2, HeldOutRequest(20, field="algorithm.params.public_size"), seed=0)
    with pytest.raises(ConfigError, match="leave nothing to partition"):
        choose_held_out(labels, 2, HeldOutRequest(100, balanced=False), seed=0)


def test_partition_without_never_gives_a_client_a_held_out_sample() -> None:
    # Prepare
    labels = np.repeat(np.arange(5), 60)
    held = choose_held_out(labels, 5, HeldOutRequest(25), seed=1)
    data = DataConfig(partition="dirichlet", num_clients=6, seed=1, alpha=0.5)
    # Execute
    part = partition_without(labels, 5, data, held)
    # Assert: the clients' samples and the held-out set are disjoint and together make the pool;
    # the class counts are those of the mapped indices.
    owned = np.concatenate([np.concatenate([part.train(i), part.test(i)]) for i in range(6)])
    assert not np.intersect1d(owned, held).size
    np.testing.assert_array_equal(np.sort(np.concatenate([owned, held])), np.arange(len(labels)))
    client_two = np.concatenate([part.train(2), part.test(2)])
    np.testing.assert_array_equal(part.label_counts[2], np.bincount(labels[client_two], minlength=5))
    with pytest.raises(ConfigError, match="slices"):
        partition_without(labels, 5, DataConfig(partition="slices", num_clients=6), held)


def test_engine_records_the_held_out_set_reads_it_back_and_keeps_it_from_workers(tmp_path) -> None:
    # Prepare: FedLAW asks for a server-only proxy set.
    overrides = tiny_overrides(tmp_path / "run", **{
        "algorithm.name": "fedlaw", "algorithm.params": {"proxy_size": 60, "server_epochs": 1},
        "data.partition": "dirichlet", "train.rounds": 1,
    })
    config = RunConfig().override(overrides)
    # Execute
    first = Simulation(config)
    first.run()
    resumed = Simulation(RunConfig().override({**overrides, "train.rounds": 2}), resume=True)
    # Assert: the file lists the set, no client holds any of it, and a resumed run reads the same set.
    saved = load_held_out(tmp_path / "run" / HELD_OUT_FILE, len(first.dataset))
    np.testing.assert_array_equal(saved, first.spec.held_out.indices)
    np.testing.assert_array_equal(resumed.spec.held_out.indices, saved)
    assert len(saved) == 60 and np.bincount(first.dataset.labels[saved]).tolist() == [6] * 10
    partition = load_partition(tmp_path / "run" / "partition.parquet", first.dataset.labels, 10)
    owned = pq.read_table(tmp_path / "run" / "partition.parquet").column("index").to_numpy()
    assert not np.intersect1d(owned, saved).size
    assert int(partition.num_train().sum() + partition.num_test().sum()) == 3000 - 60
    # The workers' spec drops a server-only set and keeps a shared one.
    runner = ClientRunner(config, first.spec, first.dataset, first.partition)
    assert runner.spec.held_out is None and first.spec.held_out is not None
    shared = HeldOutSet.of(load_dataset("synthetic", None, options={"num_samples": 3000}), saved, shared=True)
    assert first.spec.__class__(**{**first.spec.__dict__, "held_out": shared}).for_clients().held_out is shared
