"""Pool slices (``data.partition="slices"``): client data sets as slices of one shuffled pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig, run
from rayfed.config import DataConfig
from rayfed.data import Partition, PoolSlices, load_partition, make_partition
from rayfed.data.pool_slices import slice_stride
from rayfed.util.errors import ConfigError, DatasetError
from tests.conftest import python_calls, tiny_overrides

K = 10


def pool_labels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, K, size=n)


def slices(labels: np.ndarray, num_clients: int, size: int, *, seed: int = 1, fraction: float = 2 / 3) -> PoolSlices:
    data = DataConfig(
        partition="slices", num_clients=num_clients, samples_per_client=size, train_fraction=fraction, seed=seed
    )
    part = make_partition(labels, K, data)
    assert isinstance(part, PoolSlices)
    return part


def all_indices(part: PoolSlices) -> list[np.ndarray]:
    return [np.concatenate([part.train(i), part.test(i)]) for i in range(part.num_clients)]


def test_the_same_seed_gives_the_same_slices_and_another_seed_others():
    # Prepare
    labels = pool_labels(1000)

    # Execute
    a, b, c = slices(labels, 40, 15), slices(labels, 40, 15), slices(labels, 40, 15, seed=2)

    # Assert
    assert a == b and all(np.array_equal(x, y) for x, y in zip(all_indices(a), all_indices(b), strict=True))
    assert not np.array_equal(a.train(0), c.train(0))


def test_every_client_gets_a_slice_of_the_right_size_split_by_the_train_fraction():
    # Execute
    part = slices(pool_labels(1000), 70, 15)  # 70 x 15 > 1000: some slices wrap around the end

    # Assert
    assert part.train_size == 10
    assert (part.num_train() == 10).all() and (part.num_test() == 5).all()
    for i in range(part.num_clients):
        assert len(part.train(i)) == 10 and len(part.test(i)) == 5


def test_train_and_test_are_disjoint_within_every_client_even_where_slices_wrap():
    # Execute
    part = slices(pool_labels(100), 50, 40)  # 50 x 40 = 20 laps of the pool

    # Assert
    for i in range(part.num_clients):
        assert len(np.intersect1d(part.train(i), part.test(i))) == 0
        assert len(np.unique(np.concatenate([part.train(i), part.test(i)]))) == 40


def test_clients_do_not_overlap_while_the_population_fits_in_the_pool():
    # Execute: 66 x 15 = 990 <= 1000
    part = slices(pool_labels(1000), 66, 15)

    # Assert
    flat = np.concatenate(all_indices(part))
    assert part.stride == 15 and len(np.unique(flat)) == len(flat) == 990


def test_clients_overlap_only_beyond_the_pool_and_the_first_n_start_apart():
    # Prepare: 100 x 15 > 1000 samples
    part = slices(pool_labels(1000), 100, 15)
    flat = np.concatenate(all_indices(part))

    # Assert
    assert len(np.unique(flat)) < len(flat)
    assert part.stride == slice_stride(1000, 100, 15) == 17  # the smallest stride >= 15 coprime with 1000
    starts = {int(part.indices(i)[0]) for i in range(part.num_clients)}
    assert len(starts) == 100


def test_label_counts_are_the_class_histograms_of_each_slice():
    # Prepare
    labels = pool_labels(300)

    # Execute
    part = slices(labels, 40, 12)

    # Assert
    assert part.label_counts.dtype == np.int32
    for i in range(part.num_clients):
        assert part.label_counts[i].tolist() == np.bincount(labels[part.indices(i)], minlength=K).tolist()
        assert part.train_label_counts[i].tolist() == np.bincount(labels[part.train(i)], minlength=K).tolist()


def test_save_writes_the_parameters_only_and_load_rebuilds_the_same_partition(tmp_path: Path):
    # Prepare
    labels = pool_labels(500)
    part = slices(labels, 80, 15)
    path = tmp_path / "partition.parquet"

    # Execute
    part.save(path)
    loaded = load_partition(path, labels, K)

    # Assert
    assert pq.read_table(path).num_rows == 1
    assert isinstance(loaded, PoolSlices) and loaded == part
    assert all(np.array_equal(x, y) for x, y in zip(all_indices(loaded), all_indices(part), strict=True))
    with pytest.raises(DatasetError, match="pool of 500 samples, but the dataset has 400"):
        load_partition(path, labels[:400], K)
    with pytest.raises(DatasetError, match="holds a PoolSlices, not CSR index sets"):
        Partition.load(path, labels, K)


def test_more_clients_than_samples_need_slices_and_a_slice_size():
    # Prepare
    labels = pool_labels(100)

    # Execute / Assert
    assert slices(labels, 1000, 5).num_clients == 1000
    with pytest.raises(ConfigError, match="data.partition=slices"):
        make_partition(labels, K, DataConfig(partition="iid", num_clients=1000))
    with pytest.raises(ConfigError, match=r"data.samples_per_client must be in \[1, 100\].*here 0"):
        make_partition(labels, K, DataConfig(partition="slices", num_clients=1000))
    with pytest.raises(ConfigError, match="data.samples_per_client=101"):
        make_partition(labels, K, DataConfig(partition="slices", num_clients=5, samples_per_client=101))


def test_a_million_clients_partition_without_a_python_step_per_client_or_per_sample_arrays():
    # Prepare
    labels = pool_labels(150_000)

    # Execute
    calls, part = python_calls(lambda: slices(labels, 1_000_000, 15))

    # Assert: a few hundred Python calls whatever the number of clients (measured 509 for 1,000,000 and 508
    # for 10,000), and arrays of the pool's and the clients' sizes only. How long: benchmarks/quick_answers.py.
    assert calls < 5_000, f"{calls} Python calls for 1,000,000 clients"
    assert part.order.nbytes == 150_000 * 8 and part.label_counts.nbytes == 1_000_000 * K * 4
    assert (part.label_counts.sum(axis=1) == 15).all()


def test_a_run_on_slices_trains_evaluates_and_resumes(tmp_path: Path):
    # Prepare: 50 clients x 15 samples on a pool of 500, half the clients per round
    extra = {
        "data.partition": "slices",
        "data.num_clients": 50,
        "data.samples_per_client": 15,
        "data.train_fraction": 2 / 3,
        "data.options": {"num_samples": 500},
        "algorithm.name": "cwfedavg",
        "algorithm.params.classwise_blocks": 1,
        "engine.join_ratio": 0.5,
    }
    partial = RunConfig().override(tiny_overrides(tmp_path / "part", **extra, **{"engine.checkpoint_every": 1}))

    # Execute
    full = run(RunConfig().override(tiny_overrides(tmp_path / "full", **extra)))
    run(partial.override({"train.rounds": 1}))
    resumed = run(partial, resume=True)

    # Assert
    assert [r["num_sampled"] for r in full.history] == [25, 25]
    assert all(r["num_evaluated"] == 50 for r in full.history)
    assert 0.0 < full.best_accuracy <= 1.0
    assert resumed.accuracies == full.accuracies
