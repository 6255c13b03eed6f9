"""KT-pFL: personalised soft targets c @ predictions on a public set, distillation towards them, +weight."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import RunConfig
from rayfed.algorithms.common.own_models import ClientInit
from rayfed.algorithms.hooks import RoundContext
from rayfed.algorithms.ktpfl import KTpFLClient, KTpFLMessage, KTpFLParams, KTpFLServer, code_pairing
from rayfed.algorithms.ktpfl_equations import personalised_targets, update_coefficients
from rayfed.engine import Simulation
from rayfed.execution.client_runner import ClientRunner
from rayfed.util.errors import ConfigError
from tests.conftest import tiny_overrides


def _overrides(run_dir, **extra: object) -> dict[str, object]:
    base = {
        "algorithm.name": "ktpfl",
        "algorithm.params": {"public_size": 100},
        "data.num_clients": 5,
        "data.options": {"num_samples": 900},
    }
    return tiny_overrides(run_dir, **{**base, **extra})


def test_targets_are_c_times_predictions_over_the_clients_seen() -> None:
    # Prepare: 4 clients, 3 public samples, 2 classes; client 3 has not uploaded yet.
    rng = np.random.default_rng(0)
    c = rng.random((4, 4))
    preds = rng.dirichlet(np.ones(2), size=(4, 3)).astype(np.float32)
    seen = np.array([True, True, True, False])
    # Execute
    targets = personalised_targets(torch.tensor(c), torch.tensor(preds, dtype=torch.float64), torch.tensor(seen))
    # Assert: t_n = Σ_{m seen} c_nm s_m / Σ_{m seen} c_nm, for every client n (the unseen one included).
    for n in range(4):
        direct = sum(c[n, m] * preds[m] for m in range(3)) / c[n, :3].sum()
        np.testing.assert_allclose(targets[n].numpy(), direct, rtol=1e-6)


def test_coefficients_grow_between_clients_that_predict_alike() -> None:
    # Prepare: clients 0-1 predict class 0, clients 2-3 class 1; c starts uniform.
    group = np.array([[0.9, 0.1], [0.1, 0.9]], dtype=np.float32)
    preds = np.stack([np.repeat(group[g][None], 5, axis=0) for g in (0, 0, 1, 1)])
    # Execute
    c, _ = update_coefficients(np.full((4, 4), 0.25), preds, np.ones(4, bool), lr=0.05, penalty=0.6, steps=20)
    c_code, _ = update_coefficients(
        np.full((4, 4), 0.25), preds, np.ones(4, bool), lr=0.5, penalty=0.6, steps=20, rule="code"
    )
    same = np.full((4, 4), 0.25)
    c_same, loss_same = update_coefficients(
        same, np.repeat(preds[:1], 4, axis=0), np.ones(4, bool), lr=0.05, penalty=0.6, steps=5
    )
    # Assert: knowledge flows within the groups; with identical predictions nothing moves c off 1/M.
    assert c[0, 1] > c[0, 2] and c[2, 3] > c[2, 0]
    assert c_code[0, 1] > c_code[0, 2] and c_code[2, 3] > c_code[2, 0]
    np.testing.assert_allclose(c_same, same, atol=1e-12)
    assert loss_same == pytest.approx(0.0, abs=1e-9)


def test_distillation_moves_a_clients_public_predictions_towards_its_target(tmp_path) -> None:
    # Prepare: client 0 gets the target "class k*" on every public sample, for a class it does not hold.
    config = RunConfig().override(
        _overrides(
            tmp_path / "run",
            **{
                "algorithm.params": {"public_size": 100, "distill_epochs": 3, "fidelity": "paper"},
                "train.local_epochs": 1,
            },
        )
    )
    sim = Simulation(config)
    runner = ClientRunner(config, sim.spec, sim.dataset, sim.partition)
    k_star = int(np.flatnonzero(sim.partition.label_counts[0] == 0)[0])
    m, p, k = sim.spec.num_clients, len(sim.spec.held_out), sim.spec.num_classes
    targets = np.zeros((m, p, k), dtype=np.float32)
    targets[:, :, k_star] = 1.0
    ctx = RoundContext(round=1, seed=0, lr=config.train.lr, sampled=np.arange(m))
    # Execute: the same client, from the same model and batches, with and without the target.
    with_target = runner.train(KTpFLMessage(ClientInit.of(sim.spec), targets), ctx, [0]).contribution
    without = runner.train(KTpFLMessage(ClientInit.of(sim.spec), None), ctx, [0]).contribution
    # Assert: the shared public set reaches the worker, and the distilled predictions put more mass on k*.
    assert runner.spec.held_out is not None
    pulled = with_target.matrix().reshape(p, k)[:, k_star].mean()
    alone = without.matrix().reshape(p, k)[:, k_star].mean()
    assert pulled > alone + 0.01


def test_code_as_written_pairs_images_with_other_targets_and_feeds_the_codes_input_scales(tmp_path) -> None:
    # Prepare: the public set of a run, and the three fidelities' clients.
    sim = Simulation(RunConfig().override(_overrides(tmp_path / "run")))
    raw = torch.as_tensor(sim.spec.held_out.inputs).float()

    def inputs(fidelity: str) -> tuple[torch.Tensor, torch.Tensor]:
        return KTpFLClient(KTpFLParams(public_size=100, fidelity=fidelity), sim.spec).public_inputs(torch.device("cpu"))

    # Execute / Assert: as written, the images are distilled on as raw 0-255 values and predicted on as ToTensor's
    # [0, 1]; corrected (the default, digested as the old name "code") normalises both as the clients' data.
    distilled, predicted = inputs("code")
    torch.testing.assert_close(distilled, raw)
    torch.testing.assert_close(predicted, raw / 255)
    normalised, same = inputs("corrected")
    assert same is normalised and float(normalised.min()) >= -1.0 and float(normalised.max()) <= 1.0
    assert KTpFLParams().fidelity == "corrected" and KTpFLParams(fidelity="code").rule == "code"
    # The pairing: one permutation per round for every client, a new one the next round.
    first, again, later = code_pairing(100, 0, 3), code_pairing(100, 0, 3), code_pairing(100, 0, 4)
    assert sorted(first.tolist()) == list(range(100)) and np.array_equal(first, again)
    assert not np.array_equal(first, later) and (first != np.arange(100)).mean() > 0.9


def test_bytes_and_partial_participation(tmp_path) -> None:
    # Prepare: half the clients per round, 100 public samples x 10 classes.
    config = RunConfig().override(_overrides(tmp_path / "run", **{"engine.join_ratio": 0.4}))
    # Execute
    result = Simulation(config).run()
    # Assert: up = P*K floats + id + size; down = nothing in round 0, then the client's own P*K target.
    clients = [c for c in pq.read_table(tmp_path / "run" / "clients").to_pylist() if c["sampled"]]
    assert all(c["bytes_up"] == 100 * 10 * 4 + 16 for c in clients)
    assert {c["bytes_down"] for c in clients if c["round"] == 0} == {0}
    assert {c["bytes_down"] for c in clients if c["round"] == 1} == {100 * 10 * 4}
    assert [r["server_clients_aggregated"] for r in result.history] == [2.0, 2.0]


def test_weight_variant_sends_models_and_needs_one_architecture(tmp_path) -> None:
    # Prepare
    config = RunConfig().override(
        _overrides(tmp_path / "run", **{"algorithm.params": {"public_size": 100, "share_weights": True}})
    )
    sim = Simulation(config)
    # Execute
    sim.run()
    # Assert: model + predictions up, the personalised model down; heterogeneous models are refused.
    state = sim.initial[sim.spec.default_architecture].nbytes
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    assert all(c["bytes_up"] == 100 * 10 * 4 + state + 16 and c["bytes_down"] == state for c in clients if c["sampled"])
    two = dataclasses.replace(sim.spec, layouts={"a": sim.spec.layouts[sim.spec.default_architecture], "b": None})
    with pytest.raises(ConfigError, match="ktpfl"):
        KTpFLServer.validate(KTpFLParams(share_weights=True), two)
