"""FedAWA / FedAWA-L: the M × M objective against the direct one, the solvers, the server, end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rayfed import ConfigError, RunConfig, run
from rayfed.algorithms import RoundContext, sum_contributions
from rayfed.algorithms.base import ProblemSpec
from rayfed.algorithms.fedawa import (
    ClientVectors,
    FedAWALServer,
    FedAWAParams,
    FedAWAServer,
    code_adam_steps,
    code_objective,
    gram_statistics,
    layer_groups,
    minimise_on_simplex,
    paper_objective,
    project_onto_simplex,
    softmax,
)
from rayfed.algorithms.sgdm import MOMENTUM_KEY, PersistentMomentumClient
from rayfed.flat import FlatModel, ParamLayout
from rayfed.io import load_arrays
from rayfed.training import ClientJob
from tests.conftest import tiny_overrides

# A model of two "modules": a (weight 6, bias 2) and bn (weight 2, bias 2, running mean 2 and var 2).
LAYOUT = ParamLayout(("a.weight", "a.bias", "bn.weight", "bn.bias"), ((2, 3), (2,), (2,), (2,)), (0, 6, 8, 10, 12))
BUFFERS = ParamLayout(("bn.running_mean", "bn.running_var"), ((2,), (2,)), (0, 2, 4))
P, S = LAYOUT.size, LAYOUT.size + BUFFERS.size


def _spec(num_clients: int = 6) -> ProblemSpec:
    return ProblemSpec(
        num_clients, 2, (1, 2, 2), {"m": LAYOUT}, {"m": ("a", "bn")}, {"m": "a"},
        default_architecture="m", buffer_layouts={"m": BUFFERS},
    )


def _ctx(ids: np.ndarray) -> RoundContext:
    return RoundContext(round=0, seed=0, lr=0.1, sampled=np.sort(ids), num_clients=6)


def _upload(vectors: np.ndarray, ids: list[int] | np.ndarray, sizes: list[float] | np.ndarray) -> ClientVectors:
    return sum_contributions(ClientVectors.of(v, int(i), float(n)) for v, i, n in zip(vectors, ids, sizes))


def _random_problem(seed: int, m: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    global_vector = rng.normal(size=S).astype(np.float32)
    vectors = (0.3 * rng.normal(size=(m, S)) + 0.2 * rng.normal(size=S)).astype(np.float32)
    return global_vector, vectors


def _direct(lam: np.ndarray, vectors: np.ndarray, theta_g: np.ndarray, distance: str, fidelity: str):
    """Eq. 3 (paper) or C-AWA's loss (code) on the full vectors, with torch autograd: the reference."""
    weights = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor(vectors, dtype=torch.float64)
    g = torch.tensor(theta_g, dtype=torch.float64)
    tau_g = weights @ tau
    spread = (weights * torch.linalg.vector_norm(tau - tau_g, dim=1)).sum()
    models = g + tau  # θ_k
    if fidelity == "paper":
        merged = weights @ models  # Σ_k λ_k θ_k
        if distance == "cos":
            reg = 1 - torch.nn.functional.cosine_similarity(merged, g, dim=0)
        else:
            reg = torch.linalg.vector_norm(merged - g)
    else:
        if distance == "cos":
            c = 1 - torch.nn.functional.cosine_similarity(models, g[None, :], dim=1)
        else:
            c = ((models - g) ** 2).mean(dim=1)
        reg = (weights * c.detach()).sum()
    value = spread + reg
    value.backward()
    return float(value.detach()), weights.grad.numpy()


# --- the M × M objective equals the direct one --------------------------------------------------


