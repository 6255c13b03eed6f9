"""End to end: the round loop in-process and on Ray, reproducibility, files and resume."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest

from rayfed import CheckpointError, ConfigError, RunConfig, run
from tests.conftest import TINY_SAMPLES, tiny_overrides


def test_local_run_writes_metrics_partition_and_checkpoint(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"engine.checkpoint_every": 1}))
    result = run(config)
    assert result.rounds_run == 2
    assert 0.0 < result.best_accuracy <= 1.0
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()
    assert [r["round"] for r in rounds] == [0, 1]
    assert all(r["num_evaluated"] == 10 and r["num_sampled"] == 10 for r in rounds)
    assert {"accuracy", "acc_mean", "acc_std", "train_loss", "train_s", "aggregate_s", "evaluate_s"} <= set(rounds[0])
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    assert len(clients) == 20 and all(0 <= c["test_acc"] <= 1 for c in clients)
    assert pq.read_table(tmp_path / "run" / "partition.parquet").num_rows == TINY_SAMPLES
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["round_000000.npz", "round_000001.npz"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds_run"] == 2


def test_same_seed_gives_same_metrics(tmp_path) -> None:
    a = run(RunConfig().override(tiny_overrides(tmp_path / "a")))
    b = run(RunConfig().override(tiny_overrides(tmp_path / "b")))
    c = run(RunConfig().override(tiny_overrides(tmp_path / "c", seed=1)))
    assert a.accuracies == b.accuracies
    assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]
    assert a.accuracies != c.accuracies


def test_partial_participation_trains_only_sampled_clients(tmp_path) -> None:
    result = run(RunConfig().override(tiny_overrides(tmp_path / "run", **{"engine.join_ratio": 0.5})))
    assert [r["num_sampled"] for r in result.history] == [5, 5]
    assert all(r["num_evaluated"] == 10 for r in result.history)


def test_fedprox_runs_end_to_end(tmp_path) -> None:
    overrides = tiny_overrides(tmp_path / "run", **{"algorithm.name": "fedprox", "algorithm.params.mu": 0.01})
    result = run(RunConfig().override(overrides))
    assert not math.isnan(result.final_accuracy)


def test_resume_continues_where_the_run_stopped(tmp_path) -> None:
    full = run(RunConfig().override(tiny_overrides(tmp_path / "full", **{"train.rounds": 4})))
    partial = RunConfig().override(tiny_overrides(tmp_path / "part", **{"engine.checkpoint_every": 2}))
    run(partial)
    resumed = run(partial.override({"train.rounds": 4}), resume=True)
    assert resumed.accuracies == full.accuracies
    assert pq.read_table(tmp_path / "part" / "rounds.parquet").num_rows == 4


def test_existing_run_is_never_overwritten(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run"))
    run(config)
    with pytest.raises(ConfigError, match="already holds a run"):
        run(config)


def test_resume_from_empty_directory_is_refused(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "nothing"))
    with pytest.raises(CheckpointError, match="holds no run"):
        run(config, resume=True)


def test_resume_with_changed_config_is_refused(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run"))
    run(config)
    with pytest.raises(ConfigError, match="train.lr"):
        run(config.override({"train.lr": 0.5}), resume=True)


@pytest.mark.parametrize("batching", [{}, {"engine.clients_per_call": 2}], ids=["default", "clients_per_call=2"])
def test_ray_run_matches_local_run(tmp_path, ray_cluster, batching) -> None:
    # Local trains every batch in this process, Ray on two workers: the batches, and so the numbers, are the same.
    local = run(RunConfig().override(tiny_overrides(tmp_path / "local", **batching)))
    ray_engine = {"engine.backend": "ray", "engine.num_workers": 2, **batching}
    on_ray = run(RunConfig().override(tiny_overrides(tmp_path / "ray", **ray_engine)))
    assert on_ray.rounds_run == 2
    for key in ("accuracy", "acc_mean", "acc_std", "test_loss", "train_loss"):
        assert [r[key] for r in on_ray.history] == [r[key] for r in local.history], key
