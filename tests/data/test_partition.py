"""Partitioners, the 75/25 split and the Parquet round trip (rayfed.data.partition, partitioners, split)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rayfed.config import DataConfig, RunConfig
from rayfed.data import (
    PARTITIONERS,
    Partition,
    make_partition,
    partition_dirichlet,
    partition_iid,
    partition_pathological,
    split_train_test,
)
from rayfed.data.csr import to_lists
from rayfed.util.errors import ConfigError, DatasetError
from tests.conftest import python_calls

K = 10


def balanced_labels(per_class: int = 100, num_classes: int = K) -> np.ndarray:
    """Labels in class blocks (0...0 1...1 ...), like a sorted pool."""
    return np.repeat(np.arange(num_classes, dtype=np.int64), per_class)


def shuffled_labels(n: int = 3000, num_classes: int = K, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, n).astype(np.int64)


def make(labels: np.ndarray, num_classes: int, **fields: object) -> Partition:
    """``make_partition`` with a DataConfig holding ``fields`` (the others at their defaults)."""
    return make_partition(labels, num_classes, DataConfig(**fields))


def all_indices(p: Partition) -> np.ndarray:
    return np.sort(np.concatenate([p.train_indices, p.test_indices]))


# --------------------------------------------------------------------------- pathological


def test_pathological_gives_every_client_exactly_k_classes():
    # Prepare
    labels = shuffled_labels(4000)

    # Execute
    part = make(labels, K, partition="pathological", num_clients=20, classes_per_client=2, seed=3)

    # Assert
    classes_per_client = (part.label_counts > 0).sum(axis=1)
    assert classes_per_client.tolist() == [2] * 20


def test_pathological_assigns_class_pairs_to_blocks_of_four_clients_for_20_clients_10_classes():
    # Prepare
    labels = shuffled_labels(4000)
    by_class = [np.flatnonzero(labels == j) for j in range(K)]

    # Execute
    clients = to_lists(*partition_pathological(labels, 20, K, 2, np.random.RandomState(1)))

    # Assert: clients 4g..4g+3 hold classes {2g, 2g+1}
    for i, own in enumerate(clients):
        g = i // 4
        assert set(labels[own].tolist()) == {2 * g, 2 * g + 1}
    # Assert: each class is cut into contiguous blocks, in dataset order, client by client
    for j in range(K):
        owners = range(4 * (j // 2), 4 * (j // 2) + 4)
        blocks = np.concatenate([clients[i][labels[clients[i]] == j] for i in owners])
        np.testing.assert_array_equal(blocks, by_class[j])


def test_pathological_last_client_of_a_class_takes_the_remainder_and_blocks_respect_the_lower_bound():
    # Prepare: 100 samples per class, 4 clients per class -> avg 25, sizes from randint(2, 25)
    labels = balanced_labels(100)

    # Execute
    clients = to_lists(*partition_pathological(labels, 20, K, 2, np.random.RandomState(7)))

    # Assert
    class0 = [int((labels[clients[i]] == 0).sum()) for i in range(4)]
    assert sum(class0) == 100
    assert all(2 <= size < 25 for size in class0[:3])
    assert class0[3] == 100 - sum(class0[:3])


def test_balanced_pathological_gives_equal_blocks():
    # Prepare
    labels = balanced_labels(100)

    # Execute
    part = make(labels, K, partition="pathological", num_clients=20, seed=0, balance=True)

    # Assert: int(100 / 4) = 25 samples of each of two classes
    assert (part.num_train() + part.num_test()).tolist() == [50] * 20


def test_pathological_seed_1_keeps_the_pfllib_generator_stream():
    # Prepare: sizes produced by PFLlib's separate_data('pat') + split_data with
    # np.random.seed(1) on this pool (checked once against a transcription of PFLlib).
    labels = balanced_labels(100)

    # Execute
    part = make(labels, K, partition="pathological", num_clients=20, seed=1)

    # Assert
    expected = [17, 24, 27, 132, 25, 20, 16, 139, 29, 37, 15, 119, 32, 38, 33, 97, 8, 35, 34, 123]
    assert (part.num_train() + part.num_test()).tolist() == expected


def test_pathological_that_runs_out_of_clients_raises_config_error():
    # Prepare: 3 clients x 4 classes, but ceil(3/10*4) = 2 clients per class exhaust the quotas
    labels = balanced_labels(20)

    # Execute / Assert
    with pytest.raises(ConfigError, match=r"data\.classes_per_client=4"):
        make(labels, K, partition="pathological", num_clients=3, classes_per_client=4, seed=0)


# --------------------------------------------------------------------------- dirichlet


def test_dirichlet_is_reproducible_from_its_seed_and_changes_with_another_seed():
    # Prepare
    labels = shuffled_labels(3000)
    kwargs = dict(partition="dirichlet", num_clients=20, alpha=0.1)

    # Execute
    first = make(labels, K, seed=5, **kwargs)
    again = make(labels, K, seed=5, **kwargs)
    other = make(labels, K, seed=6, **kwargs)

    # Assert
    assert first == again
    assert first != other


def test_dirichlet_respects_min_samples():
    # Prepare
    labels = shuffled_labels(3000)

    # Execute
    part = make(labels, K, partition="dirichlet", num_clients=20, alpha=0.3, min_samples=40, seed=0)

    # Assert
    assert (part.num_train() + part.num_test()).min() >= 40


def test_dirichlet_gives_no_new_samples_to_clients_already_at_the_cap():
    # Prepare: with alpha large the shares are near-uniform, so the N/M cap bites
    labels = shuffled_labels(2000)

    # Execute
    clients = to_lists(*partition_dirichlet(labels, 10, K, 1000.0, np.random.RandomState(0)))

    # Assert: sizes stay close to N/M = 200 (a client past the cap stops growing)
    sizes = np.array([len(c) for c in clients])
    assert sizes.sum() == 2000
    assert sizes.max() < 200 + 2000 / K


def test_dirichlet_that_cannot_reach_min_samples_raises_dataset_error_with_the_fix():
    # Prepare: alpha tiny, 20 clients, each needing a third of the pool: impossible
    labels = shuffled_labels(600)

    # Execute / Assert
    with pytest.raises(DatasetError) as info:
        partition_dirichlet(labels, 20, K, 0.01, np.random.RandomState(0), least_samples=29, max_tries=3)
    message = str(info.value)
    assert "3 tries" in message
    assert "data.min_samples=29" in message
    assert "data.alpha" in message


@pytest.mark.parametrize(("alpha", "paper"), [(0.01, 12), (0.05, 30), (0.1, 46), (0.25, 68), (0.5, 85), (1.0, 94)])
def test_dirichlet_matches_the_class_counts_of_p_arxiv_table_3_on_a_cifar100_sized_pool(alpha, paper):
    # Prepare: 60,000 samples, 100 classes, 20 clients (P-arXiv Table 3 setting)
    labels = balanced_labels(600, num_classes=100)

    # Execute
    part = make(labels, 100, partition="dirichlet", num_clients=20, alpha=alpha, seed=1)

    # Assert: mean number of classes a client holds
    assert abs((part.label_counts > 0).sum(axis=1).mean() - paper) < 1.5


# --------------------------------------------------------------------------- every partitioner


@pytest.mark.parametrize("name", ["iid", "pathological", "dirichlet"])
def test_every_sample_is_assigned_exactly_once(name):
    # Prepare
    labels = shuffled_labels(3000)

    # Execute
    part = make(labels, K, partition=name, num_clients=20, seed=0)

    # Assert
    np.testing.assert_array_equal(all_indices(part), np.arange(len(labels)))


@pytest.mark.parametrize(
    "partitioner",
    [
        lambda y, rng: partition_iid(y, 7, rng),
        lambda y, rng: partition_pathological(y, 20, K, 3, rng),
        lambda y, rng: partition_dirichlet(y, 15, K, 0.5, rng),
    ],
    ids=["iid", "pathological", "dirichlet"],
)
def test_partitioners_cover_the_pool_without_overlap_in_valid_csr(partitioner):
    # Prepare
    labels = shuffled_labels(2000)

    # Execute
    indices, offsets = partitioner(labels, np.random.RandomState(0))

    # Assert
    np.testing.assert_array_equal(np.sort(indices), np.arange(2000))
    assert indices.dtype == offsets.dtype == np.int64
    assert offsets[0] == 0 and offsets[-1] == 2000 and (np.diff(offsets) >= 0).all()


def test_iid_client_sizes_differ_by_at_most_one():
    # Prepare
    labels = shuffled_labels(1003)

    # Execute
    clients = to_lists(*partition_iid(labels, 10, np.random.RandomState(0)))

    # Assert
    assert sorted({len(c) for c in clients}) == [100, 101]


# --------------------------------------------------------------------------- split and counts


def test_each_client_trains_on_floor_three_quarters_of_its_samples():
    # Prepare
    labels = shuffled_labels(3000)

    # Execute
    part = make(labels, K, partition="dirichlet", num_clients=20, alpha=0.5, seed=2)

    # Assert
    n = part.num_train() + part.num_test()
    np.testing.assert_array_equal(part.num_train(), np.floor(0.75 * n).astype(np.int64))
    for i in range(part.num_clients):
        assert not set(part.train(i).tolist()) & set(part.test(i).tolist())


def test_split_keeps_a_single_sample_client_for_testing():
    # Prepare
    labels = np.array([0, 1, 1, 0, 1], dtype=np.int64)

    # Execute
    part = split_train_test([np.array([0]), np.array([1, 2, 3, 4])], labels, 2, 0.75, np.random.RandomState(0))

    # Assert
    assert part.num_train().tolist() == [0, 3]
    assert part.num_test().tolist() == [1, 1]


def test_label_counts_cover_the_whole_partition_and_train_counts_only_the_training_split():
    # Prepare
    labels = shuffled_labels(2000)

    # Execute
    part = make(labels, K, partition="dirichlet", num_clients=10, alpha=0.5, seed=0)

    # Assert
    for i in range(part.num_clients):
        whole = np.bincount(labels[np.concatenate([part.train(i), part.test(i)])], minlength=K)
        np.testing.assert_array_equal(part.label_counts[i], whole)
        np.testing.assert_array_equal(part.train_label_counts[i], np.bincount(labels[part.train(i)], minlength=K))


def test_partition_arrays_are_read_only():
    # Prepare
    part = make(shuffled_labels(500), K, partition="iid", num_clients=5, seed=0)

    # Execute / Assert
    with pytest.raises(ValueError):
        part.train(0)[0] = 7


# --------------------------------------------------------------------------- parquet


def test_parquet_round_trip_equals_the_original_including_empty_clients(tmp_path: Path):
    # Prepare: 1 sample per client on average with min_samples=0 leaves some clients empty
    labels = shuffled_labels(300)
    part = make(labels, K, partition="dirichlet", num_clients=300, alpha=0.1, min_samples=0, seed=0)
    assert (part.num_train() + part.num_test() == 0).any()
    path = tmp_path / "run" / "partition.parquet"

    # Execute
    part.save(path)
    loaded = Partition.load(path, labels, K)

    # Assert
    assert loaded == part
    assert loaded.num_clients == 300
    assert [p.name for p in path.parent.iterdir()] == ["partition.parquet"]  # no temp file left


def test_partition_table_has_client_split_and_index_columns():
    # Prepare
    part = make(shuffled_labels(100), K, partition="iid", num_clients=4, seed=0)

    # Execute
    table = part.to_table()

    # Assert
    assert table.column_names == ["client_id", "split", "index"]
    assert str(table.schema.field("client_id").type) == "int32"
    assert set(table.column("split").to_pylist()) == {"train", "test"}
    assert table.num_rows == 100


def test_loading_a_truncated_parquet_file_raises_dataset_error_naming_the_path(tmp_path: Path):
    # Prepare
    labels = shuffled_labels(500)
    path = tmp_path / "partition.parquet"
    make(labels, K, partition="iid", num_clients=5, seed=0).save(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    # Execute / Assert
    with pytest.raises(DatasetError, match=r"partition\.parquet") as info:
        Partition.load(path, labels, K)
    assert str(path) in str(info.value)


def test_loading_a_missing_partition_file_raises_dataset_error(tmp_path: Path):
    # Prepare
    path = tmp_path / "nope.parquet"

    # Execute / Assert
    with pytest.raises(DatasetError, match=r"nope\.parquet"):
        Partition.load(path, shuffled_labels(10), K)


def test_loading_a_partition_for_a_smaller_dataset_raises_dataset_error(tmp_path: Path):
    # Prepare
    path = tmp_path / "partition.parquet"
    make(shuffled_labels(500), K, partition="iid", num_clients=5, seed=0).save(path)

    # Execute / Assert
    with pytest.raises(DatasetError, match="another dataset"):
        Partition.load(path, shuffled_labels(100), K)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"num_clients": 0}, ["data.num_clients=0", "an integer >= 1"]),
        ({"num_clients": 2.5}, ["data.num_clients=2.5", "an integer"]),
        ({"alpha": 0.0}, ["data.alpha=0.0", "> 0"]),
        ({"alpha": -1.0}, ["data.alpha=-1.0"]),
        ({"alpha": float("inf")}, ["data.alpha=inf", "finite"]),
        ({"classes_per_client": 0}, ["data.classes_per_client=0", ">= 1"]),
        ({"partition": "shards"}, ["data.partition='shards'", "'dirichlet', 'iid', 'pathological'"]),
        ({"partition": "dirichlett"}, ["data.partition='dirichlett'", "did you mean 'dirichlet'"]),
        ({"min_samples": -1}, ["data.min_samples=-1", ">= 0"]),
        ({"balance": "yes"}, ["data.balance='yes'", "true or false"]),
        ({"train_fraction": 0.0}, ["data.train_fraction=0.0", "(0, 1)"]),
        ({"train_fraction": 1.0}, ["data.train_fraction=1.0", "(0, 1)"]),
        ({"train_fraction": 1.5}, ["data.train_fraction=1.5"]),
        ({"seed": -1}, ["data.seed=-1", "[0, 2**32 - 1]"]),
        ({"seed": 2**32}, ["data.seed=4294967296"]),
    ],
    ids=lambda value: str(value)[:40],
)
def test_bad_data_settings_are_rejected_once_when_the_config_is_built(fields, expected):
    # Execute
    with pytest.raises(ConfigError) as info:
        RunConfig(data=DataConfig(**fields))

    # Assert
    for fragment in expected:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"num_clients": 101}, ["data.num_clients=101", "more clients than samples", "100 samples"]),
        ({"classes_per_client": 11}, ["data.classes_per_client=11", "number of classes in the dataset, 10"]),
        ({"min_samples": 11}, ["data.min_samples=11", "100 samples", "lower data.min_samples"]),
    ],
    ids=lambda value: str(value)[:40],
)
def test_settings_that_do_not_fit_the_dataset_raise_config_error_naming_field_value_and_fix(fields, expected):
    # Prepare: a valid config, but 100 samples of 10 classes
    data = DataConfig(**{"partition": "pathological", "num_clients": 10, "seed": 0, **fields})

    # Execute
    with pytest.raises(ConfigError) as info:
        make_partition(balanced_labels(10), K, data)

    # Assert
    for fragment in expected:
        assert fragment in str(info.value)


def test_partitioners_are_registered_by_name():
    # Execute / Assert
    # the built-ins (tests may register their own, e.g. tests/algorithms/two_groups.py)
    assert {"dirichlet", "iid", "pathological", "slices"} <= set(PARTITIONERS.names())
    with pytest.raises(ConfigError, match=r"unknown partition data\.partition='shards'.*known partitions"):
        PARTITIONERS.get("shards")


def test_labels_outside_the_class_range_raise_dataset_error():
    # Prepare
    labels = np.array([0, 1, 10], dtype=np.int64)

    # Execute / Assert
    with pytest.raises(DatasetError, match=r"\[0, 10\)"):
        make(labels, K, partition="iid", num_clients=2, seed=0)


# --------------------------------------------------------------------------- scale


@pytest.mark.parametrize("name", ["iid", "dirichlet"])
def test_100k_clients_on_a_million_labels_partition_without_a_python_step_per_sample(name):
    # Prepare
    labels = shuffled_labels(1_000_000, num_classes=100)

    # Execute
    calls, part = python_calls(lambda: make(labels, 100, partition=name, num_clients=100_000, min_samples=0, seed=0))

    # Assert: about two Python calls per client (the train/test split draws one permutation per client, in
    # PFLlib's order; measured 2.0 for both), none per sample. How long it takes: benchmarks/quick_answers.py.
    assert part.num_clients == 100_000
    assert len(part.train_indices) + len(part.test_indices) == 1_000_000
    assert calls < 3 * 100_000, f"{calls} Python calls for 100,000 clients and 1,000,000 samples"
