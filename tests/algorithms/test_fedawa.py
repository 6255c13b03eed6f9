"""FedAWA / FedAWA-L: the M × M objectives against torch, the solvers, the three fidelities, end to end."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from rayfed import ConfigError, RunConfig, run
from rayfed.algorithms import ALGORITHMS, RoundContext, sum_contributions
from rayfed.algorithms.common.global_model import GlobalModel
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.fedawa import FedAWALServer, FedAWAParams, FedAWAServer
from rayfed.algorithms.fedawa_objective import (
    EXACT_SMOOTHING,
    MatrixFreeProducts,
    code_objective,
    combine,
    gram_statistics,
    layer_groups,
    paper_objective,
)
from rayfed.algorithms.fedawa_solvers import adam_steps, minimise_on_simplex, project_onto_simplex, softmax
from rayfed.algorithms.fedawa_weights import INITIAL_WEIGHTS
from rayfed.algorithms.sgdm import MOMENTUM_KEY, PersistentMomentumClient
from rayfed.config import TrainConfig
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from rayfed.util.files import load_arrays
from tests.algorithms.read_back import settled
from tests.conftest import client_job, tiny_overrides, train_client

# A model of two "modules": a (weight 6, bias 2) and bn (weight 2, bias 2, running mean 2 and var 2).
LAYOUT = ParamLayout(("a.weight", "a.bias", "bn.weight", "bn.bias"), ((2, 3), (2,), (2,), (2,)), (0, 6, 8, 10, 12))
BUFFERS = ParamLayout(("bn.running_mean", "bn.running_var"), ((2,), (2,)), (0, 2, 4))
P, S = LAYOUT.size, LAYOUT.size + BUFFERS.size


def _spec(num_clients: int = 6) -> ProblemSpec:
    return ProblemSpec(
        num_clients,
        2,
        (1, 2, 2),
        {"m": LAYOUT},
        {"m": ("a", "bn")},
        {"m": "a"},
        default_architecture="m",
        buffer_layouts={"m": BUFFERS},
    )


def _ctx(ids: np.ndarray) -> RoundContext:
    return RoundContext(round=0, seed=0, lr=0.1, sampled=np.sort(ids))


def _upload(vectors: np.ndarray, ids: list[int] | np.ndarray, sizes: list[float] | np.ndarray) -> ClientVectors:
    return sum_contributions(ClientVectors.of(v, int(i), float(n)) for v, i, n in zip(vectors, ids, sizes))


def _random_problem(seed: int, m: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    global_vector = rng.normal(size=S).astype(np.float32)
    vectors = (0.3 * rng.normal(size=(m, S)) + 0.2 * rng.normal(size=S)).astype(np.float32)
    return global_vector, vectors


def _torch_objective(
    weights: torch.Tensor, vectors: np.ndarray, theta_g: np.ndarray, distance: str, fidelity: str
) -> torch.Tensor:
    """Eq. 3 as the paper writes it (``paper``) or the code's loss (``code``), on the full vectors: the reference."""
    tau = torch.tensor(vectors, dtype=torch.float64)
    g = torch.tensor(theta_g, dtype=torch.float64)
    tau_g = weights @ tau
    spread = (weights * torch.linalg.vector_norm(tau - tau_g, dim=1)).sum()
    models = g + tau  # θ_k
    if distance == "none":  # Tab. 5's "no regulariser": the dispersion term alone
        return spread
    if fidelity == "paper":
        merged = weights @ models  # Σ_k λ_k θ_k
        if distance == "cos":
            return spread + 1 - torch.nn.functional.cosine_similarity(merged, g, dim=0)
        return spread + torch.linalg.vector_norm(merged - g)
    if distance == "cos":
        c = 1 - torch.nn.functional.cosine_similarity(models, g[None, :], dim=1)
    else:
        c = ((models - g) ** 2).mean(dim=1)
    return spread + (weights * c.detach()).sum()


