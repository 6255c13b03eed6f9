"""Ditto: a FedAvg global model, and a personal model per client trained with (λ/2)‖v − w^t‖²."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rayfed import ConfigError, RunConfig
from rayfed.algorithms.ditto import DittoClient, DittoModels, DittoParams
from tests.algorithms.body_head_cases import (
    assert_local_parts_kept,
    full_batch_gradient,
    job,
    run_logged,
    sampled_rows,
    tiny_problem,
)
from tests.algorithms.read_back import settled
from tests.conftest import train_client

torch.set_num_threads(1)


def test_personal_step_is_pulled_towards_the_rounds_global_model() -> None:
    # Prepare: global w^t and a different personal v_k; one full batch, so each epoch is one step.
    flat, spec = tiny_problem()
    w = flat.numpy()
    v = w + np.random.default_rng(0).normal(scale=0.3, size=w.size).astype(np.float32)
    client = job(flat, 0, lr=0.1)
    client.state = {"model": v}
    expected_v = v - 0.1 * (full_batch_gradient(flat, client, v) + 2.0 * (v - w))  # Algorithm 1, λ = 2
    expected_w = w - 0.1 * full_batch_gradient(flat, client, w)  # FedAvg's local step
    message = DittoModels(w, initial=np.zeros_like(w))
    half = DittoClient(DittoParams(lam=2.0), spec)
    # Execute
    train_client(half, message, client)
    upload = settled(half.upload(message, client), client)
    # Assert: v_k persisted, w_k left in the model and uploaded (weighted by n_k).
    np.testing.assert_allclose(client.state["model"], expected_v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(flat.numpy(), expected_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(upload.average(), expected_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(half.evaluation(message, client), client.state["model"])
    np.testing.assert_array_equal(half.global_model(message, client), w)
    # s = 0 personal epochs: the personal phase is left out, and the client trains FedAvg's phase only.
    (only,) = DittoClient(DittoParams(lam=2.0, personal_epochs=0), spec).phases(message, client)
    assert only.model is None and only.loss is None and only.epochs == client.train.local_epochs


def test_lambda_is_checked() -> None:
    with pytest.raises(ConfigError, match=re.escape("algorithm.params.lam must be a finite number >= 0")):
        RunConfig().override({"algorithm.name": "ditto", "algorithm.params.lam": -1.0})


def test_personal_models_stay_local_and_larger_lambda_keeps_them_closer_to_global(tmp_path) -> None:
    # Prepare / Execute: λ = 0 (purely local personal models) and λ = 20, half the clients per round.
    runs = {
        lam: run_logged(tmp_path / f"lam{lam}", "ditto", {"lam": lam}, **{"engine.join_ratio": 0.5})
        for lam in (0.0, 20.0)
    }
    distance = {}
    for lam, (result, log) in runs.items():
        state_size = log.server[0]["global"].size
        # Assert: personal models persist, differ between clients, and are kept while a client sits out.
        assert_local_parts_kept(log, "model", state_size)
        # The whole global model travels both ways; the personal model never does.
        for r in range(2):
            for row in sampled_rows(log, r):
                assert (row["bytes_up"], row["bytes_down"]) == (state_size * 4 + 8, state_size * 4)
        # Distance of round 2's personal models to that round's anchor, the global model after round 1.
        anchor = log.server[0]["global"]
        trained = [row["client_id"] for row in sampled_rows(log, 1)]
        gaps = [np.linalg.norm(log.states[1][cid]["model"] - anchor) for cid in trained]
        assert min(gaps) > 0
        distance[lam] = float(np.mean(gaps))
        assert all(0.0 <= r["global_accuracy"] <= 1.0 for r in result.history)
    assert distance[20.0] < 0.8 * distance[0.0], distance