@pytest.mark.parametrize("fidelity", ["paper", "code"])
@pytest.mark.parametrize("distance", ["cos", "euclidean"])
@pytest.mark.parametrize("layer_wise", [False, True])
def test_gram_objective_equals_direct_computation(fidelity: str, distance: str, layer_wise: bool) -> None:
    # Prepare: random client vectors, random weights on the simplex (one row per layer group).
    theta_g, vectors = _random_problem(seed=1)
    groups = layer_groups(LAYOUT, BUFFERS, layer_wise=layer_wise)
    rng = np.random.default_rng(2)
    lam = rng.dirichlet(np.ones(len(vectors)), size=groups.num_groups)
    stats = gram_statistics(vectors, theta_g, groups.param_slices)
    if fidelity == "paper":
        objective = paper_objective(stats, distance)
    else:
        objective = code_objective(stats, distance, groups.sizes)
    # Execute
    values, grads = objective(lam)
    # Assert: per group, the value and the gradient along the simplex match the full-vector formula.
    for layer, part in enumerate(groups.param_slices):
        value, grad = _direct(lam[layer], vectors[:, part], theta_g[part], distance, fidelity)
        assert values[layer] == pytest.approx(value, rel=1e-5, abs=1e-9)
        if fidelity == "paper":  # only the tangent part is defined on the simplex
            grad, mine = grad - grad.mean(), grads[layer] - grads[layer].mean()
        else:
            mine = grads[layer]
        np.testing.assert_allclose(mine, grad, rtol=1e-4, atol=1e-7)


def test_gram_statistics_match_numpy() -> None:
    theta_g, vectors = _random_problem(seed=3)
    stats = gram_statistics(vectors, theta_g, [slice(0, P)])
    t = vectors[:, :P].astype(np.float64)
    np.testing.assert_allclose(stats.G[0], t @ t.T, rtol=1e-5)
    np.testing.assert_allclose(stats.b[0], t @ theta_g[:P], rtol=1e-5)
    assert stats.c[0] == pytest.approx(float(theta_g[:P].astype(np.float64) @ theta_g[:P]), rel=1e-6)


# --- solvers ------------------------------------------------------------------------------------


def test_projection_lands_on_the_simplex_and_fixes_its_points() -> None:
    rng = np.random.default_rng(0)
    projected = project_onto_simplex(rng.normal(scale=3, size=(50, 7)))
    assert np.all(projected >= 0)
    np.testing.assert_allclose(projected.sum(axis=1), 1.0)
    inside = rng.dirichlet(np.ones(7), size=4)
    np.testing.assert_allclose(project_onto_simplex(inside), inside, atol=1e-12)


@pytest.mark.parametrize("distance", ["cos", "euclidean"])
def test_paper_solver_stays_on_the_simplex_and_lowers_the_objective(distance: str) -> None:
    theta_g, vectors = _random_problem(seed=4, m=8)
    groups = layer_groups(LAYOUT, BUFFERS, layer_wise=True)
    objective = paper_objective(gram_statistics(vectors, theta_g, groups.param_slices), distance)
    lam0 = np.full((groups.num_groups, 8), 1 / 8)
    lam, report = minimise_on_simplex(objective, lam0, tolerance=1e-6, max_steps=500)
    assert np.all(lam >= 0)
    np.testing.assert_allclose(lam.sum(axis=1), 1.0)
    assert np.all(report.final < report.start)
    np.testing.assert_allclose(objective(lam)[0], report.final)
    if distance == "cos":  # (the Euclidean d is a cone at τ_g = 0: slow, but monotone, descent)
        assert report.steps < 50 and np.all(report.gap <= 1e-6 * report.start)  # the stopping rule


def test_code_step_is_one_adam_step_and_lowers_the_loss() -> None:
    theta_g, vectors = _random_problem(seed=5)
    stats = gram_statistics(vectors, theta_g, [slice(0, P)])
    objective = code_objective(stats, "cos", np.array([P], float))
    z0 = np.array([[0.05, 0.1, 0.2, 0.15, 0.5]])
    params = FedAWAParams(fidelity="code", server_lr=1e-3)
    lam, z1 = code_adam_steps(objective, z0, params)
    np.testing.assert_allclose(lam, softmax(z0))  # the weights used are the pre-step softmax
    lam_grad = objective(lam)[1]
    grad_z = lam * (lam_grad - (lam * lam_grad).sum())
    # Adam's first step from fresh state moves each logit by lr · g/(|g| + 1e-8) ≈ −lr · sign(g).
    np.testing.assert_allclose(z1 - z0, -1e-3 * grad_z / (np.abs(grad_z) + 1e-8), rtol=1e-9)
    assert objective(softmax(z1))[0][0] < objective(lam)[0][0]