def _direct(lam: np.ndarray, vectors: np.ndarray, theta_g: np.ndarray, distance: str, fidelity: str):
    """The reference's value and gradient in λ, by torch autograd."""
    weights = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
    value = _torch_objective(weights, vectors, theta_g, distance, fidelity)
    value.backward()
    return float(value.detach()), weights.grad.numpy()


# --- the M × M objective equals the direct one --------------------------------------------------


@pytest.mark.parametrize("fidelity", ["paper", "code"])
@pytest.mark.parametrize("distance", ["cos", "euclidean", "none"])
@pytest.mark.parametrize("layer_wise", [False, True])
@pytest.mark.parametrize("matrix_free", [False, True])
def test_objective_equals_direct_computation(fidelity: str, distance: str, layer_wise: bool, matrix_free: bool) -> None:
    # Prepare: random client vectors, random weights on the simplex (one row per layer group).
    theta_g, vectors = _random_problem(seed=1)
    groups = layer_groups(LAYOUT, BUFFERS, layer_wise=layer_wise)
    rng = np.random.default_rng(2)
    lam = rng.dirichlet(np.ones(len(vectors)), size=groups.num_groups)
    make = MatrixFreeProducts if matrix_free else gram_statistics
    products = make(vectors, theta_g, groups.param_slices)
    if fidelity == "paper":
        objective = paper_objective(products, distance)
    else:
        objective = code_objective(products, distance, groups.sizes)
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


def test_gram_statistics_and_matrix_free_products_match_numpy() -> None:
    theta_g, vectors = _random_problem(seed=3)
    t = vectors[:, :P].astype(np.float64)
    x = np.random.default_rng(4).normal(size=(1, len(vectors)))
    for products in (
        gram_statistics(vectors, theta_g, [slice(0, P)]),
        MatrixFreeProducts(vectors, theta_g, [slice(0, P)]),
    ):
        np.testing.assert_allclose(products.diag[0], np.diag(t @ t.T), rtol=1e-5)
        np.testing.assert_allclose(products.gram(x)[0], t @ t.T @ x[0], rtol=1e-5)
        np.testing.assert_allclose(products.b[0], t @ theta_g[:P], rtol=1e-5)
        assert products.c[0] == pytest.approx(float(theta_g[:P].astype(np.float64) @ theta_g[:P]), rel=1e-6)


@pytest.mark.parametrize("layer_wise", [False, True])
def test_combine_takes_the_weighted_sum_a_product_made_and_gives_the_same_bits(layer_wise: bool) -> None:
    # Prepare: the products of one objective evaluation at λ (Gλ, then Gw for another w), as one Adam step makes.
    theta_g, vectors = _random_problem(seed=6, m=5)
    groups = layer_groups(LAYOUT, BUFFERS, layer_wise=layer_wise)
    rng = np.random.default_rng(7)
    lam, w = rng.dirichlet(np.ones(5), size=(2, groups.num_groups))
    products = MatrixFreeProducts(vectors, theta_g, groups.param_slices)
    products.gram(lam)
    products.gram(w)
    # Execute
    reused = combine(theta_g, vectors, lam, groups, 0.9, products)
    made = combine(theta_g, vectors, lam, groups, 0.9)
    # Assert: every group's parameters come from the products (λ's and w's both kept), to the last bit; the buffers
    # are their own segments; weights the products never saw are made afresh.
    for group, part in enumerate(groups.param_slices):
        for x in (lam, w):
            kept = products.weighted_sum(group, x[group].astype(np.float32))
            np.testing.assert_array_equal(kept, np.matmul(x[group].astype(np.float32), vectors[:, part]))
        assert products.weighted_sum(group, np.full(5, 0.2, np.float32)) is None
    assert any(part.start >= P for part, _ in groups.segments)
    np.testing.assert_array_equal(reused, made)
    products.gram(rng.dirichlet(np.ones(5), size=groups.num_groups))  # a third product: λ's is forgotten
    assert products.weighted_sum(0, lam[0].astype(np.float32)) is None


