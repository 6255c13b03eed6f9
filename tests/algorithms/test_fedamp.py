"""FedAMP: attention weights of the message passing step, own models kept, cloud models mixed from stale ones."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig
from rayfed.algorithms.fedamp import FedAMPParams, attention_weights, cloud_models, pairwise_sq_distances
from rayfed.engine import Simulation
from rayfed.engine.callbacks import Callback
from rayfed.util.errors import ConfigError
from tests.conftest import tiny_overrides


class ServerModels(Callback):
    """``rounds[t]``: a copy of the server's state after round t, and the clients' persisted models."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, np.ndarray]] = []
        self.own: list[dict[int, np.ndarray]] = []

    def after_round(self, run, record, clients) -> bool:
        self.rounds.append({k: np.array(v) for k, v in run.server_state().items()})
        self.own.append({cid: np.array(state["model"]) for cid, state in run.client_states()})
        return False


def _config(tmp_path, name: str = "run", **extra: object) -> RunConfig:
    return RunConfig().override(
        tiny_overrides(
            tmp_path / name,
            **{
                "algorithm.name": "fedamp",
                "data.num_clients": 6,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 900},
                **extra,
            },
        )
    )


def test_attention_weights_and_cloud_models_match_a_direct_loop() -> None:
    # Arrange: 5 clients' models, client 3 never uploaded (no message from it).
    rng = np.random.default_rng(0)
    models = (rng.normal(size=(5, 40)) * 0.05).astype(np.float32)
    seen = np.array([True, True, True, False, True])
    alpha_k, sigma = 0.3, 0.2
    # Act
    xi = attention_weights(pairwise_sq_distances(models), seen, alpha_k, sigma)
    clouds = cloud_models(xi, models)
    # Assert: ξ_ij = α_K·exp(−‖w_i − w_j‖²/σ)/σ for seen j ≠ i, ξ_ii = 1 − Σ_{j≠i} ξ_ij, u_i = Σ_j ξ_ij w_j.
    w = models.astype(np.float64)
    for i in range(5):
        expected = np.zeros(5)
        for j in range(5):
            if j != i and seen[j]:
                expected[j] = alpha_k * np.exp(-np.sum((w[i] - w[j]) ** 2) / sigma) / sigma
        expected[i] = 1 - expected.sum()
        np.testing.assert_allclose(xi[i], expected, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(clouds[i], expected @ w, rtol=1e-5, atol=1e-6)
    assert xi[:, 3].tolist() == [0, 0, 0, xi[3, 3], 0]


def test_distances_of_nearly_equal_models_survive_float_cancellation() -> None:
    # Arrange: large, nearly equal rows (a shared initialisation moved by 1e-3).
    base = np.full(1000, 100.0, dtype=np.float32)
    models = np.stack([base, base + np.float32(1e-3)])
    # Act
    d = pairwise_sq_distances(models)
    # Assert: 1000 · (1e-3)² = 1e-3, as float32 differences give it.
    assert d[0, 1] == pytest.approx(float(np.sum((models[1] - models[0]).astype(np.float64) ** 2)), rel=1e-6)


def test_attention_pulls_clients_together_and_each_is_evaluated_with_its_own_model(tmp_path) -> None:
    # Arrange: the same run with attention on (σ large: ξ_ij ≈ α_K/σ ≈ 0.08) and off (σ tiny: ξ_ij = 0).
    on, off = ServerModels(), ServerModels()
    common = {"algorithm.params": {"alpha_k": 80.0, "sigma": 1000.0, "start": "cloud"}, "train.rounds": 3}
    # Act
    Simulation(_config(tmp_path, "on", **common), callbacks=[on]).run()
    common["algorithm.params"] = {"alpha_k": 80.0, "sigma": 1e-9, "start": "cloud"}
    Simulation(_config(tmp_path, "off", **common), callbacks=[off]).run()
    # Assert: the models the clients keep are the ones the server holds (evaluated: their own w_i) ...
    for t in range(3):
        for cid, model in on.own[t].items():
            np.testing.assert_array_equal(model, on.rounds[t]["models"][cid])
    # ... and attention shrinks the clients' spread relative to training alone.
    spread_on = pairwise_sq_distances(on.rounds[-1]["models"]).mean()
    spread_off = pairwise_sq_distances(off.rounds[-1]["models"]).mean()
    assert spread_on < 0.5 * spread_off, (spread_on, spread_off)


def test_bytes_are_one_model_each_way_and_stale_models_are_mixed_under_partial_participation(tmp_path) -> None:
    # Arrange: half the clients per round.
    snapshots = ServerModels()
    config = _config(
        tmp_path,
        **{"engine.join_ratio": 0.5, "train.rounds": 2, "algorithm.params": {"alpha_k": 80.0, "sigma": 1000.0}},
    )
    # Act
    Simulation(config, callbacks=[snapshots]).run()
    # Assert: bytes per sampled client: its cloud model down; its model, id and size up.
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    sampled = [c for c in clients if c["sampled"]]
    state_bytes = snapshots.rounds[0]["models"].shape[1] * 4
    assert len(sampled) == 6
    assert all(c["bytes_down"] == state_bytes and c["bytes_up"] == state_bytes + 16 for c in sampled)
    # Clients that sat out round 1 keep their stale row at the server; those that never uploaded are not seen.
    first, second = snapshots.rounds
    trained_again = {c["client_id"] for c in sampled if c["round"] == 1}
    for cid in range(6):
        if cid not in trained_again:
            np.testing.assert_array_equal(second["models"][cid], first["models"][cid])
    assert first["seen"].sum() == 3 and second["seen"].sum() == len({c["client_id"] for c in sampled})


def test_bad_params_and_heterogeneous_models_are_refused() -> None:
    with pytest.raises(ConfigError, match="algorithm.params.sigma"):
        FedAMPParams(sigma=0)
    with pytest.raises(ConfigError, match="algorithm.params.start"):
        FedAMPParams(start="global")  # type: ignore[arg-type]
