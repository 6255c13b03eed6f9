"""APPLE: the DR-vector gradient, copies of every core model in the client state, and the size check."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import ResourceError, RunConfig
from rayfed.algorithms.apple import (
    CORES_KEY,
    DR_KEY,
    OWN_KEY,
    VERSIONS_KEY,
    AppleClient,
    AppleParams,
    AppleServer,
    CoreModels,
    anneal,
    dr_gradient,
    lagged_anneal,
    personal_model,
    tensor_mean_weights,
)
from rayfed.config import TrainConfig
from rayfed.engine import Simulation
from rayfed.engine.callbacks import Callback
from rayfed.engine.sizing import client_states_bytes
from rayfed.train.layout import ParamLayout
from tests.algorithms.read_back import settled
from tests.algorithms.tiny_problem import tiny_job, tiny_problem
from tests.conftest import tiny_overrides, train_client


class ClientCopies(Callback):
    """``rounds[t][cid]``: (copies, p_i) each client holds after round t (its own row: the core it trained, which it
    keeps beside the copies), and the server's core models."""

    def __init__(self) -> None:
        self.rounds: list[dict[int, tuple[np.ndarray, np.ndarray]]] = []
        self.server: list[np.ndarray] = []

    def after_round(self, run, record, clients) -> bool:
        held = {}
        for cid, state in run.client_states():
            cores = np.array(state[CORES_KEY])
            cores[cid] = state[OWN_KEY]
            held[cid] = (cores, np.array(state[DR_KEY]))
        self.rounds.append(held)
        self.server.append(np.array(run.server_state()["cores"]))
        return False


def _config(tmp_path, **extra: object) -> RunConfig:
    return RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "apple",
                "data.num_clients": 5,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 750},
                **extra,
            },
        )
    )


def test_the_dr_gradient_is_the_chain_rule_through_the_personal_model() -> None:
    # Arrange: φ = Σ_j p_j θ_j of 4 core models, a loss on φ, the proximal term (λμ/2)‖p − p0‖².
    torch.manual_seed(0)
    theta = torch.randn(4, 9, dtype=torch.float64)
    p = torch.tensor([0.4, 0.1, 0.3, 0.2], dtype=torch.float64, requires_grad=True)
    p0 = torch.full((4,), 0.25, dtype=torch.float64)
    target, lam_mu = torch.randn(9, dtype=torch.float64), 0.07
    # Act: autograd, and the step's formula from ∇_φ L.
    phi = (p @ theta).detach().requires_grad_(True)
    loss_phi = ((phi - target) ** 2).sum() + phi.sin().sum()
    (grad_phi,) = torch.autograd.grad(loss_phi, phi)
    full = ((p @ theta - target) ** 2).sum() + (p @ theta).sin().sum() + 0.5 * lam_mu * ((p - p0) ** 2).sum()
    (expected,) = torch.autograd.grad(full, p)
    got = dr_gradient(theta, grad_phi, p.detach(), p0, lam_mu)
    # Assert
    torch.testing.assert_close(got, expected)
    # PFLlib's scaling: the mean over tensors of each tensor's mean of ∇_φ L ⊙ θ_j.
    layout = ParamLayout.of([("a", torch.zeros(2, 3)), ("b", torch.zeros(3))])
    c = torch.from_numpy(tensor_mean_weights(layout)).double()
    direct = torch.stack([((grad_phi * t)[:6].mean() + (grad_phi * t)[6:].mean()) / 2 for t in theta])
    torch.testing.assert_close(dr_gradient(theta, grad_phi, p.detach(), p0, 0.0, c), direct)


@pytest.mark.parametrize("fidelity", ["pfllib_parallel", "paper"])
def test_p0_is_each_clients_share_of_the_training_data(tmp_path, fidelity: str) -> None:
    # Arrange: a Dirichlet partition, so the clients' sizes differ and 1/M is not their share.
    sim = Simulation(_config(tmp_path, **{"algorithm.params": {"fidelity": fidelity}}))
    sizes = sim.partition.num_train()
    assert len(set(sizes.tolist())) > 1
    # Act
    broadcast = AppleServer(AppleParams(fidelity=fidelity), sim.spec, sim.initial).broadcast()
    # Assert: p⁽⁰⁾_j = n_j / Σ n; p_i starts at 1/M (PFLlib) or at p⁽⁰⁾ (the authors' code).
    np.testing.assert_allclose(broadcast.p0, sizes / sizes.sum())
    start = np.full(5, 0.2) if fidelity == "pfllib_parallel" else sizes / sizes.sum()
    np.testing.assert_allclose(broadcast.start, start)
    assert sim.spec.for_clients().train_sizes is None  # the workers do not get every client's size


