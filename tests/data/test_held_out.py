"""Held-out server data: drawn once from data.seed, left out of every client, recorded in the run directory."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig
from rayfed.config import DataConfig
from rayfed.data import load_dataset, load_partition
from rayfed.data.held_out import (
    HELD_OUT_FILE,
    HeldOutRequest,
    HeldOutSet,
    choose_from_source,
    choose_held_out,
    load_held_out,
    partition_without,
)
from rayfed.engine import Simulation
from rayfed.execution.client_runner import ClientRunner
from rayfed.util.errors import ConfigError, DatasetError
from tests.conftest import TINY_SAMPLES, tiny_overrides


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
    overrides = tiny_overrides(
        tmp_path / "run",
        **{
            "algorithm.name": "fedlaw",
            "algorithm.params": {"proxy_size": 60, "server_epochs": 1},
            "data.partition": "dirichlet",
            "train.rounds": 1,
        },
    )
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
    assert int(partition.num_train().sum() + partition.num_test().sum()) == TINY_SAMPLES - 60
    # The workers' spec drops a server-only set and keeps a shared one.
    runner = ClientRunner(config, first.spec, first.dataset, first.partition)
    assert runner.spec.held_out is None and first.spec.held_out is not None
    shared = HeldOutSet.of(load_dataset("synthetic", None, options={"num_samples": 3000}), saved, shared=True)
    assert first.spec.__class__(**{**first.spec.__dict__, "held_out": shared}).for_clients().held_out is shared


def test_choose_from_source_draws_the_chosen_classes_balanced_and_deterministic() -> None:
    labels = np.repeat(np.arange(6), 20)
    request = HeldOutRequest(9, dataset="other", classes=(4, 1, 2), field="algorithm.params.public_size")
    # Execute
    first = choose_from_source(labels, 6, request, seed=3)
    # Assert: three per chosen class, sorted, the same again; every sample may be taken (no pool to keep).
    assert np.bincount(labels[first], minlength=6).tolist() == [0, 3, 3, 0, 3, 0]
    assert list(first) == sorted(first)
    np.testing.assert_array_equal(first, choose_from_source(labels, 6, request, seed=3))
    assert len(choose_from_source(labels, 6, HeldOutRequest(120, dataset="other"), seed=0)) == 120
    with pytest.raises(ConfigError, match=r"algorithm.params.public_size=61 .*has 60"):
        choose_from_source(
            labels,
            6,
            HeldOutRequest(61, dataset="other", classes=(0, 1, 2), field="algorithm.params.public_size"),
            seed=0,
        )
    with pytest.raises(ConfigError, match=r"classes \[7\]"):
        choose_from_source(labels, 6, HeldOutRequest(3, dataset="other", classes=(0, 7)), seed=0)


def test_public_set_from_another_dataset_is_recorded_leaves_the_pool_whole_and_resumes(tmp_path) -> None:
    from tests.algorithms.two_groups import DATASET as OTHER

    # Prepare: KT-pFL on the synthetic pool with its public set drawn from another registered dataset.
    overrides = tiny_overrides(
        tmp_path / "run",
        **{
            "algorithm.name": "ktpfl",
            "data.num_clients": 4,
            "data.options": {"num_samples": 600},
            "train.rounds": 1,
            "data.partition": "dirichlet",
            "algorithm.params": {"public_size": 40, "public_dataset": OTHER, "public_classes": [1, 3]},
        },
    )
    # Execute
    first = Simulation(RunConfig().override(overrides))
    first.run()
    resumed = Simulation(RunConfig().override({**overrides, "train.rounds": 2}), resume=True)
    # Assert: held_out.parquet names the source; the set holds its classes 1 and 3, the inputs are the
    # source's samples, every pool sample belongs to a client, and a resumed run reads the same set.
    table = pq.read_table(tmp_path / "run" / HELD_OUT_FILE).to_pydict()
    source = load_dataset(OTHER, None, seed=RunConfig().override(overrides).data.seed)
    held = first.spec.held_out
    assert set(table["dataset"]) == {OTHER} and table["index"] == held.indices.tolist()
    assert set(source.labels[held.indices].tolist()) == {1, 3} and len(held) == 40 and held.shared
    np.testing.assert_array_equal(held.inputs, source.inputs[held.indices])
    assert int(first.partition.num_train().sum() + first.partition.num_test().sum()) == 600
    np.testing.assert_array_equal(resumed.spec.held_out.indices, held.indices)
    with pytest.raises(DatasetError, match="drawn from"):
        load_held_out(tmp_path / "run" / HELD_OUT_FILE, len(source), "")


@pytest.mark.parametrize(
    "public, options, message",
    [
        ("synthetic", {"num_samples": 600}, "clients' own dataset"),
        ("two_label_group", {"num_samples": 600}, "did you mean"),
        ("two_label_groups", {"num_samples": 600, "channels": 3}, "same shape"),
    ],
)
def test_public_dataset_is_refused_before_anything_is_written(tmp_path, public, options, message) -> None:
    import tests.algorithms.two_groups  # noqa: F401  (registers two_label_groups)

    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "ktpfl",
                "data.num_clients": 4,
                "data.options": options,
                "data.partition": "dirichlet",
                "algorithm.params": {"public_size": 40, "public_dataset": public},
            },
        )
    )
    with pytest.raises(ConfigError, match=f"algorithm.params.public_dataset.*{message}"):
        Simulation(config)
    assert not (tmp_path / "run").exists()