# --- solvers ------------------------------------------------------------------------------------


def test_projection_lands_on_the_simplex_and_fixes_its_points() -> None:
    rng = np.random.default_rng(0)
    projected = project_onto_simplex(rng.normal(scale=3, size=(50, 7)))
    assert np.all(projected >= 0)
    np.testing.assert_allclose(projected.sum(axis=1), 1.0)
    inside = rng.dirichlet(np.ones(7), size=4)
    np.testing.assert_allclose(project_onto_simplex(inside), inside, atol=1e-12)


@pytest.mark.parametrize("distance", ["cos", "euclidean"])
def test_exact_solver_stays_on_the_simplex_and_lowers_the_objective(distance: str) -> None:
    theta_g, vectors = _random_problem(seed=4, m=8)
    groups = layer_groups(LAYOUT, BUFFERS, layer_wise=True)
    stats = gram_statistics(vectors, theta_g, groups.param_slices)
    objective = paper_objective(stats, distance, smoothing=EXACT_SMOOTHING)
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
    objective = code_objective(MatrixFreeProducts(vectors, theta_g, [slice(0, P)]), "cos", np.array([P], float))
    z0 = np.array([[0.05, 0.1, 0.2, 0.15, 0.5]])
    lam, value, z1 = adam_steps(objective, z0, steps=1, lr=1e-3, betas=(0.5, 0.999))
    np.testing.assert_allclose(lam, softmax(z0))  # the weights used are the pre-step softmax
    lam_value, lam_grad = objective(lam)
    np.testing.assert_allclose(value, lam_value)
    grad_z = lam * (lam_grad - (lam * lam_grad).sum())
    # Adam's first step from fresh state moves each logit by lr · g/(|g| + 1e-8) ≈ −lr · sign(g).
    np.testing.assert_allclose(z1 - z0, -1e-3 * grad_z / (np.abs(grad_z) + 1e-8), rtol=1e-9)
    assert objective(softmax(z1))[0][0] < lam_value[0]


# --- the server ---------------------------------------------------------------------------------


def test_code_is_the_default_fidelity_and_labels_name_the_fidelity() -> None:
    assert FedAWAParams().fidelity == "code"
    assert RunConfig().override({"algorithm.name": "fedawa"}).algorithm.params.fidelity == "code"
    assert ALGORITHMS.get("fedawa").label(FedAWAParams()) == "FedAWA (code)"
    paper = FedAWAParams(fidelity="paper", server_steps=5)
    assert ALGORITHMS.get("fedawa_l").label(paper) == "FedAWA-L (paper, 5 steps)"