def test_the_proximal_weight_is_cosine_annealed_until_round_l_r() -> None:
    assert anneal(0, 100, 0.2) == 1.0
    assert anneal(10, 100, 0.2) == pytest.approx(0.5)
    assert anneal(5, 100, 0.2) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert anneal(20, 100, 0.2) == anneal(99, 100, 0.2) == 0.0
    # PFLlib sets λ after a round's training: round r runs with λ(r − 1), round 0 with 1; L·R truncated.
    assert lagged_anneal(0, 100, 0.2) == lagged_anneal(1, 100, 0.2) == 1.0
    assert lagged_anneal(11, 100, 0.2) == pytest.approx(0.5)
    assert lagged_anneal(21, 100, 0.2) == 0.0
    assert lagged_anneal(3, 12, 0.2) == anneal(2, 2, 1.0) == 0.0  # int(0.2 · 12) = 2 rounds, not 2.4


def _one_step_of_client_1(fidelity: str):  # noqa: ANN202
    """Client 1 of 3 holding copies of the core models and p_1, trained one full-batch step (round 0, so λ = 1);
    returns the client half, the job, the copies, p_1, p⁽⁰⁾ and ∇_φ L at φ_1 = Σ_j p_j θ_j (float64)."""
    flat, spec = tiny_problem(3, 2, "apple")
    train = TrainConfig(lr=0.1, batch_size=8, drop_last=False)
    job = tiny_job(flat, 1, [5, 3], train)
    rng = np.random.default_rng(0)
    cores = rng.normal(size=(3, flat.size)).astype(np.float32)
    p, p0 = np.array([0.2, 0.5, 0.3]), np.array([0.3, 0.3, 0.4])
    job.state = {CORES_KEY: cores.copy(), DR_KEY: p.copy(), VERSIONS_KEY: np.zeros(3, np.int64)}
    # No copy is stale (every version 0), so the client mixes its own copies.
    message = CoreModels(
        rng.normal(size=(3, flat.size)).astype(np.float32),
        np.zeros(3, np.int64),
        flat.size,
        cores[0],
        p0,
        np.full(3, 1 / 3),
    )
    client = AppleClient(AppleParams(dr_lr=0.05, mu=0.1, anneal_rounds=100, fidelity=fidelity), spec)
    # Act
    train_client(client, message, job)
    # ∇_φ L at φ_1, computed here.
    phi = torch.from_numpy(p @ cores.astype(np.float64)).float()
    np.testing.assert_allclose(job.start.model, phi.numpy(), rtol=1e-6)  # the start is φ_1
    trained = flat.numpy()
    flat.vector.data.copy_(phi)
    flat.zero_grad()
    torch.nn.functional.cross_entropy(job.model(job.x_train), job.y_train).backward()
    return client, message, job, cores, p, p0, flat.grad.double(), phi, trained


