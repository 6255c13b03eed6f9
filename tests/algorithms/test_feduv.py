"""FedUV: the variance hinge and the uniformity loss against direct computations, the features the
client half reads, and short end-to-end runs against FedAvg on the offline synthetic dataset."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import ConfigError, RunConfig
from rayfed.algorithms.common.global_model import GlobalModel
from rayfed.algorithms.feduv import FedUVClient, FedUVParams, uniformity_loss, variance_loss, variance_target
from rayfed.config import TrainConfig
from rayfed.engine import Simulation
from rayfed.engine.callbacks import Callback
from rayfed.train.phase import Batch, Constants, Outputs, Params
from tests.algorithms.tiny_problem import tiny_problem
from tests.conftest import client_job, tiny_overrides, train_phases

torch.set_num_threads(1)


# --- the two regularisers against direct computations -------------------------------------------


def _std(column: list[float]) -> float:
    mean = sum(column) / len(column)
    return math.sqrt(sum((v - mean) ** 2 for v in column) / (len(column) - 1))


def test_variance_target_is_the_std_of_one_hot_outputs() -> None:
    for k in (2, 10, 100):
        assert variance_target(k) == pytest.approx(_std([1.0] + [0.0] * (k - 1)))


def test_variance_hinge_equals_direct_computation() -> None:
    # Prepare: 5 samples, 4 classes; class 3's probabilities barely vary, so its hinge is active.
    torch.manual_seed(0)
    logits = torch.randn(5, 4) * torch.tensor([3.0, 3.0, 0.5, 0.0])
    gamma = variance_target(4)
    # Execute
    loss = variance_loss(logits, gamma)
    # Assert: (1/K) Σ_c max(0, γ − std_b p_bc), std unbiased.
    p = torch.softmax(logits, dim=1).tolist()
    direct = sum(max(0.0, gamma - _std([row[c] for row in p])) for c in range(4)) / 4
    assert float(loss) == pytest.approx(direct, rel=1e-5)
    assert float(loss) > 0
    assert float(variance_loss(logits[:1], gamma)) == 0.0  # one sample: no std, no term


def _pairs(z: np.ndarray) -> list[float]:
    return [float(((z[i] - z[j]) ** 2).sum()) for i, j in itertools.combinations(range(len(z)), 2)]


def test_uniformity_code_form_equals_direct_computation() -> None:
    # Prepare
    z = np.random.default_rng(1).normal(size=(6, 3))
    # Execute
    loss = uniformity_loss(torch.tensor(z), "code")
    # Assert: mean over pairs of exp(−d²/σ²), σ² = the (lower) median of the non-zero d².
    d2 = _pairs(z)
    sigma = sorted(d2)[(len(d2) - 1) // 2]
    assert float(loss) == pytest.approx(np.mean([math.exp(-d / sigma) for d in d2]), rel=1e-6)


def test_uniformity_paper_form_equals_direct_computation() -> None:
    z = np.random.default_rng(2).normal(size=(5, 4))
    loss = uniformity_loss(torch.tensor(z), "paper", temperature=2.0)
    unit = z / np.linalg.norm(z, axis=1, keepdims=True)
    direct = math.log(np.mean([math.exp(-2.0 * d) for d in _pairs(unit)]))
    assert float(loss) == pytest.approx(direct, rel=1e-6)
    # Spread-out points have a lower potential than clustered ones.
    clustered = torch.tensor(z[:1]).repeat(5, 1) + 0.01 * torch.tensor(z)
    assert float(uniformity_loss(clustered, "paper")) > float(loss)


def test_client_adds_both_terms_on_the_penultimate_features() -> None:
    # Prepare: one mini-batch of 6 samples holding the whole client; lr 0 (loss only).
    flat, spec = tiny_problem(1, 3)
    x, y = torch.randn(6, 3), torch.tensor([0, 0, 1, 1, 2, 2])
    job = client_job(flat, x, y, train=TrainConfig(lr=1e-9, batch_size=6))
    params = FedUVParams(variance_coeff=2.5, uniformity_coeff=0.5)
    seen: list[torch.Tensor] = []
    client = FedUVClient(params, spec)
    (phase,) = client.phases(GlobalModel(flat.numpy()), job)

    def spy(out: Outputs, batch: Batch, weights: Params, constants: Constants) -> torch.Tensor:
        term = client.regularisers(out, batch, weights, constants)
        seen.append(term.detach())
        assert out.features is not None
        seen.append(2.5 * variance_loss(out.logits, variance_target(3)) + 0.5 * uniformity_loss(out.features, "code"))
        return term

    # Execute: as a worker trains it, whose loop knows the output layer and hands the term what it reads.
    train_phases(job, [dataclasses.replace(phase, loss=spy)], output_layers={job.architecture: "fc"})
    # Assert: the term is λL_V + μL_U with the features the output layer read (relu(body(x)) up to order).
    assert len(seen) == 2
    torch.testing.assert_close(seen[0], seen[1].detach())
    features = torch.relu(flat.module.body(x)).detach()
    with torch.no_grad():
        logits = flat.module(x)
    assert float(uniformity_loss(features, "code")) == pytest.approx(
        float((seen[0] - 2.5 * variance_loss(logits, variance_target(3))) / 0.5), rel=1e-3
    )
    assert not flat.module.fc._forward_pre_hooks  # the loop's capture is removed after training


def test_invalid_params_name_the_field() -> None:
    with pytest.raises(ConfigError, match="algorithm.params.variance_coeff"):
        FedUVParams(variance_coeff=-1.0)
    with pytest.raises(ConfigError, match="algorithm.params.fidelity"):
        FedUVParams(fidelity="both")  # type: ignore[arg-type]


# --- end to end ------------------------------------------------------------------------------------


class _Global(Callback):
    def __init__(self) -> None:
        self.rounds: list[np.ndarray] = []

    def after_round(self, run, record, clients) -> bool:
        self.rounds.append(np.array(run.server_state()["global"]))
        return False


def _run(tmp_path, name: str, **extra: object) -> tuple[Simulation, _Global]:
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / name,
            **{
                "algorithm.name": name,
                "data.options": {"num_samples": 1200},
                "train.rounds": 2,
                "engine.checkpoint_every": 0,
                **extra,
            },
        )
    )
    states = _Global()
    sim = Simulation(config, callbacks=[states])
    sim.run()
    return sim, states


def test_regularisers_change_fedavgs_updates_and_the_run_learns(tmp_path) -> None:
    # Prepare / Execute: FedAvg and FedUV from the same seed, data and batches.
    # lr 0.05: measured accuracy after rounds 1/2, FedAvg 0.20/0.45, FedUV 0.28/0.27; CE 1.3/1.1 for both.
    fedavg, avg_states = _run(tmp_path, "fedavg", **{"train.lr": 0.05})
    feduv, uv_states = _run(tmp_path, "feduv", **{"train.lr": 0.05})
    # Assert: different global models from round 1 on; FedUV beats chance (0.1); FedAvg's bytes.
    assert not np.allclose(avg_states.rounds[0], uv_states.rounds[0], atol=1e-4)
    assert max(r["accuracy"] for r in feduv.history) > 0.2 and feduv.history[-1]["train_loss"] < 1.6
    size = avg_states.rounds[0].size
    for row in pq.read_table(tmp_path / "feduv" / "clients").to_pylist():
        assert row["bytes_up"] == size * 4 + 8 and row["bytes_down"] == size * 4


def test_zero_coefficients_reduce_to_fedavg(tmp_path) -> None:
    _, avg_states = _run(tmp_path, "fedavg", **{"train.rounds": 1})
    _, uv_states = _run(
        tmp_path,
        "feduv",
        **{"train.rounds": 1, "algorithm.params.variance_coeff": 0.0, "algorithm.params.uniformity_coeff": 0.0},
    )
    np.testing.assert_allclose(uv_states.rounds[0], avg_states.rounds[0], rtol=1e-5, atol=1e-6)


def test_partial_participation_works(tmp_path) -> None:
    sim, _ = _run(tmp_path, "feduv", **{"engine.join_ratio": 0.5, "algorithm.params.fidelity": "paper"})
    assert all(r["num_sampled"] == 5 and r["num_evaluated"] == 10 for r in sim.history)
    assert sim.history[-1]["server_clients_aggregated"] == 5.0
    assert np.isfinite(sim.history[-1]["train_loss"])