@pytest.mark.parametrize("fidelity", ["code", "paper", "exact"])
@pytest.mark.parametrize("server_cls", [FedAWAServer, FedAWALServer])
def test_identical_client_vectors_give_equal_weights(fidelity: str, server_cls: type) -> None:
    theta_g, vectors = _random_problem(seed=6, m=4)
    same = np.repeat(vectors[:1], 4, axis=0)
    server = server_cls(FedAWAParams(fidelity=fidelity), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(4)), _upload(same, range(4), [10, 10, 10, 10]))
    weights = server.client_state[:, :4]
    np.testing.assert_allclose(weights, weights[:, :1].repeat(4, axis=1), rtol=1e-12)
    np.testing.assert_allclose(server.global_vector, theta_g + same[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fidelity", ["code", "paper", "exact"])
def test_one_client_gets_weight_one(fidelity: str) -> None:
    theta_g, vectors = _random_problem(seed=14, m=1)
    server = FedAWALServer(FedAWAParams(fidelity=fidelity), _spec(1), {"m": theta_g})
    metrics = server.aggregate(_ctx(np.array([0])), _upload(vectors, [0], [7]))
    assert metrics["fedawa_max_weight"] == 1.0 and np.isfinite(server.client_state).all()
    np.testing.assert_allclose(server.global_vector, theta_g + vectors[0], rtol=1e-6)


@pytest.mark.parametrize("distance", ["cos", "euclidean"])
@pytest.mark.parametrize("steps", [1, 5])
def test_paper_mode_takes_torch_adam_steps_on_eq3_from_log_size_logits(distance: str, steps: int) -> None:
    # Prepare: all 6 clients, sizes 5..30; the reference is torch.optim.Adam on Eq. 3 written in torch.
    theta_g, vectors = _random_problem(seed=13, m=6)
    sizes = np.array([5.0, 10, 15, 20, 25, 30])
    params = FedAWAParams(fidelity="paper", distance=distance, server_steps=steps)
    server = FedAWAServer(params, _spec(6), {"m": theta_g})
    z = torch.tensor(np.log(sizes / sizes.sum()), dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.Adam([z], lr=1e-3, betas=(0.5, 0.999))
    for _ in range(steps):
        optimiser.zero_grad()
        _torch_objective(torch.softmax(z, 0), vectors[:, :P], theta_g[:P], distance, "paper").backward()
        optimiser.step()
    # Execute
    server.aggregate(_ctx(np.arange(6)), _upload(vectors, range(6), sizes))
    # Assert: the same logits, and the model aggregated with the weights after the steps.
    np.testing.assert_allclose(server.client_state[0], z.detach().numpy(), rtol=0, atol=1e-9)
    lam = torch.softmax(z, 0).detach().numpy()
    np.testing.assert_allclose(server.global_vector, theta_g + lam @ vectors, rtol=1e-5, atol=1e-6)


def _outlier_problem() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    theta_g = rng.normal(size=S).astype(np.float32)
    common = rng.normal(size=S)
    vectors = (common + 0.1 * rng.normal(size=(5, S))).astype(np.float32)
    vectors[4] = (-3 * common + rng.normal(size=S)).astype(np.float32)  # client 4 goes the other way
    return theta_g, vectors


def test_exact_mode_gives_the_outlier_no_weight_and_warns_of_the_collapse(caplog) -> None:
    theta_g, vectors = _outlier_problem()
    server = FedAWAServer(FedAWAParams(fidelity="exact"), _spec(), {"m": theta_g})
    with caplog.at_level(logging.WARNING, logger="rayfed.algorithms.fedawa"):
        server.aggregate(_ctx(np.arange(5)), _upload(vectors, range(5), [10] * 5))
    weights = server.client_state[0, :5]
    assert weights[4] == pytest.approx(0.0, abs=1e-12)
    assert weights.max() > 0.99 * weights.sum()  # a vertex of the simplex
    assert "fidelity='exact' put" in caplog.text and "vertex" in caplog.text


@pytest.mark.parametrize("fidelity", ["code", "paper"])
def test_outlier_logit_falls(fidelity: str) -> None:
    theta_g, vectors = _outlier_problem()
    server = FedAWAServer(FedAWAParams(fidelity=fidelity), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(5)), _upload(vectors, range(5), [10] * 5))
    next_weights = softmax(server.client_state[0, :5])
    assert next_weights[4] < next_weights[:4].min()


def test_code_mode_aggregates_with_the_pre_step_softmax_of_size_fractions() -> None:
    # Prepare: 3 clients with 10, 20 and 30 samples: logits start at the fractions 1/6, 2/6, 3/6
    # (N = 6 client ids, mean size 20: n_k / (N · mean n) = n_k / 120 here).
    theta_g, vectors = _random_problem(seed=8, m=3)
    server = FedAWAServer(FedAWAParams(gamma=0.9), _spec(), {"m": theta_g})
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


@pytest.mark.parametrize(("fidelity", "start"), [("code", 1 / 6), ("paper", math.log(1 / 6))])
def test_uniform_initial_weights_start_every_logit_alike(fidelity: str, start: float) -> None:
    theta_g, vectors = _random_problem(seed=15, m=3)
    server = FedAWAServer(FedAWAParams(fidelity=fidelity, initial_weights="uniform"), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(3)), _upload(vectors, range(3), [10, 20, 30]))
    np.testing.assert_allclose(np.abs(server.client_state[0, :3] - start), 1e-3, rtol=1e-4)  # one step from 1/N
    assert {"size", "uniform"} <= set(INITIAL_WEIGHTS.names())


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


def test_exact_weights_are_indexed_by_client_id_under_partial_participation() -> None:
    theta_g, vectors = _random_problem(seed=9, m=4)
    server = FedAWAServer(FedAWAParams(fidelity="exact"), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.array([0, 1, 2])), _upload(vectors[:3], [0, 1, 2], [10, 20, 30]))
    before = server.client_state.copy()
    server.aggregate(_ctx(np.array([2, 5])), _upload(vectors[[3, 0]], [5, 2], [10, 10]))
    # Clients 0 and 1 keep their weights; 2 and 5 share the mass they brought (5 starts at n/(N·mean n)).
    np.testing.assert_array_equal(server.client_state[:, :2], before[:, :2])
    assert server.client_state[0, [2, 5]].sum() == pytest.approx(before[0, 2] + 10 / (6 * 10))
    assert np.isnan(server.client_state[0, [3, 4]]).all()


