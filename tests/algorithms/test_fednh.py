"""FedNH: the prototype update and class means against direct computations, the cosine head,
fixed prototypes in local training, and short end-to-end runs on the offline synthetic dataset."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from rayfed import ConfigError, RunConfig
from rayfed.algorithms import RoundContext, WeightedSum
from rayfed.algorithms.fednh import (
    FedNHClient,
    FedNHParams,
    FedNHServer,
    PrototypeSum,
    class_means,
    initial_prototypes,
    smooth_prototypes,
)
from rayfed.config import TrainConfig
from rayfed.engine import Simulation
from rayfed.execution.client_runner import ClientRunner
from rayfed.models.layers import normalize_inputs_of
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from tests.algorithms.client_states import ServerStates
from tests.algorithms.read_back import settled
from tests.algorithms.tiny_problem import tiny_job, tiny_problem
from tests.conftest import tiny_overrides, train_client

torch.set_num_threads(1)


# --- helpers ------------------------------------------------------------------------------------


def _tiny_problem(num_clients: int = 2) -> tuple[FlatModel, ProblemSpec]:
    return tiny_problem(num_clients, 3, algorithm="fednh")


def _job(flat: FlatModel, cid: int, counts: list[int]) -> ClientJob:
    return tiny_job(flat, cid, counts, TrainConfig(lr=0.5, batch_size=4, momentum=0.9, weight_decay=1e-3))


def _ctx(sampled: list[int], num_clients: int = 2) -> RoundContext:
    return RoundContext(round=0, seed=0, lr=0.1, sampled=np.array(sampled))


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


# --- the defining steps against direct computations ------------------------------------------------


def test_prototype_update_equals_direct_computation() -> None:
    # Prepare: 3 unit prototypes in 4-d; client A holds classes 0 and 1, client B classes 1 only;
    # class 2 is held by nobody.
    rng = np.random.default_rng(0)
    prototypes = initial_prototypes(3, 4, seed=1)
    feats_a, labels_a = rng.normal(size=(5, 4)), np.array([0, 0, 1, 1, 1])
    feats_b, labels_b = rng.normal(size=(2, 4)), np.array([1, 1])
    means = [class_means(torch.tensor(f), torch.tensor(y), 3) for f, y in ((feats_a, labels_a), (feats_b, labels_b))]
    assert [(m.dtype, n.dtype) for m, n in means] == [
        (torch.float32, torch.float64)
    ] * 2  # tensors, summed on the device
    uploads = [(m.numpy(), n.numpy()) for m, n in means]
    sums, counts = uploads[0][0] + uploads[1][0], uploads[0][1] + uploads[1][1]
    # Execute
    updated = smooth_prototypes(prototypes, sums, counts, rho=0.9)
    # Assert: μ_c ← normalise(ρμ_c + (1−ρ) normalise(Σ_k n_kc μ̂_kc / Σ_k n_kc)), μ̂_kc the unit mean of
    # client k's unit features of class c; the class without data keeps its prototype.
    unit_a = feats_a / np.linalg.norm(feats_a, axis=1, keepdims=True)
    unit_b = feats_b / np.linalg.norm(feats_b, axis=1, keepdims=True)
    mean_a0, mean_a1 = _unit(unit_a[:2].mean(0)), _unit(unit_a[2:].mean(0))
    mean_b1 = _unit(unit_b.mean(0))
    target0 = _unit(mean_a0)
    target1 = _unit((3 * mean_a1 + 2 * mean_b1) / 5)
    np.testing.assert_allclose(updated[0], _unit(0.9 * prototypes[0] + 0.1 * target0), atol=1e-6)
    np.testing.assert_allclose(updated[1], _unit(0.9 * prototypes[1] + 0.1 * target1), atol=1e-6)
    np.testing.assert_array_equal(updated[2], prototypes[2])
    np.testing.assert_allclose(counts, [2, 5, 0])
    np.testing.assert_allclose(uploads[0][0][0], 2 * mean_a0, atol=1e-6)


def test_initial_prototypes_are_unit_and_spread() -> None:
    # K <= h: orthonormal rows; K > h: unit rows spread further apart than random ones.
    few = initial_prototypes(5, 8, seed=0)
    np.testing.assert_allclose(few @ few.T, np.eye(5), atol=1e-6)
    many = initial_prototypes(12, 3, seed=0)
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, atol=1e-6)
    random = _unit_rows(np.random.default_rng(0).normal(size=(12, 3)))
    off = ~np.eye(12, dtype=bool)
    assert (many @ many.T)[off].max() < (random @ random.T)[off].max() - 0.05
    np.testing.assert_array_equal(initial_prototypes(5, 8, seed=0), few)  # reproducible from the seed


def _unit_rows(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_a_normalised_output_layer_gives_scaled_cosine_logits() -> None:
    # Prepare: output weight s·μ, zero bias.
    flat, _ = _tiny_problem()
    model = flat.module
    prototypes, s = initial_prototypes(3, 4, seed=3), 7.0
    with torch.no_grad():
        model.fc.weight.copy_(torch.tensor(s * prototypes))
        model.fc.bias.zero_()
    x = torch.randn(6, 3)
    # Execute
    normalize_inputs_of(model, "fc")
    normalize_inputs_of(model, "fc")  # idempotent
    logits = model(x)
    # Assert: ℓ_c = s·cos(f(x), μ_c).
    features = torch.relu(model.body(x))
    expected = s * F.normalize(features, dim=1) @ torch.tensor(prototypes).T
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_local_training_keeps_prototypes_fixed_and_learns_the_scale() -> None:
    # Prepare
    flat, spec = _tiny_problem()
    params = FedNHParams(scale=2.0)
    server = FedNHServer(params, spec, {"tiny": flat.state_numpy()})
    message, client = server.broadcast(), FedNHClient(params, spec)
    job = _job(flat, 0, [6, 6, 0])
    body_before = torch.from_numpy(message.vector[: flat.slice_of("body").stop])
    # Execute
    normalize_inputs_of(flat.module, "fc")  # as the worker builds its models for FedNH's clients
    train_client(client, message, job)
    upload = settled(client.upload(message, job), job)
    # Assert: rows of the output weight are s'·μ (same directions), bias 0, body trained, s moved.
    weight = flat.module.fc.weight.detach().numpy()
    scale = np.linalg.norm(weight, axis=1)
    np.testing.assert_allclose(scale, scale[0], rtol=1e-5)
    np.testing.assert_allclose(weight / scale[:, None], server.prototypes, atol=1e-5)
    assert scale[0] != pytest.approx(2.0) and float(upload.body.total[-1]) == pytest.approx(scale[0] * 12, rel=1e-5)
    assert not flat.module.fc.bias.detach().any()
    assert not torch.equal(flat.vector[: flat.slice_of("body").stop], body_before)
    # With a fixed scale, s stays.
    fixed = FedNHParams(scale=2.0, learn_scale=False)
    job = _job(flat, 1, [3, 3, 3])
    train_client(FedNHClient(fixed, spec), message, job)
    np.testing.assert_allclose(np.linalg.norm(flat.module.fc.weight.detach().numpy(), axis=1), 2.0, rtol=1e-5)


def test_the_scale_and_the_body_step_by_the_phases_sgd_with_the_scales_chain_rule_gradient() -> None:
    # Prepare: two full-batch steps with momentum, weight decay and a clipping norm small enough to act.
    flat, spec = _tiny_problem()
    params = FedNHParams(scale=2.0, max_grad_norm=0.5)
    message = FedNHServer(params, spec, {"tiny": flat.state_numpy()}).broadcast()
    lr, momentum, decay = 0.5, 0.9, 1e-2
    train = TrainConfig(lr=lr, batch_size=12, local_epochs=2, momentum=momentum, weight_decay=decay)
    job = tiny_job(flat, 0, [6, 6, 0], train)
    normalize_inputs_of(flat.module, "fc")
    # Execute
    _, steps = train_client(FedNHClient(params, spec), message, job)
    # Assert: the same two steps by hand, the logits s·cos(f(x), μ_c) differentiated in s itself: each step
    # clips (body, s)'s gradient to norm 0.5 together, then torch's SGD (d = g + wd·x, b ← m·b + d, x ← x − lr·b).
    x, y = job.x_train.double(), job.y_train
    mu = torch.from_numpy(message.prototypes).double()
    start = torch.from_numpy(message.vector).double()
    values = [start[:12].view(4, 3), start[12:16], torch.tensor(2.0, dtype=torch.float64)]
    buffers: list[torch.Tensor] = []
    factors = []
    for _ in range(2):
        w, b, s = (v.clone().requires_grad_(True) for v in values)
        logits = s * F.normalize(torch.relu(x @ w.T + b), dim=1) @ mu.T
        grads = torch.autograd.grad(F.cross_entropy(logits, y), (w, b, s))
        factors.append(min(1.0, 0.5 / (float(torch.sqrt(sum(g.pow(2).sum() for g in grads))) + 1e-6)))
        steps_d = [g * factors[-1] + decay * v for g, v in zip(grads, values)]
        buffers = steps_d if not buffers else [momentum * buf + d for buf, d in zip(buffers, steps_d)]
        values = [v - lr * buf for v, buf in zip(values, buffers)]
    assert steps == 2 and factors[0] < 1.0
    w, b, s = values
    assert float(job.extra["s"]) == pytest.approx(float(s), rel=1e-4)
    np.testing.assert_allclose(
        flat.numpy(flat.slice_of("body")), torch.cat([w.reshape(-1), b]).numpy(), rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(flat.module.fc.weight.detach().numpy(), (s * mu).numpy(), rtol=1e-4, atol=1e-6)
    assert not flat.module.fc.bias.detach().any()


@pytest.mark.parametrize("weighting", ["size", "uniform"])
def test_server_averages_body_and_scale_and_smooths_prototypes(weighting: str) -> None:
    # Prepare: two uploads with bodies b_1, b_2 (last entry: s), sizes 1 and 3.
    flat, spec = _tiny_problem()
    params = FedNHParams(body_weighting=weighting, smoothing=0.5)
    server = FedNHServer(params, spec, {"tiny": flat.state_numpy()})
    size = int(server.head.body.sum()) + 1
    b1, b2 = np.full(size, 1.0, np.float32), np.full(size, 5.0, np.float32)
    w1, w2 = (1.0, 3.0) if weighting == "size" else (1.0, 1.0)
    sums = np.zeros((3, 4), np.float32)
    sums[0] = [2.0, 0, 0, 0]
    upload = PrototypeSum(WeightedSum.of(b1, w1), sums, np.array([2.0, 0, 0])) + PrototypeSum(
        WeightedSum.of(b2, w2), np.zeros((3, 4), np.float32), np.zeros(3)
    )
    before = server.prototypes.copy()
    # Execute
    metrics = server.aggregate(_ctx([0, 1]), upload)
    # Assert
    expected = (w1 * 1.0 + w2 * 5.0) / (w1 + w2)
    np.testing.assert_allclose(server.global_vector[server.head.body], expected, rtol=1e-6)
    assert server.scale == pytest.approx(expected)
    np.testing.assert_allclose(server.prototypes[0], _unit(0.5 * before[0] + 0.5 * np.array([1.0, 0, 0, 0])), atol=1e-6)
    np.testing.assert_array_equal(server.prototypes[1:], before[1:])
    head = server.global_vector[server.head.weight].reshape(3, 4)
    np.testing.assert_allclose(head, expected * server.prototypes, rtol=1e-5)
    assert metrics["classes_updated"] == 1.0 and metrics["clients_aggregated"] == 2.0
    # The state round-trips.
    state = {k: v.copy() for k, v in server.state_dict().items()}
    other = FedNHServer(params, spec, {"tiny": flat.state_numpy()})
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.broadcast().vector, server.broadcast().vector)


def test_invalid_params_and_output_layer_name_the_field() -> None:
    with pytest.raises(ConfigError, match="algorithm.params.smoothing"):
        FedNHParams(smoothing=1.5)
    with pytest.raises(ConfigError, match="algorithm.params.body_weighting"):
        FedNHParams(body_weighting="median")  # type: ignore[arg-type]
    flat, spec = _tiny_problem()
    wrong = ProblemSpec(2, 5, (1, 1, 3), spec.layouts, spec.blocks, spec.output_layer, default_architecture="tiny")
    with pytest.raises(ConfigError, match="one prototype row per class"):
        FedNHServer.validate(FedNHParams(), wrong)


# --- with the real worker and end to end -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_simulation(tmp_path_factory):
    config = RunConfig().override(
        tiny_overrides(
            tmp_path_factory.mktemp("sim") / "run",
            **{"algorithm.name": "fednh", "data.options": {"num_samples": 800}, "data.num_clients": 5},
        )
    )
    return config, Simulation(config)


def test_prototypes_move_towards_the_clients_class_means(tiny_simulation) -> None:
    # Prepare: a worker trains every client from the server's first broadcast.
    config, sim = tiny_simulation
    server = FedNHServer(config.algorithm.params, sim.spec, sim.initial)
    runner = ClientRunner(config, sim.spec, sim.dataset, sim.partition)
    upload = runner.train(server.broadcast(), _ctx(list(range(5)), 5), list(range(5))).contribution
    before = server.prototypes.copy()
    # Execute
    server.aggregate(_ctx(list(range(5)), 5), upload)
    # Assert: unit norm kept; every held class closer (in cosine) to the clients' mean direction.
    held = upload.counts > 0
    target = _unit_rows(upload.sums[held] / upload.counts[held, None])
    np.testing.assert_allclose(np.linalg.norm(server.prototypes, axis=1), 1.0, atol=1e-6)
    closer = (server.prototypes[held] * target).sum(1) > (before[held] * target).sum(1) + 1e-4
    assert held.sum() >= 8 and closer.all()


def _run(tmp_path, **extra: object) -> tuple[Simulation, ServerStates]:
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "fednh",
                "data.options": {"num_samples": 1200},
                "train.rounds": 3,
                "engine.checkpoint_every": 0,
                **extra,
            },
        )
    )
    states = ServerStates()
    sim = Simulation(config, callbacks=[states])
    sim.run()
    return sim, states


def test_fednh_learns_with_unit_prototypes_and_honest_bytes(tmp_path) -> None:
    # Prepare / Execute: 10 clients with 2 of 10 classes, 3 rounds. Measured (PM, GM) per round:
    # (0.60, 0.10), (0.71, 0.14), (0.79, 0.26).
    sim, states = _run(tmp_path)
    # Assert: prototypes stay unit vectors and move every round; both models beat chance (0.1).
    for state in states.rounds:
        np.testing.assert_allclose(np.linalg.norm(state["prototypes"], axis=1), 1.0, atol=1e-5)
    for a, b in zip(states.rounds, states.rounds[1:]):
        assert not np.allclose(a["prototypes"], b["prototypes"])
    last = sim.history[-1]
    assert last["accuracy"] > 0.3 and last["global_accuracy"] > 0.2
    # Bytes: up = body + s + weight (8) + per held class h floats and a float64 count; down = body,
    # K × h prototypes and s.
    server = FedNHServer(sim.config.algorithm.params, sim.spec, sim.initial)
    body, (k, h) = int(server.head.body.sum()), server.head.shape
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    for row in clients:
        held = int((sim.partition.train_label_counts[row["client_id"]] > 0).sum())
        assert row["bytes_up"] == (body + 1) * 4 + 8 + held * (h * 4 + 8)
        assert row["bytes_down"] == body * 4 + k * h * 4 + 4


def test_partial_participation_trains_half_and_evaluates_all(tmp_path) -> None:
    sim, states = _run(tmp_path, **{"engine.join_ratio": 0.5, "train.rounds": 2})
    assert all(r["num_sampled"] == 5 and r["num_evaluated"] == 10 for r in sim.history)
    assert sim.history[-1]["server_clients_aggregated"] == 5.0
    assert sim.history[-1]["accuracy"] > 0.3  # measured 0.42 / 0.48 (PM); GM is still at chance after 2 rounds
    np.testing.assert_allclose(np.linalg.norm(states.rounds[-1]["prototypes"], axis=1), 1.0, atol=1e-5)
