"""FedFomo: the start model from validation-loss gains per distance, the 80/20 split, downloads counted."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from rayfed import RunConfig
from rayfed.algorithms.common.own_models import MODEL_KEY
from rayfed.algorithms.fedfomo import (
    AFFINITY_KEY,
    START_KEY,
    FedFomoClient,
    FedFomoParams,
    FomoModels,
    choose_models,
    decayed_epsilon,
    fomo_weights,
    tail_split,
    validation_split,
)
from rayfed.engine import Simulation
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from tests.algorithms.client_states import StateSnapshots
from tests.algorithms.read_back import settled
from tests.conftest import client_job, tiny_overrides


def _job(flat: FlatModel, x: torch.Tensor, y: torch.Tensor, state: dict[str, np.ndarray]) -> ClientJob:
    empty = torch.empty(0)
    return client_job(flat, x, y, test=(empty, empty.long()), architecture="linear", round=3, state=state)


def _started(client: FedFomoClient, message: FomoModels, job: ClientJob) -> None:
    """Start ``job`` as a worker does: ``job.start`` and its model in ``job.flat``."""
    job.start = client.start(message, job)
    job.flat.load_state(job.start.model)


def test_the_start_model_weights_models_by_validation_loss_gain_per_distance() -> None:
    # Arrange: a linear model; the client's own model and 3 others' (client 0 is the client itself).
    torch.manual_seed(0)
    flat = FlatModel(torch.nn.Linear(4, 3))
    rng = np.random.default_rng(1)
    models = rng.normal(size=(4, flat.size)).astype(np.float32)
    own = (3 * rng.normal(size=flat.size)).astype(np.float32)
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    message = FomoModels(models, np.ones(4, bool), seed=7, num_params=flat.size)
    client = FedFomoClient(FedFomoParams(), None)  # type: ignore[arg-type]
    job = _job(flat, x, y, {MODEL_KEY: own})
    # Act
    _started(client, message, job)
    # Assert: direct computation on the seeded 20 % validation split (Eq. 5 and 6).
    val, train = validation_split(50, 0.2, 7, 0)
    assert len(val) == 10 and len(np.intersect1d(val, train)) == 0 and len(train) == 40

    def loss(vector: np.ndarray) -> float:
        w = torch.from_numpy(vector[:12]).view(3, 4)
        b = torch.from_numpy(vector[12:])
        return float(F.cross_entropy(x[val] @ w.T + b, y[val]))

    raw = np.array([(loss(own) - loss(models[n])) / np.linalg.norm(models[n] - own) for n in (1, 2, 3)])
    assert (raw > 0).sum() >= 2  # the mix, not one model
    weights = np.maximum(raw, 0) / np.maximum(raw, 0).sum()
    expected = own + sum(weights[k] * (models[n] - own) for k, n in enumerate((1, 2, 3)))
    np.testing.assert_allclose(flat.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert job.num_train == 40 and torch.equal(job.y_train, y[train])
    # The affinities grow by the raw weights once the client uploads.
    settled(client.upload(message, job), job)
    np.testing.assert_allclose(job.state[AFFINITY_KEY], np.r_[0.0, raw], rtol=1e-5)
    assert client.bytes_down(message, job) == 3 * flat.size * 4


def test_pfllib_weighs_against_the_last_start_with_its_own_upload_and_an_offset_distance() -> None:
    # Arrange: the client trained from `start` to `own` last round (own is also its upload, row 0 at the server).
    torch.manual_seed(0)
    flat = FlatModel(torch.nn.Linear(4, 3))
    rng = np.random.default_rng(2)
    models = rng.normal(size=(4, flat.size)).astype(np.float32)
    start = rng.normal(size=flat.size).astype(np.float32)
    own = models[0].copy()
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    message = FomoModels(models, np.ones(4, bool), seed=7, num_params=flat.size)
    client = FedFomoClient(FedFomoParams(fidelity="pfllib"), None)  # type: ignore[arg-type]
    job = _job(flat, x, y, {MODEL_KEY: own, START_KEY: start})
    # Act
    _started(client, message, job)
    started = flat.numpy()
    settled(client.upload(message, job), job)
    # Assert: PFLlib's rule on the last 10 of the 50 samples, every client's model (its own too) against `start`.
    val, train = tail_split(50, 0.2)
    assert val.tolist() == list(range(40, 50)) and train.tolist() == list(range(40))

    def loss(vector: np.ndarray) -> float:
        w = torch.from_numpy(vector[:12]).view(3, 4)
        return float(F.cross_entropy(x[val] @ w.T + torch.from_numpy(vector[12:]), y[val]))

    raw = np.array([(loss(start) - loss(models[n])) / (np.linalg.norm(models[n] - start) + 1e-5) for n in range(4)])
    weights = np.maximum(raw, 0) / np.maximum(raw, 0).sum()
    assert (weights > 0).sum() >= 2
    np.testing.assert_allclose(started, weights @ models, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(job.state[START_KEY], weights @ models, rtol=1e-5, atol=1e-6)  # next round's base
    np.testing.assert_allclose(job.state[AFFINITY_KEY], raw, rtol=1e-5)
    assert client.bytes_down(message, job) == 4 * flat.size * 4 and torch.equal(job.y_train, y[train])


def test_weights_are_clipped_and_normalised_and_the_choice_is_epsilon_greedy() -> None:
    # Arrange / Act
    raw, weights = fomo_weights(
        torch.tensor(1.0, dtype=torch.float64), torch.tensor([0.5, 1.5, 0.0, 0.2]), torch.tensor([1.0, 1.0, 2.0, 0.0])
    )
    # Assert: a model at distance 0 weighs 0; negative gains are clipped; weights sum to 1; all in float64.
    assert raw.dtype == weights.dtype == torch.float64
    np.testing.assert_allclose(raw.numpy(), [0.5, -0.5, 0.5, 0.0])
    np.testing.assert_allclose(weights.numpy(), [0.5, 0.0, 0.5, 0.0])
    # No positive gain: every weight 0 (the client keeps its own model).
    _, none = fomo_weights(torch.tensor(0.0), torch.tensor([0.5, 0.2]), torch.tensor([1.0, 2.0]))
    np.testing.assert_array_equal(none.numpy(), [0.0, 0.0])
    # PFLlib's offset: every distance + 1e-5, so a model at distance 0 weighs its gain / 1e-5.
    raw, _ = fomo_weights(
        torch.tensor(1.0), torch.tensor([0.5, 0.2]), torch.tensor([1.0, 0.0], dtype=torch.float64) + 1e-5
    )
    np.testing.assert_allclose(raw.numpy(), [0.5 / (1 + 1e-5), 0.8e5])
    candidates, affinity = np.array([1, 2, 3, 4]), np.array([0.0, 0.1, 0.9, -1.0, 0.5])
    assert choose_models(candidates, affinity, 2, 0.0, np.random.default_rng(0)).tolist() == [2, 4]
    assert choose_models(candidates, affinity, 0, 0.0, np.random.default_rng(0)).tolist() == [1, 2, 3, 4]
    draws = {tuple(choose_models(candidates, affinity, 2, 1.0, np.random.default_rng(s))) for s in range(20)}
    assert len(draws) > 1
    # ε decays by 0.05 a round from 0.3 (the authors' code): exploring until round 5, greedy from round 6.
    assert [decayed_epsilon(0.3, 0.05, t) for t in (0, 1, 5)] == pytest.approx([0.3, 0.25, 0.05])
    assert decayed_epsilon(0.3, 0.05, 6) == pytest.approx(0.0, abs=1e-12) and decayed_epsilon(0.3, 0.05, 50) == 0.0


def test_exploration_fades_with_the_rounds() -> None:
    # Arrange: M = 1 of 3 models, the affinity favouring client 2's; the job is in round 3.
    torch.manual_seed(0)
    flat = FlatModel(torch.nn.Linear(4, 3))
    models = np.random.default_rng(1).normal(size=(4, flat.size)).astype(np.float32)
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    affinity = np.array([0.0, 0.0, 5.0, 0.0])

    def downloaded(decay: float, seed: int) -> list[int]:
        client = FedFomoClient(FedFomoParams(num_models=1, epsilon=1.0, epsilon_decay=decay), None)  # type: ignore[arg-type]
        message = FomoModels(models, np.ones(4, bool), seed=seed, num_params=flat.size)
        job = _job(flat, x, y, {MODEL_KEY: models[0].copy(), AFFINITY_KEY: affinity.copy()})
        _started(client, message, job)
        settled(client.upload(message, job), job)
        return np.flatnonzero(job.state[AFFINITY_KEY] != affinity).tolist()  # P_in += w_n for the n downloaded

    # Act / Assert: ε = 1 explores (some seeds download another model); ε_3 = max(0, 1 − 3·0.5) = 0 is greedy.
    assert any(downloaded(0.0, seed) != [2] for seed in range(10))
    assert all(downloaded(0.5, seed) == [2] for seed in range(10))


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_clients_download_every_uploaded_model_and_train_on_the_rest(tmp_path, join_ratio) -> None:
    # Arrange: 6 clients; with join_ratio 0.5, 3 per round (stale models offered).
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "fedfomo",
                "data.num_clients": 6,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 900},
                "engine.join_ratio": join_ratio,
            },
        )
    )
    states = StateSnapshots()
    # Act
    Simulation(config, callbacks=[states]).run()
    # Assert: round 0 has nothing to download; round 1 downloads every other client that uploaded in round 0.
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    sampled = [c for c in clients if c["sampled"]]
    size = next(iter(states.rounds[0].values())).size * 4
    uploaded_first = {c["client_id"] for c in sampled if c["round"] == 0}
    for c in sampled:
        assert c["bytes_up"] == size + 16
        others = len(uploaded_first - {c["client_id"]}) if c["round"] == 1 else 0
        assert c["bytes_down"] == others * size
        assert c["steps"] == c["num_train"] // 10  # 80 % of its train split, batches of 10
    # Clients kept their own models; they differ (personalised) after round 1.
    last = states.rounds[-1]
    assert len(last) == len({c["client_id"] for c in sampled})
    ids = sorted(last)
    assert not np.array_equal(last[ids[0]], last[ids[1]])