# --- the server ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fidelity", ["paper", "code"])
@pytest.mark.parametrize("server_cls", [FedAWAServer, FedAWALServer])
def test_identical_client_vectors_give_equal_weights(fidelity: str, server_cls: type) -> None:
    theta_g, vectors = _random_problem(seed=6, m=4)
    same = np.repeat(vectors[:1], 4, axis=0)
    server = server_cls(FedAWAParams(fidelity=fidelity), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(4)), _upload(same, range(4), [10, 10, 10, 10]))
    weights = server.client_state[:, :4]
    np.testing.assert_allclose(weights, weights[:, :1].repeat(4, axis=1), rtol=1e-12)
    np.testing.assert_allclose(server.global_vector, theta_g + same[0], rtol=1e-5, atol=1e-6)


def _outlier_problem() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    theta_g = rng.normal(size=S).astype(np.float32)
    common = rng.normal(size=S)
    vectors = (common + 0.1 * rng.normal(size=(5, S))).astype(np.float32)
    vectors[4] = (-3 * common + rng.normal(size=S)).astype(np.float32)  # client 4 goes the other way
    return theta_g, vectors


def test_outlier_gets_the_smallest_weight_in_paper_mode() -> None:
    theta_g, vectors = _outlier_problem()
    server = FedAWAServer(FedAWAParams(), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(5)), _upload(vectors, range(5), [10] * 5))
    weights = server.client_state[0, :5]
    assert weights[4] == pytest.approx(0.0, abs=1e-12)
    assert weights[4] < weights[:4].max()


def test_outlier_logit_falls_in_code_mode() -> None:
    theta_g, vectors = _outlier_problem()
    server = FedAWAServer(FedAWAParams(fidelity="code"), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(5)), _upload(vectors, range(5), [10] * 5))
    next_weights = softmax(server.client_state[0, :5])
    assert next_weights[4] < next_weights[:4].min()


def test_code_mode_aggregates_with_the_pre_step_softmax_of_size_fractions() -> None:
    # Prepare: 3 clients with 10, 20 and 30 samples: logits start at the fractions 1/6, 2/6, 3/6
    # (N = 6 client ids, mean size 20: n_k / (N · mean n) = n_k / 120 here).
    theta_g, vectors = _random_problem(seed=8, m=3)
    server = FedAWAServer(FedAWAParams(fidelity="code", gamma=0.9), _spec(), {"m": theta_g})
    # Execute
    server.aggregate(_ctx(np.arange(3)), _upload(vectors, [0, 1, 2], [10, 20, 30]))
    # Assert: θ_g ← γ Σ_k λ_k θ_k with λ = softmax(n / 120), on every entry, buffers included.
    z0 = np.array([10, 20, 30]) / 120
    lam = softmax(z0)
    expected = 0.9 * (lam @ (theta_g.astype(np.float64) + vectors))
    np.testing.assert_allclose(server.global_vector, expected, rtol=1e-5, atol=1e-6)
    moved = server.client_state[0, :3] - z0
    np.testing.assert_allclose(np.abs(moved), 1e-3, rtol=1e-4)  # one Adam step, ±lr per logit
    assert np.isnan(server.client_state[0, 3:]).all()  # clients not seen yet have no logit


def test_logits_are_indexed_by_client_id_under_partial_participation() -> None:
    theta_g, vectors = _random_problem(seed=9, m=4)
    server = FedAWAServer(FedAWAParams(fidelity="code"), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.array([0, 1, 2])), _upload(vectors[:3], [0, 1, 2], [10, 10, 10]))
    after_first = server.client_state.copy()
    # Execute: the next round has clients 2 and 5, uploaded in the order 5, 2.
    server.aggregate(_ctx(np.array([2, 5])), _upload(vectors[[3, 0]], [5, 2], [10, 10]))
    # Assert: clients 0 and 1 keep their logits, 2 continues from its own, 5 starts fresh.
    np.testing.assert_array_equal(server.client_state[:, :2], after_first[:, :2])
    assert abs(server.client_state[0, 2] - after_first[0, 2]) == pytest.approx(1e-3, rel=1e-4)
    assert abs(server.client_state[0, 5] - 10 / (6 * 10)) == pytest.approx(1e-3, rel=1e-4)
    assert np.isnan(server.client_state[0, [3, 4]]).all()


