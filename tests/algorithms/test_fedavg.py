"""FedAvg and FedProx halves on tiny hand-computed cases, FedProx's effect end to end, display labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rayfed import RunConfig, run
from rayfed.algorithms import ALGORITHMS, RoundContext, WeightedSum, resolve, sum_contributions
from rayfed.algorithms.common.proximal import proximal_term
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.engine.callbacks import Callback
from rayfed.engine.inputs import RunInputs
from rayfed.execution.server import Server
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.conftest import tiny_overrides


def _spec(size: int) -> ProblemSpec:
    layout = ParamLayout(("w",), ((size,),), (0, size))
    return ProblemSpec(4, 2, (1, 2, 2), {"m": layout}, {"m": ("w",)}, {"m": "w"}, default_architecture="m")


def _ctx() -> RoundContext:
    return RoundContext(round=0, seed=0, lr=0.1, sampled=np.arange(3))


def test_fedavg_aggregate_equals_hand_computed_weighted_mean() -> None:
    # Prepare: three clients with 1, 2 and 5 training samples.
    models = [np.array([1.0, 0.0], np.float32), np.array([3.0, 2.0], np.float32), np.array([0.0, 8.0], np.float32)]
    sizes = [1, 2, 5]
    server = FedAvgServer(None, _spec(2), {"m": np.zeros(2, np.float32)})
    # Execute
    server.aggregate(_ctx(), sum_contributions(WeightedSum.of(m, n) for m, n in zip(models, sizes)))
    # Assert: (1*[1,0] + 2*[3,2] + 5*[0,8]) / 8 = [7/8, 44/8]
    np.testing.assert_allclose(server.global_vector, [7 / 8, 44 / 8], rtol=1e-6)


def test_partial_sums_merge_in_any_order() -> None:
    rng = np.random.default_rng(0)
    parts = [WeightedSum.of(rng.normal(size=5).astype(np.float32), n) for n in (3, 1, 4, 1, 5)]
    left = sum_contributions([parts[0] + parts[1], parts[2] + parts[3] + parts[4]])
    right = sum_contributions([parts[4] + parts[2], parts[1] + parts[3], parts[0]])
    np.testing.assert_allclose(left.average(), right.average(), rtol=1e-6)
    assert left.count == right.count == 5 and left.weight == right.weight == 14


@pytest.mark.parametrize("name", ["fedavg", "cfl", "fedproto", "local"])
def test_a_round_without_an_upload_keeps_the_state_and_is_answered_by_the_server(name: str, tmp_path: Path) -> None:
    # Prepare: the server of a run; its half would fail on a missing contribution, so the server must not call it.
    config = RunConfig().override(tiny_overrides(tmp_path, **{"algorithm.name": name}))
    inputs = RunInputs.prepare(config, resolve(config.algorithm), tmp_path, continues=False)
    server = Server(config, inputs.spec, inputs.initial)
    before = {k: v.copy() for k, v in server.state_dict().items()}
    server.half.aggregate = None  # type: ignore[assignment]  # any call would raise
    # Execute: the round's calls all failed (no contribution).
    metrics = server.aggregate(_ctx(), None, None)
    # Assert
    assert metrics == {"clients_aggregated": 0.0, "server_bytes_received": 0.0}
    after = server.state_dict()
    assert sorted(after) == sorted(before) and all(np.array_equal(after[k], before[k]) for k in before)


def test_weighted_sum_flags_non_finite_values() -> None:
    assert not WeightedSum.of(np.array([np.nan], np.float32), 1).is_finite()
    assert WeightedSum.of(np.array([1.0], np.float32), 1).is_finite()


def test_proximal_term_value_and_gradient() -> None:
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    anchor = torch.tensor([0.0, 0.0])
    term = proximal_term([w], anchor, mu=0.5)
    term.backward()
    assert float(term.detach()) == pytest.approx(0.25 * 5)
    torch.testing.assert_close(w.grad, 0.5 * w.detach())


def test_proximal_term_of_a_cnn_matches_the_flat_vectors() -> None:
    # The flat vector stores conv kernels channels-last; the term must pair each weight with its own anchor, the
    # round's start as the loop hands it over (the parameters in logical order).
    from rayfed.algorithms.fedprox import FedProxClient, FedProxParams
    from rayfed.train.flat import FlatModel
    from rayfed.train.stack_layout import logical_rows

    torch.manual_seed(0)
    flat = FlatModel(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(16, 2)))
    client = FedProxClient(FedProxParams(mu=0.5), None)  # type: ignore[arg-type]  # the term reads no spec
    start = flat.vector.detach().clone()
    constants = {"start": logical_rows(start.unsqueeze(0), flat.layout)[0]}
    assert float(client.proximal(None, None, flat.params, constants).detach()) == 0.0  # type: ignore[arg-type]
    delta = torch.randn_like(start)
    flat.load(start + delta)
    term = client.proximal(None, None, flat.params, constants)  # type: ignore[arg-type]
    assert float(term.detach()) == pytest.approx(0.25 * float(delta.pow(2).sum()), rel=1e-5)
    term.backward()  # ∂/∂w = μ (w − w_g), in the flat vector's own order
    torch.testing.assert_close(flat.grad, 0.5 * delta, rtol=1e-4, atol=1e-5)


class _UpdateNorms(Callback):
    """‖θ_i − θ_start‖ of every client that trained, per round: ``rounds[t][client_id]``."""

    def __init__(self) -> None:
        self.rounds: list[dict[int, float]] = []

    def after_round(self, run, record, clients) -> bool:
        table = clients.to_pydict()
        self.rounds.append({c: n for c, n, s in zip(table["client_id"], table["update_norm"], table["sampled"]) if s})
        return False


def _update_norms(tmp_path, name: str, **extra: object) -> _UpdateNorms:
    norms = _UpdateNorms()
    run(
        RunConfig().override(tiny_overrides(tmp_path / name, **{"engine.checkpoint_every": 0, **extra})),
        callbacks=[norms],
    )
    return norms


def test_fedprox_with_a_large_mu_keeps_client_updates_near_the_global_model(tmp_path) -> None:
    # Prepare / execute: FedAvg and FedProx (μ = 10) on the same data, seed and starting model.
    data = {"data.options": {"num_samples": 3000}}  # 22 local steps: the proximal pull has steps to act over
    fedavg = _update_norms(tmp_path, "fedavg", **{"algorithm.name": "fedavg", **data})
    fedprox = _update_norms(tmp_path, "fedprox", **{"algorithm.name": "fedprox", "algorithm.params.mu": 10.0, **data})
    # Assert: in round 0 every client starts from the same model and sees the same batches, so the
    # proximal term (μ/2)‖w − w_g‖² alone makes each client's update smaller, and clearly so on
    # average (measured: 0.54-0.80 of FedAvg's per client, 0.60 and 0.63 on average in rounds 0 and 1).
    first_avg, first_prox = fedavg.rounds[0], fedprox.rounds[0]
    assert first_avg.keys() == first_prox.keys() and len(first_avg) == 10
    assert all(first_prox[c] < 0.9 * first_avg[c] for c in first_avg), (first_prox, first_avg)
    assert len(fedavg.rounds) == len(fedprox.rounds) == 2
    for avg, prox in zip(fedavg.rounds, fedprox.rounds):
        assert np.mean(list(prox.values())) < 0.75 * np.mean(list(avg.values()))


@pytest.mark.parametrize(
    ("name", "params", "label"),
    [
        ("fedavg", {}, "FedAvg"),
        ("fedprox", {"mu": 0.1}, "FedProx"),
        ("local", {}, "Local"),
        ("sgdm", {}, "FedAvg (SGDM)"),
        ("fedclassavg", {}, "FedClassAvg"),
        ("fedclassavg", {"mode": "weight"}, "FedClassAvg+weight"),
        ("cwfedavg", {}, "cwFedAvg (Output)"),
        ("cwfedavg", {"variant": "dist", "classwise_blocks": 0}, "cwFedAvg w/ Dist. (all layers)"),
        ("cwfedavg", {"variant": "no_wdr", "classwise_blocks": 3}, "cwFedAvg w/o WDR (Conv2+FC+Output)"),
        ("cwfedavg", {"classwise_layers": ["last_feat", "fc"]}, "cwFedAvg (last_feat+fc)"),
    ],
)
def test_each_algorithm_names_itself_in_figures(name: str, params: dict[str, object], label: str) -> None:
    config = RunConfig().override({"algorithm.name": name, **{f"algorithm.params.{k}": v for k, v in params.items()}})
    assert ALGORITHMS.get(name).label(config.algorithm.params) == label
