"""FedDyn: the server step, the client's linear and quadratic terms, the per-client gradient state."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import RunConfig
from rayfed.algorithms import RoundContext, WeightedSum, sum_contributions
from rayfed.algorithms.feddyn import GRAD_KEY, FedDynClient, FedDynModel, FedDynParams, FedDynServer
from rayfed.algorithms.sizing import parameter_bytes
from rayfed.config import TrainConfig
from rayfed.engine import Simulation
from rayfed.engine.callbacks import Callback
from rayfed.models import block_names, build_model, output_layer_name
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from rayfed.train.stack_layout import logical_rows
from tests.algorithms.read_back import settled
from tests.conftest import client_job, tiny_overrides, train_client

LAYOUT = ParamLayout(("w", "b"), ((2, 2), (2,)), (0, 4, 6))
BUFFERS = ParamLayout(("running_mean",), ((2,),), (0, 2))


def _spec(num_clients: int) -> ProblemSpec:
    return ProblemSpec(
        num_clients,
        2,
        (1, 1, 2),
        {"m": LAYOUT},
        {"m": ("w",)},
        {"m": "w"},
        default_architecture="m",
        buffer_layouts={"m": BUFFERS},
    )


def test_server_step_matches_algorithm_1_with_m_all_clients() -> None:
    # Prepare: 10 clients in all, 3 of them upload in each of two rounds.
    rng = np.random.default_rng(0)
    theta = rng.normal(size=8).astype(np.float32)
    alpha = 0.1
    server = FedDynServer(FedDynParams(alpha=alpha, fidelity="paper"), _spec(10), {"m": theta})
    h, expected = np.zeros(6), theta.astype(np.float64)
    for _ in range(2):
        models = rng.normal(size=(3, 8))
        h = h - alpha * (models[:, :6] - expected[:6]).sum(axis=0) / 10
        expected = np.concatenate([models[:, :6].mean(axis=0) - h / alpha, models[:, 6:].mean(axis=0)])
        # Execute: unweighted uploads (weight 1 each, whatever the clients' sizes).
        upload = sum_contributions(WeightedSum.of(x.astype(np.float32), 1.0) for x in models)
        server.aggregate(RoundContext(0, 0, 0.1, np.array([1, 4, 7])), upload)
        # Assert
        np.testing.assert_allclose(server.global_vector, expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(server.h, h, rtol=1e-4, atol=1e-6)


def _conv_job(state: dict[str, np.ndarray] | None) -> tuple[ClientJob, ProblemSpec]:
    """A cnn4 client (convolution kernels are stored channels-last in the flat vector) with 40 samples."""
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn4", (1, 28, 28), 10))
    spec = ProblemSpec(
        4,
        10,
        (1, 28, 28),
        {"cnn4": flat.layout},
        {"cnn4": tuple(block_names(flat.module))},
        {"cnn4": output_layer_name(flat.module)},
        default_architecture="cnn4",
        buffer_layouts={"cnn4": flat.buffer_layout},
    )
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, 1, 28, 28, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    train = TrainConfig(lr=0.05, batch_size=10)
    job = client_job(flat, x, y, train=train, architecture="cnn4", generator=gen, num_classes=10, state=state)
    return job, spec


@pytest.mark.parametrize("fidelity", ["paper", "code"])
def test_client_term_gradient_is_the_drift_term_minus_the_stored_gradient(fidelity: str) -> None:
    # Prepare: a stored gradient state in flat-vector order, and the model moved away from its start.
    g = np.random.default_rng(2).normal(size=FlatModel(build_model("cnn4", (1, 28, 28), 10)).size).astype(np.float32)
    job, spec = _conv_job({GRAD_KEY: g})
    half = FedDynClient(FedDynParams(alpha=0.3, fidelity=fidelity), spec)
    (phase,) = half.phases(FedDynModel(job.flat.state_numpy(), 0.3), job)
    start = job.flat.vector.detach().clone()
    constants = {**phase.constants, "start": logical_rows(start.unsqueeze(0), job.flat.layout)[0]}  # as the loop
    with torch.no_grad():
        job.flat.vector.add_(torch.randn(job.flat.size, generator=torch.Generator().manual_seed(4)))
    # Execute
    job.flat.zero_grad()
    half.dynamic(None, None, job.flat.params, constants).backward()  # type: ignore[arg-type]
    # Assert, in the flat vector's own order: paper, ∂/∂θ [−⟨g, θ⟩ + (α/2)‖θ − θ_start‖²] = −g + α(θ − θ_start);
    # code (the baseline code's unsquared norm), ∂/∂θ [−⟨g, θ⟩ + (α/2)‖θ − θ_start‖] = −g + (α/2) u,
    # u = (θ − θ_start)/‖θ − θ_start‖.
    drift = job.flat.vector.detach() - start
    pull = 0.3 * drift if fidelity == "paper" else 0.15 * drift / torch.linalg.vector_norm(drift)
    torch.testing.assert_close(job.flat.grad, -torch.from_numpy(g) + pull, rtol=1e-4, atol=1e-5)
    assert "start" not in phase.constants  # the loop adds the round's start itself
    assert (phase.optimizer.keep_momentum == "momentum") == (fidelity == "code")


def test_the_gradient_state_pulls_local_training_along_it_and_is_updated() -> None:
    # Prepare: the same client and start, with a zero and a nonzero gradient state.
    job, spec = _conv_job(None)
    g = 1e-3 * np.random.default_rng(5).normal(size=job.flat.size).astype(np.float32)
    half, start = FedDynClient(FedDynParams(alpha=0.01, fidelity="paper"), spec), job.flat.state_numpy().copy()
    trained = []
    for state in (None, {GRAD_KEY: g}):
        job, _ = _conv_job(state)
        message = FedDynModel(start, 0.01)
        # Execute
        train_client(half, message, job)
        upload = settled(half.upload(message, job), job)
        trained.append(job.flat.vector.detach().numpy().copy())
        # Assert: the state becomes ∇L_k − α(θ_k − θ_g); the upload is θ_k with weight 1.
        theta_k = job.flat.state_numpy()
        expected = (g if state else 0) - 0.01 * (theta_k[: job.flat.size] - start[: job.flat.size])
        np.testing.assert_allclose(job.state[GRAD_KEY], expected, rtol=1e-5, atol=1e-7)
        assert upload.weight == 1.0 and upload.count == 1
    # Under ``code`` the upload is weighted by n_k.
    assert settled(half.upload(FedDynModel(start, 0.01, size_weighted=True), job), job).weight == 40.0
    # The linear term −⟨g, θ⟩ adds −g to every step's gradient, so the model moves along +g: the
    # difference of the two runs points along g (4 SGD steps of lr 0.05: about 0.2·g).
    shift = trained[1] - trained[0]
    assert float(shift @ g) / (np.linalg.norm(shift) * np.linalg.norm(g)) > 0.9


class _StateIds(Callback):
    def __init__(self) -> None:
        self.ids: list[set[int]] = []

    def after_round(self, run, record, clients) -> bool:
        self.ids.append({cid for cid, _ in run.client_states()})
        return False


def test_partial_participation_only_sampled_clients_keep_a_gradient_state(tmp_path) -> None:
    # Prepare: 6 clients, half per round.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "feddyn",
                "data.num_clients": 6,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 900},
                "engine.join_ratio": 0.5,
            },
        )
    )
    size = next(iter(Simulation(config).initial.values())).size
    ids = _StateIds()
    # Execute
    result = Simulation(config, callbacks=[ids]).run()
    # Assert: after round 0 only its 3 sampled clients hold a state; bytes are the whole state.
    sampled = [c for c in pq.read_table(tmp_path / "run" / "clients").to_pylist() if c["sampled"]]
    first = {c["client_id"] for c in sampled if c["round"] == 0}
    assert len(first) == 3 and ids.ids[0] == first and all(np.isfinite(result.accuracies))
    assert all(c["bytes_up"] == 4 * size + 8 and c["bytes_down"] == 4 * size for c in sampled)


def test_code_fidelity_server_step_is_the_baseline_codes_size_weighted_one() -> None:
    # Prepare: 10 clients in all, 3 upload with sizes 10, 30, 60 (ZexiLee/ICML-2023-FedLAW server_funct.feddyn).
    rng = np.random.default_rng(0)
    theta = rng.normal(size=8).astype(np.float32)
    alpha, sizes = 0.1, np.array([10.0, 30.0, 60.0])
    server = FedDynServer(FedDynParams(alpha=alpha), _spec(10), {"m": theta})
    h, expected = np.zeros(6), theta.astype(np.float64)
    for _ in range(2):
        models = rng.normal(size=(3, 8))
        w = sizes / sizes.sum()
        h = h - alpha * (w @ (models[:, :6] - expected[:6]))
        expected = np.concatenate([w @ models[:, :6] - h / alpha, w @ models[:, 6:]])
        # Execute
        upload = sum_contributions(WeightedSum.of(x.astype(np.float32), n) for x, n in zip(models, sizes))
        server.aggregate(RoundContext(0, 0, 0.1, np.array([1, 4, 7])), upload)
        # Assert
        np.testing.assert_allclose(server.global_vector, expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(server.h, h, rtol=1e-4, atol=1e-6)


def test_client_state_counts_the_momentum_buffer_under_code_with_momentum() -> None:
    spec = _spec(10)
    one, momentum = parameter_bytes(spec), TrainConfig(momentum=0.9)  # the gradient state: parameters only
    assert FedDynServer.client_state_bytes(FedDynParams(), spec, momentum) == 2 * one
    assert FedDynServer.client_state_bytes(FedDynParams(), spec, TrainConfig()) == one
    assert FedDynServer.client_state_bytes(FedDynParams(fidelity="paper"), spec, momentum) == one
