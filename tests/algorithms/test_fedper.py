"""FedPer: the body is averaged, each client's head stays with it."""

from __future__ import annotations

import numpy as np
import torch

from rayfed.algorithms import RoundContext, sum_contributions
from rayfed.algorithms.common.body_head import PartialClient
from rayfed.algorithms.fedper import FedPerParams, FedPerServer
from tests.algorithms.body_head_cases import (
    assert_local_parts_kept,
    job,
    run_logged,
    sampled_rows,
    tiny_problem,
    upload_trained,
)

torch.set_num_threads(1)


def test_server_averages_uploaded_bodies_and_clients_keep_their_heads() -> None:
    # Prepare: 3 clients, two of them (12 and 36 samples) upload trained models.
    flat, spec = tiny_problem()
    server = FedPerServer(FedPerParams(), spec, {"tiny": flat.state_numpy()})
    body, head = flat.layout.slice_of("body"), flat.layout.slice_of("fc")
    rng = np.random.default_rng(0)
    models = rng.normal(size=(2, flat.size)).astype(np.float32)
    half = PartialClient(FedPerParams(), spec)
    uploads, jobs = upload_trained(server, half, flat, models, (12, 36))
    # Execute
    server.aggregate(RoundContext(0, 0, 0.1, np.array([0, 1])), sum_contributions(uploads))
    # Assert: body ← Σ n_i body_i / Σ n_i; each client holds its own head; only the body travels.
    np.testing.assert_allclose(server.shared, (12 * models[0, body] + 36 * models[1, body]) / 48, rtol=1e-6)
    for client, model in zip(jobs, models):
        np.testing.assert_array_equal(client.state["local"], model[head])
    assert uploads[0].nbytes == (body.stop - body.start) * 4 + 8
    returning = job(flat, 1)
    returning.state = jobs[1].state
    flat.load_state(half.start(server.broadcast(), returning).model)
    np.testing.assert_allclose(flat.numpy()[body], server.shared)
    np.testing.assert_array_equal(flat.numpy()[head], models[1, head])


def test_heads_stay_local_body_is_shared_and_only_the_body_travels(tmp_path) -> None:
    # Prepare / Execute: 10 clients, half of them per round, 3 rounds.
    result, log = run_logged(tmp_path / "run", "fedper", **{"engine.join_ratio": 0.5, "train.rounds": 3})
    layout = log.spec.layouts["cnn4"]
    head = layout.slice_of("fc")
    body_size = layout.size - (head.stop - head.start)
    # Assert: heads differ between clients and persist while a client sits out (partial participation).
    assert_local_parts_kept(log, "local", head.stop - head.start)
    # The server holds one body, which changes every round.
    bodies = [state["shared"] for state in log.server]
    assert all(b.shape == (body_size,) for b in bodies) and not np.array_equal(bodies[0], bodies[-1])
    # Bytes: the body both ways (plus the 8-byte weight up).
    for r in range(3):
        for row in sampled_rows(log, r):
            assert (row["bytes_up"], row["bytes_down"]) == (body_size * 4 + 8, body_size * 4)
    assert all(h["num_evaluated"] == 10 for h in result.history)
