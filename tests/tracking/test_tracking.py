"""Runs seen in TensorBoard, MLflow and W&B (engine.loggers), read back through each tool's own reader."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

from mlflow import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from rayfed import ConfigError, RunConfig, run  # noqa: E402
from rayfed.tracking.tensorboard_tracker import TensorBoardTracker  # noqa: E402
from rayfed.tuning import FloatParam, tune  # noqa: E402
from tests.conftest import tiny_overrides  # noqa: E402
from tests.tracking import wandb_reader  # noqa: E402

ALL = ["tensorboard", "mlflow", "wandb"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    """Each tool's defaults, as a user without a server or an account has them."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def accuracies(run_dir: Path) -> dict[int, float]:
    """step -> accuracy as rounds.parquet holds them (step = round + 1)."""
    rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    return {row["round"] + 1: row["accuracy"] for row in rows}


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def mlflow_run(run_dir: Path):
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("rayfed").experiment_id])
    return client, found


def test_a_missing_package_is_refused_before_anything_is_written(tmp_path, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"names 'wandb', but its package 'wandb' is not installed.*rayfed\[wandb\]"):
        run(tiny_overrides(tmp_path / "run", **{"engine.loggers": ALL}))
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"rayfed\[wandb\]"):
        tune(
            RunConfig().override(tiny_overrides(tmp_path / "x", **{"engine.loggers": ["wandb"]})),
            {},
            n_trials=1,
            study_dir=tmp_path / "study",
        )
    assert not (tmp_path / "study").exists()


def test_each_tracker_shows_the_rounds_parquet_numbers_config_distributions_and_figures(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run(tiny_overrides(run_dir, **{"engine.loggers": ALL, "engine.eval_initial": True, "train.rounds": 3}))
    expected = accuracies(run_dir)
    assert sorted(expected) == [0, 1, 2, 3]  # the initial model at step 0, then rounds 1..3

    assert dict(tensorboard_scalars(run_dir, "accuracy")) == pytest.approx(expected)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"histograms": 0, "images": 0})
    events.Reload()
    assert {"clients/test_acc", "clients/train_loss", "clients/update_norm"} <= set(events.Tags()["histograms"])
    assert [event.step for event in events.Histograms("clients/train_loss")] == [1, 2, 3]
    assert events.Tags()["images"] == ["figures/accuracy"]
    assert events.PluginTagToContent("hparams")  # the HParams tab's experiment and session

    client, logged = mlflow_run(run_dir)
    history = {m.step: m.value for m in client.get_metric_history(logged.info.run_id, "accuracy")}
    assert history == pytest.approx(expected)
    assert logged.data.params["train.lr"] == "0.005" and logged.data.params["data.dataset"] == "synthetic"
    assert logged.info.status == "FINISHED" and logged.info.run_name == "run"
    assert [a.path for a in client.list_artifacts(logged.info.run_id, "figures")] == ["figures/accuracy.png"]

    rows = wandb_reader.history(run_dir)
    assert {step: values["accuracy"] for _, step, values in rows} == pytest.approx(expected)
    assert rows[1][2]["clients/test_acc/_type"] == "histogram"
    assert wandb_reader.summary(run_dir)["figures/accuracy"]["_type"] == "image-file"
    assert wandb_reader.config(run_dir)["train"]["lr"] == 0.005


def test_a_resumed_run_appends_to_the_same_logged_run_and_sends_no_round_twice(tmp_path) -> None:
    run_dir = tmp_path / "run"
    first = tiny_overrides(run_dir, **{"engine.loggers": ALL, "train.rounds": 3, "engine.checkpoint_every": 2})
    run(first)
    (run_dir / "checkpoints" / "round_000002.npz").unlink()  # round 3 (step 3) runs again on resume
    run({**first, "train.rounds": 4}, resume=True)
    expected = accuracies(run_dir)
    assert sorted(expected) == [1, 2, 3, 4]

    scalars = tensorboard_scalars(run_dir, "accuracy")  # float32 in the event files
    assert [step for step, _ in scalars] == [1, 2, 3, 4] and dict(scalars) == pytest.approx(expected)
    client, logged = mlflow_run(run_dir)  # exactly one run
    steps = [m.step for m in client.get_metric_history(logged.info.run_id, "accuracy")]
    assert sorted(steps) == [1, 2, 3, 4]
    rows = wandb_reader.history(run_dir)
    assert len({run_id for run_id, _, _ in rows}) == 1
    assert [(step, values["accuracy"]) for _, step, values in rows] == sorted(expected.items())


def test_a_failing_tracker_is_left_out_and_the_run_goes_on(tmp_path, monkeypatch, caplog) -> None:
    def broken(self, points):
        raise OSError("disk quota exceeded")

    monkeypatch.setattr(TensorBoardTracker, "log_rounds", broken)
    with caplog.at_level(logging.WARNING, logger="rayfed.tracking"):
        result = run(tiny_overrides(tmp_path / "run", **{"engine.loggers": ["tensorboard"]}))
    assert result.rounds_run == 2
    assert "tensorboard failed to take the rounds' metrics (OSError: disk quota exceeded)" in caplog.text
    assert caplog.text.count("failed to take") == 1


def test_a_study_logs_each_trial_as_a_run_nested_in_the_studys(tmp_path) -> None:
    base = RunConfig().override(
        tiny_overrides(
            tmp_path / "unused", **{"engine.loggers": ["mlflow", "tensorboard"], "engine.checkpoint_every": 0}
        )
    )
    study = tune(
        base,
        {"train.lr": FloatParam(0.01, 0.1, log=True)},
        n_trials=2,
        study_name="lr",
        study_dir=tmp_path / "study",
        pruner="none",
    )
    client = MlflowClient(f"sqlite:///{tmp_path / 'study' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lr").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`rayfed.study` = 'lr'")
    trials = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(t.info.run_name for t in trials) == ["trial_0000", "trial_0001"]
    for trial in study.trials:
        (logged,) = [t for t in trials if t.data.tags["rayfed.trial"] == str(trial.number)]
        assert float(logged.data.params["train.lr"]) == pytest.approx(trial.params["train.lr"])
        run_dir = tmp_path / "study" / f"trial_{trial.number:04d}"
        assert dict(tensorboard_scalars(run_dir, "accuracy")) == pytest.approx(accuracies(run_dir))
    assert "space" in parent.data.params


def test_a_tracker_that_cannot_open_stops_the_run_at_round_0_in_one_line(tmp_path, monkeypatch) -> None:
    def refused(self, run, saved, study):
        raise PermissionError(13, "Permission denied", str(run.run_dir / "tensorboard"))

    monkeypatch.setattr(TensorBoardTracker, "__init__", refused)
    with pytest.raises(ConfigError, match=r"engine.loggers: tensorboard could not open .*Permission denied.*leave"):
        run(tiny_overrides(tmp_path / "run", **{"engine.loggers": ["tensorboard"]}))
    assert not (tmp_path / "run" / "rounds.parquet").exists()
