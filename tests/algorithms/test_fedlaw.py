"""FedLAW: γ and λ learnt on the server's proxy set through a functional forward of the merged model."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

from rayfed import RunConfig
from rayfed.algorithms import ClientVectors, RoundContext
from rayfed.algorithms.fedlaw import FedLAWParams, learn_aggregation, merge, merged_forward, proxy_loss
from rayfed.engine import Simulation, run
from rayfed.train.flat import FlatModel
from tests.conftest import tiny_overrides


def _small_cnn() -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 4)))


def test_merged_forward_equals_loading_gamma_times_weighted_average() -> None:
    # Prepare: three client states of a conv net with BatchNorm buffers; λ = softmax(z), γ = exp(s).
    flat = _small_cnn()
    p, size = flat.layout.size, flat.state_size
    generator = torch.Generator().manual_seed(1)
    thetas = torch.randn(3, size, generator=generator)
    thetas[:, p + 3 :] = thetas[:, p + 3 :].abs() + 0.5  # running variances must be positive
    z, s = torch.tensor([0.2, -1.0, 0.5]), torch.tensor(-0.3)
    x = torch.randn(5, 1, 6, 6, generator=generator)
    # Execute
    merged = merge(thetas, z, s, p)
    out = merged_forward(flat, merged, x)
    # Assert: the merge is γ Σ λ θ on parameters and Σ λ b on buffers, and the functional forward
    # equals the module's own forward with that state loaded (channels-last kernels included).
    lam = np.exp(z.numpy()) / np.exp(z.numpy()).sum()
    direct = lam @ thetas.numpy()
    direct[:p] *= np.exp(-0.3)
    np.testing.assert_allclose(merged.numpy(), direct, rtol=1e-5, atol=1e-6)
    flat.load_state(merged)
    flat.module.eval()
    torch.testing.assert_close(out, flat.module(x))


def test_the_client_whose_model_fits_the_proxy_set_gets_the_weight() -> None:
    # Prepare: a linear classifier on 2-D points; client 0 holds the right separator, clients 1-2 wrong ones.
    flat = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(2, 2)))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 1, 1, 2, generator=generator)
    y = (x[:, 0, 0, 0] > 0).long()
    good = torch.tensor([-4.0, 0.0, 4.0, 0.0, 0.0, 0.0])  # logit_1 - logit_0 = 8 x_0
    thetas = torch.stack([good, -good, torch.tensor([0.0, 4.0, 0.0, -4.0, 0.0, 0.0])])
    sizes = np.array([10.0, 45.0, 45.0])  # the good client starts with the smallest weight
    params = FedLAWParams(server_lr=0.05, server_epochs=30, proxy_batch_size=50)
    # Execute
    lam, gamma, loss = learn_aggregation(flat, thetas, sizes, x, y, params, torch.Generator().manual_seed(0))
    # Assert: its weight grows from 0.1 to dominate, and the proxy loss falls below FedAvg's starting point.
    start = proxy_loss(
        flat, thetas, torch.log(torch.tensor(sizes / sizes.sum(), dtype=torch.float32)), torch.zeros(()), x, y
    )
    assert lam[0] > 0.8 and abs(float(lam.sum()) - 1) < 1e-5
    assert loss < float(start) and gamma > 0


def test_fedlaw_starts_from_fedavg_and_moves_away_with_server_epochs(tmp_path) -> None:
    # Prepare: a FedLAW server whose z, s stay at their initial values (server_epochs=0), and two uploads.
    law = {"algorithm.name": "fedlaw", "algorithm.params": {"proxy_size": 100, "server_epochs": 0}}
    sim = Simulation(RunConfig().override(tiny_overrides(tmp_path / "zero", **law)))
    server = sim.algorithm.make_server(sim.spec, sim.initial)
    rng = np.random.default_rng(0)
    v1, v2 = (rng.standard_normal(len(server.global_vector)).astype(np.float32) for _ in range(2))
    ctx = RoundContext(round=0, seed=0, lr=0.1, sampled=np.arange(2))
    # Execute
    metrics = server.aggregate(ctx, ClientVectors.of(v1, 0, 10) + ClientVectors.of(v2, 1, 30))
    learnt = run(
        RunConfig().override(
            tiny_overrides(
                tmp_path / "learnt",
                **{**law, "algorithm.params": {"proxy_size": 100, "server_epochs": 5, "server_lr": 0.05}},
            )
        )
    )
    # Assert: γ = 1 and λ = n_k / Σn are FedAvg's aggregate (the paper's starting point); with
    # server epochs the learnt shrink factor moves off 1 every round, and the time is recorded.
    assert metrics["fedlaw_gamma"] == 1.0
    np.testing.assert_allclose(server.global_vector, (10 * v1 + 30 * v2) / 40, rtol=1e-5, atol=1e-6)
    assert all(r["server_fedlaw_gamma"] != 1.0 for r in learnt.history)
    assert all(np.isfinite(r["server_fedlaw_seconds"]) for r in learnt.history)


def test_fedlaw_bytes_and_partial_participation(tmp_path) -> None:
    # Prepare: half the clients per round.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "fedlaw",
                "algorithm.params": {"proxy_size": 100, "server_epochs": 2},
                "engine.join_ratio": 0.5,
                "data.partition": "dirichlet",
            },
        )
    )
    # Execute
    sim = Simulation(config)
    result = sim.run()
    # Assert: whole model down; whole model + client id (int64) + size (float64) up; 5 of 10 aggregated.
    state_bytes = sim.initial[sim.spec.default_architecture].nbytes
    clients = [c for c in pq.read_table(tmp_path / "run" / "clients").to_pylist() if c["sampled"]]
    assert clients and all(c["bytes_down"] == state_bytes and c["bytes_up"] == state_bytes + 16 for c in clients)
    assert [r["server_clients_aggregated"] for r in result.history] == [5.0, 5.0]


def test_learning_runs_through_batchnorm_statistics_as_constants() -> None:
    # Prepare: λ and γ learnable, as in learn_aggregation; the model has BatchNorm running statistics.
    flat = _small_cnn()
    thetas = torch.from_numpy(np.stack([flat.state_numpy()] * 2))
    z, s = torch.zeros(2, requires_grad=True), torch.zeros((), requires_grad=True)
    # Execute: BatchNorm is not differentiable in its running statistics; the loss must still back-propagate.
    proxy_loss(flat, thetas, z, s, torch.randn(4, 1, 6, 6), torch.tensor([0, 1, 2, 3])).backward()
    # Assert
    assert s.grad is not None and torch.isfinite(s.grad) and z.grad is not None


def test_code_batchnorm_mode_trains_on_batch_statistics_and_keeps_the_servers_own() -> None:
    # Prepare: two client states of a conv net with BatchNorm; the server's running statistics start
    # at the initial model's (mean 0, variance 1), as the authors' central model.
    flat = _small_cnn()
    p = flat.layout.size
    state = torch.from_numpy(flat.state_numpy())
    thetas = torch.stack([state, state + 0.01])
    server_buffers = state[p:].clone()
    x, y = torch.randn(20, 1, 6, 6) * 3 + 2, torch.randint(0, 4, (20,))
    params = FedLAWParams(server_lr=0.01, server_epochs=2, proxy_batch_size=10)
    # Execute
    lam, gamma, loss = learn_aggregation(
        flat, thetas, np.array([1.0, 1.0]), x, y, params, torch.Generator().manual_seed(0), server_buffers
    )
    # Assert: the forward ran in training mode (the server's statistics moved towards the proxy data's)
    # and the learnt weights are finite.
    assert not torch.allclose(server_buffers, state[p:]) and torch.isfinite(server_buffers).all()
    assert torch.isfinite(lam).all() and float(gamma) > 0 and np.isfinite(loss)
    assert FedLAWParams().proxy_batch_size == 128 and FedLAWParams().batchnorm == "code"