def test_pfllib_parallel_steps_the_core_first_and_shares_the_personal_model_of_its_last_step() -> None:
    client, message, job, cores, p, p0, grad, phi, _ = _one_step_of_client_1("pfllib_parallel")
    # Assert: θ_1 moved by η·M·p_11·∇_φ L, then p stepped with ⟨∇ ⊙ c, θ_j⟩ at the moved θ_1 and λ = 1 (round 0);
    # the core it keeps and shares is φ of its step, Σ_j p_j θ_j before the move.
    moved = torch.from_numpy(cores).double()
    moved[1] -= 0.1 * 3 * 0.5 * grad
    weights = torch.from_numpy(tensor_mean_weights(job.flat.layout)).double()
    expected_p = p - 0.05 * dr_gradient(moved, grad, torch.from_numpy(p), torch.from_numpy(p0), 0.1, weights).numpy()
    np.testing.assert_allclose(job.extra["p"].numpy(), expected_p, rtol=1e-5)
    np.testing.assert_allclose(job.extra["core"].numpy(), phi.numpy(), rtol=1e-6)
    # Uploaded and kept: that core (its own, beside the copies it holds), and the new p_1.
    upload = settled(client.upload(message, job), job)
    np.testing.assert_allclose(upload.matrix()[0], phi.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(job.state[OWN_KEY], job.extra["core"].numpy())
    np.testing.assert_array_equal(job.state[CORES_KEY], cores)
    np.testing.assert_allclose(job.state[DR_KEY], expected_p, rtol=1e-5)


def test_paper_steps_core_and_p_by_their_gradients_at_the_same_point() -> None:
    client, message, job, cores, p, p0, grad, phi, trained = _one_step_of_client_1("paper")
    # Assert: θ_1 ← θ_1 − η1 p_11 ∇_φ L (η1 = train.lr) and p ← p − η2 (⟨∇_φ L, θ_j⟩ + λμ (p − p⁽⁰⁾)), both at the
    # step's start; the model left is the personal model after the step, Σ_j p'_j θ'_j.
    moved = torch.from_numpy(cores).double()
    moved[1] -= 0.1 * 0.5 * grad
    theta = torch.from_numpy(cores).double()
    expected_p = p - 0.05 * dr_gradient(theta, grad, torch.from_numpy(p), torch.from_numpy(p0), 0.1).numpy()
    np.testing.assert_allclose(job.extra["core"].numpy(), moved[1].numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(job.extra["p"].numpy(), expected_p, rtol=1e-5)
    np.testing.assert_allclose(trained, (torch.from_numpy(expected_p) @ moved).numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(trained, phi.numpy())
    upload = settled(client.upload(message, job), job)
    np.testing.assert_allclose(upload.matrix()[0], moved[1].numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("join_ratio", [1.0, 0.6])
def test_clients_keep_copies_learn_p_and_download_only_newer_core_models(tmp_path, join_ratio) -> None:
    # Arrange: 5 clients, 3 rounds; with join_ratio 0.6, 3 per round (stale copies).
    copies = ClientCopies()
    config = _config(
        tmp_path, **{"engine.join_ratio": join_ratio, "train.rounds": 3, "algorithm.params": {"fidelity": "paper"}}
    )
    # Act
    Simulation(config, callbacks=[copies]).run()
    # Assert: a trained client's own copy is the core model it uploaded; p_i moved off 1/M.
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    sampled = [c for c in clients if c["sampled"]]
    size = copies.server[0].shape[1] * 4
    for t, held in enumerate(copies.rounds):
        for cid, (cores, p) in held.items():
            assert cores.shape == (5, copies.server[0].shape[1])
            if any(c["client_id"] == cid and c["round"] == t for c in sampled):
                np.testing.assert_array_equal(cores[cid], copies.server[t][cid])
                assert not np.allclose(p, 0.2)
    # Bytes: one core model up; down, the other clients' core models newer than the client's copies,
    # a copy being as new as the server's model when the client last trained (version = upload round + 1).
    rounds_of = {cid: [c["round"] for c in sampled if c["client_id"] == cid] for cid in range(5)}

    def version(j: int, t: int) -> int:
        return max((r + 1 for r in rounds_of[j] if r < t), default=0)

    for c in sampled:
        cid, t = c["client_id"], c["round"]
        before = [r for r in rounds_of[cid] if r < t]
        newer = sum(1 for j in range(5) if j != cid and version(j, t) > (version(j, max(before)) if before else 0))
        assert c["bytes_up"] == size + 16
        assert c["bytes_down"] == newer * size, c
    if join_ratio == 1.0:
        assert [c["bytes_down"] for c in sampled if c["round"] == 2] == [4 * size] * 5


def test_the_personal_model_mixes_parameters_and_keeps_its_own_buffers() -> None:
    cores = np.arange(12, dtype=np.float32).reshape(3, 4)  # 3 parameters, then 1 buffer
    p = np.array([0.5, 0.25, 0.25])
    np.testing.assert_allclose(personal_model(cores, p, 1, 3), [3.0, 4.0, 5.0, 7.0])


def test_a_run_whose_client_states_fit_neither_memory_nor_disk_is_refused_before_any_file(tmp_path, monkeypatch):
    # Arrange: 300 clients each keeping 300 models; 1 MiB of state memory and 10 MiB of free disk.
    config = _config(
        tmp_path, **{"data.num_clients": 300, "data.options": {"num_samples": 3000}, "engine.client_state_memory_mb": 1}
    )
    per_client, total = client_states_bytes(config)
    monkeypatch.setattr("rayfed.engine.sizing.free_disk", lambda path: 10 * 2**20)
    # Act / Assert
    with pytest.raises(ResourceError) as raised:
        Simulation(config)
    message = str(raised.value)
    for fragment in (
        "algorithm.name='apple'",
        "data.num_clients=300",
        "engine.client_state_memory_mb=1",
        "lower data.num_clients",
        "run_dir",
    ):
        assert fragment in message
    assert total == 300 * per_client and per_client > 300 * 4 * 1000
    assert not (tmp_path / "run").exists()
    # With room on the disk, the same config passes the check (and the memory estimate counts the cap).
    monkeypatch.setattr("rayfed.engine.sizing.free_disk", lambda path: 2 * total)
    from rayfed.engine.sizing import check_client_states, estimate_memory

    check_client_states(config, tmp_path / "run")
    parts = {part.name: part.bytes for part in estimate_memory(config).parts}
    assert parts["client state store"] == 2**20