def test_exact_mode_warm_starts_from_the_previous_weights() -> None:
    theta_g, vectors = _random_problem(seed=10, m=4)
    server = FedAWAServer(FedAWAParams(fidelity="exact"), _spec(), {"m": theta_g})
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
    server = FedAWALServer(FedAWAParams(fidelity="paper"), _spec(), {"m": theta_g})
    server.aggregate(_ctx(np.arange(3)), _upload(vectors, range(3), [10, 20, 30]))
    lam = softmax(server.client_state[:, :3])  # paper: the weights after the step
    assert not np.allclose(lam, lam[:1])  # the layers' weights differ
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
        ("fidelity", "exactly", "one of 'code', 'paper', 'exact'"),
        ("distance", "l1", "one of 'cos', 'euclidean', 'none'"),
        ("initial_weights", "nearest", "one of 'feddisco', 'size', 'uniform'"),
        ("tolerance", 0.0, "a finite number > 0"),
        ("max_steps", 0, "an integer >= 1"),
        ("server_lr", -1.0, "a finite number > 0"),
        ("server_beta1", 1.0, "a finite number in [0, 1)"),
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
    config = RunConfig().override(
        {
            "algorithm.name": "fedawa_l",
            "algorithm.params.fidelity": "paper",
            "algorithm.params.distance": "euclidean",
            "algorithm.params.server_steps": 5,
        }
    )
    assert config.algorithm.params == FedAWAParams(fidelity="paper", distance="euclidean", server_steps=5)


# --- persistent momentum ------------------------------------------------------------------------


def _job(flat: FlatModel, state: dict[str, np.ndarray] | None) -> ClientJob:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 3, generator=gen), torch.randint(0, 2, (12,), generator=gen)
    train = TrainConfig(lr=0.1, batch_size=4, momentum=0.9, weight_decay=5e-4)
    return client_job(flat, x, y, train=train, generator=1, num_classes=2, state=state)


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
    message = GlobalModel(flat.numpy())
    for _ in range(2):  # each round starts again from the same global model
        with torch.no_grad():
            for p, s in zip(reference.parameters(), start):
                p.copy_(s)
        job = _job(flat, state)
        # Execute: the worker starts the client from θ_g, trains it and reads back what it keeps.
        train_client(client, message, job)
        settled(client.upload(message, job), job)
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
    assert state is not None and isinstance(state[MOMENTUM_KEY], np.ndarray)
    assert state[MOMENTUM_KEY].shape == (flat.size,)


# --- end to end ---------------------------------------------------------------------------------


