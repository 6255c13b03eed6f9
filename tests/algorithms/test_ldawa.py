"""L-DAWA: layer-wise cosine scaling against a per-layer loop, and its shrinking aggregate end to end."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from rayfed import RunConfig
from rayfed.algorithms import ClientVectors, RoundContext, sum_contributions
from rayfed.algorithms.ldawa import LDAWAParams, LDAWAServer, ldawa_aggregate
from rayfed.engine import Simulation
from rayfed.execution.client_runner import ClientRunner
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.conftest import tiny_overrides

LAYOUT = ParamLayout(("a.weight", "a.bias", "bn.bias"), ((2, 3), (3,), (2,)), (0, 6, 9, 11))


def _direct(models: np.ndarray, theta_g: np.ndarray, layout: ParamLayout) -> np.ndarray:
    """The rule written out: a loop over layers and clients, np.dot for the cosine."""
    out = np.empty_like(theta_g, dtype=np.float64)
    for i in range(len(layout.names)):
        lo, hi = layout.offsets[i], layout.offsets[i + 1]
        g = theta_g[lo:hi].astype(np.float64)
        total = np.zeros(hi - lo)
        for row in models:
            x = row[lo:hi].astype(np.float64)
            norms = np.linalg.norm(x) * np.linalg.norm(g)
            delta = 1.0 if norms == 0 else min(1.0, float(np.dot(x, g)) / norms)
            total += delta * x
        out[lo:hi] = total / len(models)
    out[layout.size :] = models[:, layout.size :].mean(axis=0)
    return out


def test_aggregate_matches_the_per_layer_rule_written_out() -> None:
    # Prepare: 4 clients; a state of 11 parameters and 2 buffer entries; the global "bn.bias" is all
    # zeros (as BatchNorm's bias at initialisation), and client 3's "a.bias" points against θ_g's.
    rng = np.random.default_rng(1)
    theta_g = rng.normal(size=13).astype(np.float32)
    theta_g[9:11] = 0
    models = (theta_g + 0.7 * rng.normal(size=(4, 13))).astype(np.float32)
    models[3, 6:9] = -theta_g[6:9]
    # Execute
    merged, delta = ldawa_aggregate(models, theta_g, LAYOUT)
    # Assert: equal to the loop; δ = −1 on the opposed layer, 1 on the zero layer, ≤ 1 everywhere.
    np.testing.assert_allclose(merged, _direct(models, theta_g, LAYOUT), rtol=1e-5, atol=1e-6)
    assert delta.shape == (4, 3) and (delta <= 1).all()
    np.testing.assert_allclose(delta[3, 1], -1.0, rtol=1e-6)
    np.testing.assert_array_equal(delta[:, 2], 1.0)


def test_identical_clients_reproduce_the_global_model_and_diverging_ones_shrink_it(tmp_path) -> None:
    # Prepare: real uploads of 4 clients trained from the same global model.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "ldawa",
                "data.num_clients": 4,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 600},
                "train.lr": 0.1,
            },
        )
    )
    sim = Simulation(config)
    server = LDAWAServer(LDAWAParams(warmup_rounds=0), sim.spec, sim.initial)
    before = server.global_vector.copy()
    ctx = RoundContext(0, 0, 0.1, np.arange(4))
    upload = (
        ClientRunner(config, sim.spec, sim.dataset, sim.partition)
        .train(server.broadcast(), ctx, [0, 1, 2, 3])
        .contribution
    )
    # Execute
    same, _ = ldawa_aggregate(np.stack([before] * 3), before, server.layout)
    metrics = server.aggregate(ctx, upload)
    # Assert: clients equal to θ_g give θ_g back; trained clients disagree with θ_g (δ < 1), so every
    # layer of the new global model is shorter than the plain mean of the uploads, layer by layer.
    np.testing.assert_allclose(same, before, rtol=1e-6)
    assert metrics["ldawa_min_cos"] < 1 and metrics["clients_aggregated"] == 4
    mean = upload.matrix().mean(axis=0)
    layout = server.layout
    for i in range(len(layout.names)):
        piece = slice(layout.offsets[i], layout.offsets[i + 1])
        assert np.linalg.norm(server.global_vector[piece]) <= np.linalg.norm(mean[piece]) * (1 + 1e-6)
    assert np.linalg.norm(server.global_vector[: layout.size]) < np.linalg.norm(mean[: layout.size])


def test_partial_participation_runs_and_uploads_whole_models(tmp_path) -> None:
    # Prepare: 6 clients, half per round.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "ldawa",
                "data.num_clients": 6,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 900},
                "engine.join_ratio": 0.5,
            },
        )
    )
    size = next(iter(Simulation(config).initial.values())).size
    # Execute
    result = Simulation(config).run()
    # Assert: whole state up (+ id and size, 16 bytes) and down, for the 3 sampled clients per round.
    sampled = [c for c in pq.read_table(tmp_path / "run" / "clients").to_pylist() if c["sampled"]]
    assert len(sampled) == 6 and all(np.isfinite(result.accuracies))
    assert all(c["bytes_up"] == 4 * size + 16 and c["bytes_down"] == 4 * size for c in sampled)


def test_warmup_rounds_aggregate_with_fedavg_then_ldawa_starts() -> None:
    # Prepare: the authors' script averages with FedAvg while its global round is <= 2.
    layout = ParamLayout(("w", "b"), ((2, 2), (2,)), (0, 4, 6))
    spec = ProblemSpec(3, 2, (1, 1, 2), {"m": layout}, {"m": ("w",)}, {"m": "w"}, default_architecture="m")
    rng = np.random.default_rng(0)
    server = LDAWAServer(LDAWAParams(), spec, {"m": rng.normal(size=6).astype(np.float32)})
    models, sizes = rng.normal(size=(3, 6)).astype(np.float32), np.array([10.0, 30.0, 60.0])
    upload = sum_contributions(ClientVectors.of(models[i], i, sizes[i]) for i in range(3))
    # Execute and assert: rounds 0-2 give the size-weighted mean; round 3 applies δ.
    for r in range(3):
        server.aggregate(RoundContext(r, 0, 0.1, np.arange(3)), upload)
        np.testing.assert_allclose(server.global_vector, sizes / sizes.sum() @ models, rtol=1e-5, atol=1e-6)
    before = server.global_vector.copy()
    metrics = server.aggregate(RoundContext(3, 0, 0.1, np.arange(3)), upload)
    expected, _ = ldawa_aggregate(models, before, layout)
    np.testing.assert_allclose(server.global_vector, expected, rtol=1e-5, atol=1e-6)
    assert "ldawa_min_cos" in metrics
