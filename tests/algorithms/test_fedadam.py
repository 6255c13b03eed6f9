"""FedAdam: the server's Adam step on the pseudo-gradient, against a direct computation and end to end."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from rayfed import RunConfig
from rayfed.algorithms import RoundContext, WeightedSum, sum_contributions
from rayfed.algorithms.fedadam import FedAdamParams, FedAdamServer
from rayfed.engine import Simulation, run
from rayfed.execution.client_runner import ClientRunner
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.conftest import tiny_overrides

LAYOUT = ParamLayout(("w", "b"), ((2, 2), (2,)), (0, 4, 6))
BUFFERS = ParamLayout(("running_mean",), ((2,),), (0, 2))


def _spec(num_clients: int = 3) -> ProblemSpec:
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


def _ctx(ids: list[int]) -> RoundContext:
    return RoundContext(round=0, seed=0, lr=0.1, sampled=np.array(ids))


def test_two_server_steps_match_adam_written_out() -> None:
    # Prepare: a global state (6 parameters, 2 buffer entries) and two rounds of three uploads.
    rng = np.random.default_rng(0)
    theta = rng.normal(size=8).astype(np.float32)
    params = FedAdamParams(server_lr=0.5, beta1=0.8, beta2=0.95, tau=1e-3)
    server = FedAdamServer(params, _spec(), {"m": theta})
    m, v, expected = np.zeros(6), np.zeros(6), theta.astype(np.float64)
    for _ in range(2):
        models = rng.normal(size=(3, 8)).astype(np.float32)
        sizes = np.array([10.0, 30.0, 60.0])
        average = (sizes[:, None] * models).sum(axis=0) / sizes.sum()
        delta = average[:6] - expected[:6]
        m = 0.8 * m + 0.2 * delta
        v = 0.95 * v + 0.05 * delta**2
        expected = np.concatenate([expected[:6] + 0.5 * m / (np.sqrt(v) + 1e-3), average[6:]])
        # Execute
        server.aggregate(_ctx([0, 1, 2]), sum_contributions(WeightedSum.of(x, n) for x, n in zip(models, sizes)))
        # Assert: parameters follow Adam without bias correction; buffers are the plain average.
        np.testing.assert_allclose(server.global_vector, expected, rtol=1e-4, atol=1e-5)
    state = server.state_dict()  # the optimiser's moments are saved with θ_g
    np.testing.assert_allclose(state["m"], m, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state["v"], v, rtol=1e-4, atol=1e-8)


def test_first_round_moves_every_trained_parameter_by_about_the_server_lr(tmp_path) -> None:
    # Prepare: real uploads of 4 trained clients; η = 1, the baseline code's flag default.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "fedadam",
                "data.num_clients": 4,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 600},
                "train.lr": 0.05,
                "algorithm.params.server_lr": 1.0,
            },
        )
    )
    sim = Simulation(config)
    server = FedAdamServer(config.algorithm.params, sim.spec, sim.initial)
    before = server.global_vector.copy()
    upload = (
        ClientRunner(config, sim.spec, sim.dataset, sim.partition)
        .train(server.broadcast(), RoundContext(0, 0, config.train.lr, np.arange(4)), [0, 1, 2, 3])
        .contribution
    )
    # Execute
    server.aggregate(RoundContext(0, 0, config.train.lr, np.arange(4)), upload)
    # Assert: m/√v = 0.1Δ/(√0.01·|Δ|) = ±1 where |Δ| ≫ τ: a sign step of size η = 1, FedAdam's hallmark
    # (the FedAvg average would move them by |Δ|, orders of magnitude less).
    p = server.num_params
    delta = upload.average()[:p] - before[:p]
    step = server.global_vector[:p] - before[:p]
    np.testing.assert_allclose(step, 0.1 * delta / (0.1 * np.abs(delta) + 1e-5), rtol=1e-3, atol=1e-6)
    big = np.abs(delta) > 5e-3
    assert big.sum() > 100
    np.testing.assert_allclose(np.abs(step[big]), 1.0, rtol=0.02)
    assert np.median(np.abs(step)) > 10 * np.median(np.abs(delta))


def test_partial_participation_runs_and_bytes_are_whole_models(tmp_path) -> None:
    # Prepare: 6 clients, half of them per round.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "fedadam",
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
    # Assert: 3 clients per round, each receiving its state and sending it with its weight (8 bytes).
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    sampled = [c for c in clients if c["sampled"]]
    assert len(sampled) == 6 and all(np.isfinite(result.accuracies))
    assert all(c["bytes_up"] == 4 * size + 8 and c["bytes_down"] == 4 * size for c in sampled)


def test_the_default_server_lr_learns_where_the_flag_default_of_one_collapses(tmp_path) -> None:
    # Prepare: the same 10 clients, 3 rounds, with the default η = 0.01 and with η = 1.
    def final_accuracy(name: str, **params: float) -> float:
        config = RunConfig().override(
            tiny_overrides(
                tmp_path / name,
                **{
                    "algorithm.name": "fedadam",
                    "data.options": {"num_samples": 3000},  # enough steps for 3 rounds to learn
                    "data.partition": "dirichlet",
                    "data.alpha": 0.5,
                    "train.rounds": 3,
                    "train.lr": 0.05,
                    "algorithm.params": params,
                },
            )
        )
        return run(config).accuracies[-1]

    # Execute
    default, one = final_accuracy("default"), final_accuracy("one", server_lr=1.0)
    # Assert: η = 1 moves every weight by about ±1 a round and ends at chance (10 classes); the default learns.
    assert one < 0.2 < default and default > 2 * one