def test_paper_weights_are_indexed_by_client_id_under_partial_participation() -> None:
    theta_g, vectors = _random_problem(seed=9, m=4)
    server = FedAWAServer(FedAWAParams(), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.array([0, 1, 2])), _upload(vectors[:3], [0, 1, 2], [10, 20, 30]))
    before = server.client_state.copy()
    server.aggregate(_ctx(np.array([2, 5])), _upload(vectors[[3, 0]], [5, 2], [10, 10]))
    # Clients 0 and 1 keep their weights; 2 and 5 share the mass they brought (5 starts at n/(N·mean n)).
    np.testing.assert_array_equal(server.client_state[:, :2], before[:, :2])
    assert server.client_state[0, [2, 5]].sum() == pytest.approx(before[0, 2] + 10 / (6 * 10))
    assert np.isnan(server.client_state[0, [3, 4]]).all()


def test_paper_mode_warm_starts_from_the_previous_weights() -> None:
    theta_g, vectors = _random_problem(seed=10, m=4)
    server = FedAWAServer(FedAWAParams(), _spec(), {"m": theta_g})
    ctx = _ctx(np.arange(4))
    server.aggregate(ctx, _upload(vectors, range(4), [5, 10, 15, 20]))
    first = server.client_state[0, :4].copy()
    server.global_vector = theta_g  # the same problem again: the solution is already optimal
    metrics = server.aggregate(ctx, _upload(vectors, range(4), [5, 10, 15, 20]))
    assert metrics["fedawa_solver_steps"] == 0
    np.testing.assert_allclose(server.client_state[0, :4], first)


def test_layer_wise_aggregation_uses_each_layers_weights_and_bn_buffers_follow_their_weight() -> None:
    groups = layer_groups(LAYOUT, BUFFERS, layer_wise=True)
    assert groups.num_groups == 4
    assert groups.segments[-1] == (slice(12, 16), 2)  # running mean and var join bn.weight
    theta_g, vectors = _random_problem(seed=11, m=3)
    server = FedAWALServer(FedAWAParams(), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(3)), _upload(vectors, range(3), [10, 20, 30]))
    lam = server.client_state[:, :3] / server.client_state[:, :3].sum(axis=1, keepdims=True)
    for part, group in groups.segments:
        expected = theta_g[part] + lam[group] @ vectors[:, part]
        np.testing.assert_allclose(server.global_vector[part], expected, rtol=1e-5, atol=1e-6)


def test_client_vectors_concatenate_associatively_and_state_round_trips() -> None:
    theta_g, vectors = _random_problem(seed=12, m=3)
    parts = [ClientVectors.of(v, i, 10.0 + i) for i, v in enumerate(vectors)]
    left, right = (parts[0] + parts[1]) + parts[2], parts[0] + (parts[1] + parts[2])
    np.testing.assert_array_equal(left.matrix(), right.matrix())
    np.testing.assert_array_equal(left.client_ids, [0, 1, 2])
    assert left.count == 3 and left.nbytes == vectors.nbytes + 3 * 8 + 3 * 8 and left.is_finite()
    server = FedAWAServer(FedAWAParams(), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(3)), left)
    copy = FedAWAServer(FedAWAParams(), _spec(), {"m": np.zeros(S, np.float32)})
    copy.load_state_dict(server.state_dict())
    np.testing.assert_array_equal(copy.global_vector, server.global_vector)
    np.testing.assert_array_equal(copy.client_state, server.client_state)


# --- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("fidelity", "exact", "one of 'paper', 'code'"),
        ("distance", "l1", "one of 'cos', 'euclidean'"),
        ("tolerance", 0.0, "a finite number > 0"),
        ("max_steps", 0, "an integer >= 1"),
        ("server_lr", -1.0, "a finite number > 0"),
        ("server_beta1", 1.0, "in [0, 1)"),
        ("server_steps", 1.5, "an integer >= 1"),
        ("gamma", math.inf, "a finite number > 0"),
    ],
)
def test_invalid_params_name_the_field_the_value_and_what_is_allowed(field: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        FedAWAParams(**{field: value})
    message = str(info.value)
    assert f"algorithm.params.{field} must be {allowed}" in message
    assert f"algorithm.params.{field}={value!r}" in message


def test_params_come_from_the_config() -> None:
    config = RunConfig().override({"algorithm.name": "fedawa_l", "algorithm.params.fidelity": "code",
                                   "algorithm.params.distance": "euclidean"})
    assert config.algorithm.params == FedAWAParams(fidelity="code", distance="euclidean")


# --- persistent momentum ------------------------------------------------------------------------


def _job(flat: FlatModel, state: dict[str, np.ndarray] | None) -> ClientJob:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 3, generator=gen), torch.randint(0, 2, (12,), generator=gen)
    return ClientJob(
        client_id=0, round=0, flat=flat, architecture="tiny", x_train=x, y_train=y, x_test=x, y_test=y,
        label_counts=np.array([6, 6]), train_label_counts=np.array([6, 6]), lr=0.1, epochs=1, batch_size=4,
        momentum=0.9, weight_decay=5e-4, drop_last=True, generator=torch.Generator().manual_seed(1), seed=1,
        state=state,
    )


