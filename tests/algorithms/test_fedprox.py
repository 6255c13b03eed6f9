"""FedProx: FedAvg's server, and clients whose local steps add the pull μ(w − w_g) towards the round's global model
(Eq. 2); its phases, lent to another server half, train the same objective."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rayfed import ConfigError, RunConfig
from rayfed.algorithms import resolve
from rayfed.algorithms.borrowed import BorrowedTraining
from rayfed.algorithms.common.global_model import GlobalModel
from rayfed.algorithms.fedawa import FedAWAModel
from rayfed.algorithms.fedprox import FedProxClient, FedProxParams
from rayfed.train.stack_layout import logical_rows
from tests.algorithms.body_head_cases import full_batch_gradient, job, tiny_problem
from tests.algorithms.read_back import settled
from tests.conftest import train_client

torch.set_num_threads(1)


def _two_steps(flat, client, w_g: np.ndarray, mu: float, lr: float) -> np.ndarray:  # noqa: ANN001
    """Two local steps w ← w − η(∇F(w) + μ(w − w_g)) from w_g: the first has no pull (w = w_g), the second does."""
    w = w_g - lr * full_batch_gradient(flat, client, w_g)
    return w - lr * (full_batch_gradient(flat, client, w) + mu * (w - w_g))


def test_a_local_step_is_pulled_towards_the_rounds_global_model() -> None:
    # Prepare: the global model w_g; one full batch, so each of the 2 epochs is one step.
    flat, spec = tiny_problem()
    w_g, message = flat.numpy(), GlobalModel(flat.state_numpy())
    client = job(flat, 0, lr=0.5, local_epochs=2)
    expected = _two_steps(flat, client, w_g, mu=2.0, lr=0.5)
    plain = _two_steps(flat, client, w_g, mu=0.0, lr=0.5)  # FedAvg's steps
    assert np.abs(expected - plain).max() > 1e-2  # the pull is large enough to tell apart
    half = FedProxClient(FedProxParams(mu=2.0), spec)
    # Execute
    _, steps = train_client(half, message, client)
    upload = settled(half.upload(message, client), client)
    # Assert: w − η(∇F(w) + μ(w − w_g)) at every step; the trained model is FedAvg's upload, weighted by n_k.
    assert steps == 2
    np.testing.assert_allclose(flat.numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(upload.average(), expected, rtol=1e-5, atol=1e-6)
    assert (upload.weight, upload.count) == (12.0, 1)
    # The term itself is (μ/2)‖w − w_g‖², w_g the round's start in the loop's logical order.
    anchor = logical_rows(torch.from_numpy(w_g)[None], flat.layout)[0]
    term = half.proximal(None, None, list(flat.params), {"start": anchor})  # type: ignore[arg-type]
    assert float(term.detach()) == pytest.approx(1.0 * float(np.sum((flat.numpy() - w_g) ** 2)), rel=1e-5)


def test_mu_zero_is_fedavg_and_a_negative_mu_is_refused() -> None:
    # Prepare
    flat, spec = tiny_problem()
    client = job(flat, 1, lr=0.5, local_epochs=2)
    w_g, message = flat.numpy(), GlobalModel(flat.state_numpy())
    expected = _two_steps(flat, client, w_g, mu=0.0, lr=0.5)
    half = FedProxClient(FedProxParams(mu=0.0), spec)
    # Execute
    (phase,) = half.phases(message, client)
    train_client(half, message, client)
    # Assert: FedAvg's phase (no loss term) and its steps.
    assert phase.loss is None and phase.epochs == 2
    np.testing.assert_allclose(flat.numpy(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match=re.escape("algorithm.params.mu must be a finite number >= 0")):
        RunConfig().override({"algorithm.name": "fedprox", "algorithm.params.mu": -0.1})


def test_borrowed_fedprox_phases_train_the_same_proximal_objective_under_another_server_half() -> None:
    # Prepare: FedAWA's server and client, training FedProx's phases (algorithm.client="fedprox").
    flat, spec = tiny_problem()
    config = RunConfig().override(
        {"algorithm.name": "fedawa", "algorithm.client": "fedprox", "algorithm.client_params": {"mu": 2.0}}
    )
    resolved = resolve(config.algorithm)
    server, half = resolved.make_server(spec, {"tiny": flat.state_numpy()}), resolved.make_client(spec)
    message = server.broadcast()
    assert isinstance(half, BorrowedTraining) and isinstance(half.training, FedProxClient)
    assert isinstance(message, FedAWAModel)
    client = job(flat, 2, lr=0.5, local_epochs=2)
    w_g = message.vector[: flat.size]
    expected = _two_steps(flat, client, w_g, mu=2.0, lr=0.5)
    assert np.abs(expected - _two_steps(flat, client, w_g, mu=0.0, lr=0.5)).max() > 1e-2
    # Execute
    _, steps = train_client(half, message, client)
    trained = flat.state_numpy()
    upload = settled(half.upload(message, client), client)
    # Assert: the proximal steps towards FedAWA's global model; FedAWA's own upload, τ_k = θ_k − θ_g.
    assert steps == 2
    np.testing.assert_allclose(trained[: flat.size], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(upload.matrix()[0], trained - message.vector, rtol=1e-5, atol=1e-6)
    assert upload.client_ids.tolist() == [2]
