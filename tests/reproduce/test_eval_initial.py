"""engine.eval_initial (the initial model as round 0) and engine.eval_train_loss (train_loss_eval)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

import rayfed
from rayfed.data import normalize_batch
from rayfed.engine import Simulation
from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from tests.conftest import tiny_overrides

_EVAL = {"engine.eval_initial": True, "engine.eval_train_loss": True, "data.options": {"num_samples": 1500}}


def _rounds(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "rounds.parquet").to_pylist()


def test_initial_evaluation_is_the_same_for_every_algorithm_on_the_same_init(tmp_path: Path) -> None:
    # Arrange: algorithms whose clients all start from the common initial model
    algorithms = {
        "fedavg": {},
        "fedprox": {"algorithm.params.mu": 0.01},
        "cwfedavg": {"algorithm.params.wdr_lambda": 10.0},
    }

    # Act
    first = {}
    for name, params in algorithms.items():
        config = rayfed.RunConfig().override(
            tiny_overrides(tmp_path / name, **_EVAL, **params, **{"algorithm.name": name})
        )
        result = rayfed.run(config)
        first[name] = _rounds(tmp_path / name)[0]
        assert result.rounds_run == 2  # the initial row is not a round

    # Assert: one row round=-1 before the trained rounds, equal accuracy and loss for all algorithms
    assert [r["round"] for r in _rounds(tmp_path / "fedavg")] == [-1, 0, 1]
    accuracies = {name: row["accuracy"] for name, row in first.items()}
    assert all(row["round"] == -1 for row in first.values())
    assert len(set(accuracies.values())) == 1, accuracies
    losses = [row["test_loss"] for row in first.values()]
    assert max(losses) - min(losses) < 1e-5
    assert 0.0 < accuracies["fedavg"] < 0.5  # an untrained model on 10 classes
    assert math.isnan(first["fedavg"]["train_loss_eval"])  # nothing was trained from it yet
    assert (tmp_path / "fedavg" / "clients" / "initial.parquet").is_file()
    assert set(_rounds(tmp_path / "cwfedavg")[0]) == set(_rounds(tmp_path / "cwfedavg")[-1])


def test_eval_initial_is_off_by_default(tmp_path: Path) -> None:
    # Arrange
    config = rayfed.RunConfig().override(tiny_overrides(tmp_path / "run", **{"data.options": {"num_samples": 1500}}))

    # Act
    rayfed.run(config)

    # Assert
    rows = _rounds(tmp_path / "run")
    assert [r["round"] for r in rows] == [0, 1]
    assert all(math.isnan(r["train_loss_eval"]) for r in rows)


def test_train_loss_eval_is_the_sample_weighted_loss_of_the_starting_model(tmp_path: Path) -> None:
    # Arrange: FedAvg, so round 0 starts every client from the initial global model
    config = rayfed.RunConfig().override(tiny_overrides(tmp_path / "run", **_EVAL))
    sim = Simulation(config)
    architecture = config.model.name
    flat = FlatModel(build_model(architecture, sim.dataset.input_shape, sim.dataset.num_classes))
    flat.load_state(sim.initial[architecture])
    flat.module.eval()

    # Act: the direct computation, then the engine's
    loss_sum, count = 0.0, 0
    with torch.no_grad():
        for cid in range(config.data.num_clients):
            idx = sim.partition.train(cid)
            x = normalize_batch(sim.dataset.images[idx], sim.dataset.mean, sim.dataset.std, device=torch.device("cpu"))
            y = torch.from_numpy(sim.dataset.labels[idx]).long()
            loss_sum += float(F.cross_entropy(flat.module(x), y, reduction="sum"))
            count += len(idx)
    sim.run()
    rows = _rounds(tmp_path / "run")
    clients = pq.read_table(tmp_path / "run" / "clients" / "round_000000.parquet").to_pylist()

    # Assert
    assert rows[1]["round"] == 0
    assert rows[1]["train_loss_eval"] == pytest.approx(loss_sum / count, rel=1e-5)
    weighted = np.average([c["train_loss_eval"] for c in clients], weights=[c["num_train"] for c in clients])
    assert weighted == pytest.approx(rows[1]["train_loss_eval"], rel=1e-9)
    assert rows[2]["train_loss_eval"] != rows[1]["train_loss_eval"]  # round 1 starts from the new global model