def test_fedawa_with_fedprox_clients_runs_end_to_end(tmp_path) -> None:
    overrides = tiny_overrides(
        tmp_path / "run",
        **{
            "algorithm.name": "fedawa",
            "algorithm.client": "fedprox",
            "algorithm.client_params": {"mu": 0.01},
            "data.options": {"num_samples": 1000},
        },
    )
    result = run(RunConfig().override(overrides))
    assert result.rounds_run == 2 and not math.isnan(result.final_accuracy)
    assert all(r["server_clients_aggregated"] == 10 for r in result.history)


def test_fedawa_l_code_mode_keeps_momentum_in_the_client_state_store(tmp_path) -> None:
    overrides = tiny_overrides(
        tmp_path / "run",
        **{
            "algorithm.name": "fedawa_l",
            "algorithm.params.fidelity": "code",
            "train.momentum": 0.9,
            "data.options": {"num_samples": 1000},
            "engine.checkpoint_every": 2,
        },
    )
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


def _dirichlet_overrides(run_dir, **extra: object) -> dict[str, object]:
    """8 clients on 600 synthetic samples, Dirichlet 0.1, FedAWA's momentum clients, in-process."""
    return tiny_overrides(
        run_dir,
        **{
            "data.options": {"num_samples": 600},
            "data.num_clients": 8,
            "data.partition": "dirichlet",
            "data.alpha": 0.1,
            "train.batch_size": 20,
            "train.lr": 0.05,
            "train.momentum": 0.9,
            **extra,
        },
    )


def test_paper_mode_learns_without_collapsing_on_dirichlet_01(tmp_path) -> None:
    # Prepare: the initial model's accuracy, from a round whose clients do not move (lr 1e-12).
    frozen = run(
        RunConfig().override(_dirichlet_overrides(tmp_path / "frozen", **{"train.lr": 1e-12, "train.rounds": 1}))
    )
    initial_accuracy = frozen.history[0]["accuracy"]
    # Execute
    result = run(
        RunConfig().override(
            _dirichlet_overrides(
                tmp_path / "paper",
                **{"algorithm.name": "fedawa", "algorithm.params.fidelity": "paper", "train.rounds": 10},
            )
        )
    )
    # Assert: no client takes half the weight in any round, and the global model learns.
    assert max(r["server_fedawa_max_weight"] for r in result.history) < 0.5
    assert result.best_accuracy > initial_accuracy + 0.1


@pytest.mark.parametrize("algorithm", ["fedawa", "fedawa_l", "fedprox", "sgdm"])
def test_mixed_architectures_are_refused_before_the_run_directory_exists(tmp_path, algorithm: str) -> None:
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": algorithm,
                "model.client_models": ["cnn4", "cnn5"],
                "data.options": {"num_samples": 200},
            },
        )
    )
    with pytest.raises(ConfigError, match=rf"algorithm\.name='{algorithm}' averages whole models"):
        run(config)
    assert not (tmp_path / "run").exists()


def test_fedawa_with_one_client_runs_with_weight_one(tmp_path) -> None:
    result = run(
        RunConfig().override(
            tiny_overrides(
                tmp_path / "run",
                **{
                    "algorithm.name": "fedawa",
                    "data.num_clients": 1,
                    "data.partition": "dirichlet",
                    "data.options": {"num_samples": 200},
                    "train.rounds": 1,
                },
            )
        )
    )
    assert result.history[0]["server_fedawa_max_weight"] == 1.0 and not math.isnan(result.final_accuracy)


def test_initial_weights_of_another_method_are_known_in_a_fresh_process() -> None:
    # FedDisco registers its weights from its own module: a process that imported nothing else knows them.
    import subprocess
    import sys

    code = (
        "import rayfed; c = rayfed.RunConfig().override({'algorithm.name': 'fedawa', "
        "'algorithm.params.initial_weights': 'feddisco'}); print(c.algorithm.params.initial_weights)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "feddisco"
