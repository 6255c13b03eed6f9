"""FedDisco: discrepancy-aware weights against a direct computation, alone and as FedAWA's initial weights."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig
from rayfed.algorithms import RoundContext, sum_contributions
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.fedawa import FedAWAParams, FedAWAServer
from rayfed.algorithms.feddisco import FedDiscoParams, FedDiscoServer, disco_weights, discrepancy
from rayfed.engine import Simulation
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.conftest import tiny_overrides

LAYOUT = ParamLayout(("w",), ((4,),), (0, 4))
COUNTS = np.array([[25, 25, 25, 25], [100, 0, 0, 0], [60, 20, 20, 0], [10, 10, 10, 10]])
SIZES = COUNTS.sum(axis=1).astype(np.float64)


def _spec(num_clients: int = 4) -> ProblemSpec:
    return ProblemSpec(num_clients, 4, (1, 1, 4), {"m": LAYOUT}, {"m": ("w",)}, {"m": "w"}, default_architecture="m")


def _uploads(models: np.ndarray) -> ClientVectors:
    return sum_contributions(ClientVectors.of(m, i, n, c) for i, (m, n, c) in enumerate(zip(models, SIZES, COUNTS)))


def _direct_weights(counts: np.ndarray, a: float, b: float) -> np.ndarray:
    """KL(p_k ‖ uniform) written out with a Python loop, normalised over the clients; then the ReLU rule."""
    kl = []
    for row in counts:
        p = row / row.sum()
        kl.append(sum(float(q * np.log(q / 0.25)) for q in p if q > 0))
    d = np.array(kl) / sum(kl)
    n = counts.sum(axis=1) / counts.sum()
    raw = np.maximum(n - a * d + b, 0)
    return raw / raw.sum()


@pytest.mark.parametrize(("a", "b"), [(0.5, 0.1), (2.0, 0.0)])
def test_weights_match_the_rule_written_out(a: float, b: float) -> None:
    # Execute
    weights = disco_weights(SIZES, COUNTS, a, b)
    # Assert: the rule; (2, 0) clips a client to 0 and the rest renormalise.
    np.testing.assert_allclose(weights, _direct_weights(COUNTS, a, b), rtol=1e-12)
    np.testing.assert_allclose(weights.sum(), 1.0)
    assert (weights == 0).any() == (a == 2.0)


def test_discrepancy_metrics_and_the_all_uniform_case() -> None:
    # Uniform clients have zero discrepancy in every metric (KL: all zeros, not 0/0).
    uniform = np.full((3, 4), 5)
    for metric in ("kl", "l1", "l2", "cosine"):
        np.testing.assert_allclose(discrepancy(uniform, metric), 0.0, atol=1e-12)
    np.testing.assert_allclose(discrepancy(COUNTS[[1]], "l1"), [1.5])
    np.testing.assert_allclose(disco_weights(SIZES[:1] * 0 + 1, uniform[:1]), [1.0])


def test_server_downweights_the_client_whose_labels_diverge() -> None:
    # Prepare: clients 0 and 1 hold 100 samples each; client 0 is balanced, client 1 has one class.
    rng = np.random.default_rng(0)
    models = rng.normal(size=(4, 4)).astype(np.float32)
    server = FedDiscoServer(FedDiscoParams(), _spec(), {"m": np.zeros(4, np.float32)})
    # Execute
    server.aggregate(RoundContext(0, 0, 0.1, np.arange(4)), _uploads(models))
    # Assert: the aggregate uses the rule's weights; the one-class client gets less than its size share
    # (100/340) and less than the balanced client of the same size.
    weights = _direct_weights(COUNTS, 0.5, 0.1)
    np.testing.assert_allclose(server.global_vector, weights @ models, rtol=1e-5)
    assert weights[1] < SIZES[1] / SIZES.sum() < weights[0]


def test_feddisco_weights_start_fedawa(tmp_path) -> None:
    # Prepare: FedAWA (code fidelity: logits start at the initial weights) with a negligible Adam step.
    params = FedAWAParams(initial_weights="feddisco", server_lr=1e-12)
    server = FedAWAServer(params, _spec(), {"m": np.zeros(4, np.float32)})
    rng = np.random.default_rng(1)
    # Execute
    server.aggregate(RoundContext(0, 0, 0.1, np.arange(4)), _uploads(rng.normal(size=(4, 4)).astype(np.float32)))
    # Assert: every client's logit is its FedDisco weight (all 4 clients at hand: scale M/N = 1).
    np.testing.assert_allclose(server.client_state[0], _direct_weights(COUNTS, 0.5, 0.1), rtol=1e-6)
    assert (
        server.broadcast().send_label_counts
        and not FedAWAServer(FedAWAParams(), _spec(), {"m": np.zeros(4, np.float32)}).broadcast().send_label_counts
    )


@pytest.mark.parametrize(
    ("name", "extra"), [("feddisco", {}), ("fedawa", {"algorithm.params.initial_weights": "feddisco"})]
)
def test_partial_participation_runs_and_uploads_count_the_histogram(tmp_path, name: str, extra: dict) -> None:
    # Prepare: 6 clients, half per round.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": name,
                "data.num_clients": 6,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 900},
                "engine.join_ratio": 0.5,
                **extra,
            },
        )
    )
    sim = Simulation(config)
    size, k = next(iter(sim.initial.values())).size, sim.spec.num_classes
    # Execute
    result = sim.run()
    # Assert: a whole state (or client vector), id, size and K int64 label counts up; the state down.
    sampled = [c for c in pq.read_table(tmp_path / "run" / "clients").to_pylist() if c["sampled"]]
    assert len(sampled) == 6 and all(np.isfinite(result.accuracies))
    assert all(c["bytes_up"] == 4 * size + 16 + 8 * k and c["bytes_down"] == 4 * size for c in sampled)