def test_momentum_buffer_persists_like_one_torch_sgd_across_rounds() -> None:
    # Prepare: our client for two rounds, and one torch SGD optimiser kept across both rounds.
    torch.manual_seed(0)
    net, reference = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    reference.load_state_dict(net.state_dict())
    start = [p.detach().clone() for p in net.parameters()]
    flat = FlatModel(net)
    client = PersistentMomentumClient(None, None)  # type: ignore[arg-type]
    optimiser = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    state = None
    for _ in range(2):  # each round starts again from the same global model
        with torch.no_grad():
            for p, s in zip(net.parameters(), start):
                p.copy_(s)
            for p, s in zip(reference.parameters(), start):
                p.copy_(s)
        job = _job(flat, state)
        # Execute
        client.train(job)
        state = job.state
        gen = torch.Generator().manual_seed(1)
        order = torch.randperm(12, generator=gen)
        for begin in range(0, 12, 4):
            idx = order[begin : begin + 4]
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(reference(job.x_train[idx]), job.y_train[idx]).backward()
            optimiser.step()
    # Assert
    for mine, theirs in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs)
    assert state is not None and state[MOMENTUM_KEY].shape == (flat.size,)


# --- end to end ---------------------------------------------------------------------------------


def test_fedawa_with_fedprox_clients_runs_end_to_end(tmp_path) -> None:
    overrides = tiny_overrides(tmp_path / "run", **{"algorithm.name": "fedawa", "algorithm.client": "fedprox",
                                                    "algorithm.client_params": {"mu": 0.01},
                                                    "data.options": {"num_samples": 1000}})
    result = run(RunConfig().override(overrides))
    assert result.rounds_run == 2 and not math.isnan(result.final_accuracy)
    assert all(r["server_clients_aggregated"] == 10 for r in result.history)


def test_fedawa_l_code_mode_keeps_momentum_in_the_client_state_store(tmp_path) -> None:
    overrides = tiny_overrides(tmp_path / "run", **{
        "algorithm.name": "fedawa_l", "algorithm.params.fidelity": "code", "train.momentum": 0.9,
        "data.options": {"num_samples": 1000}, "engine.checkpoint_every": 2})
    result = run(RunConfig().override(overrides))
    assert result.rounds_run == 2 and not math.isnan(result.final_accuracy)
    saved = load_arrays(tmp_path / "run" / "checkpoints" / "round_000001.npz")
    assert {f"client/{c}/{MOMENTUM_KEY}" for c in range(10)} <= set(saved)
    assert saved["server/client_state"].shape[1] == 10


def test_borrowed_sgdm_client_keeps_its_momentum_under_fedavg(tmp_path) -> None:
    # Prepare: FedAvg's server with the borrowed client, and plain FedAvg, whose clients
    # start every round from a zero momentum buffer.
    common = {"train.momentum": 0.9, "data.options": {"num_samples": 1000}}
    # Execute
    kept = run(RunConfig().override(tiny_overrides(tmp_path / "a", **{"algorithm.client": "sgdm", **common})))
    fresh = run(RunConfig().override(tiny_overrides(tmp_path / "b", **common)))
    # Assert: round 0 is the same; in round 1 the engine hands the kept buffers back.
    (kept_0, kept_1), (fresh_0, fresh_1) = ([r["train_loss"] for r in x.history] for x in (kept, fresh))
    assert kept_0 == fresh_0 and kept_1 != fresh_1
