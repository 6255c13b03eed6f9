"""LG-FedAvg: each client keeps its own body (local representation); the head is averaged."""

from __future__ import annotations

import numpy as np
import torch

from rayfed.algorithms import RoundContext, sum_contributions
from rayfed.algorithms.common.body_head import PartialClient
from rayfed.algorithms.lgfedavg import LgFedAvgParams, LgFedAvgServer
from tests.algorithms.body_head_cases import (
    assert_local_parts_kept,
    job,
    run_logged,
    sampled_rows,
    tiny_problem,
    upload_trained,
)

torch.set_num_threads(1)


def test_server_averages_uploaded_heads_and_clients_keep_their_bodies() -> None:
    # Prepare: BatchNorm in the body, so its statistics stay local with it; 2 of 3 clients upload.
    flat, spec = tiny_problem(batchnorm=True)
    server = LgFedAvgServer(LgFedAvgParams(), spec, {"tiny": flat.state_numpy()})
    p = flat.layout.size
    body, head = flat.layout.slice_of("body"), flat.layout.slice_of("fc")
    rng = np.random.default_rng(1)
    states = rng.normal(size=(2, flat.state_size)).astype(np.float32)
    half = PartialClient(LgFedAvgParams(), spec)
    uploads, jobs = upload_trained(server, half, flat, states, (30, 10), whole_state=True)
    # Execute
    server.aggregate(RoundContext(0, 0, 0.1, np.array([0, 1])), sum_contributions(uploads))
    # Assert: head ← Σ n_i head_i / Σ n_i; each client keeps body parameters and buffers; the head travels.
    np.testing.assert_allclose(server.shared, (30 * states[0, head] + 10 * states[1, head]) / 40, rtol=1e-6)
    for client, state in zip(jobs, states):
        np.testing.assert_array_equal(client.state["local"], np.concatenate([state[body], state[p:]]))
    assert uploads[0].nbytes == (head.stop - head.start) * 4 + 8
    fresh = job(flat, 2)
    flat.load_state(half.evaluation(server.broadcast(), fresh))  # a client that never trained: the initial body
    np.testing.assert_array_equal(flat.state_numpy()[body], server.initial_local[: body.stop])
    np.testing.assert_allclose(flat.numpy()[head], server.shared)


def test_bodies_stay_local_head_is_shared_and_only_the_head_travels(tmp_path) -> None:
    # Prepare / Execute: 10 clients, half of them per round, 3 rounds.
    result, log = run_logged(tmp_path / "run", "lgfedavg", **{"engine.join_ratio": 0.5, "train.rounds": 3})
    layout = log.spec.layouts["cnn4"]
    head = layout.slice_of("fc")
    head_size = head.stop - head.start
    # Assert: bodies differ between clients and persist while a client sits out (partial participation).
    assert_local_parts_kept(log, "local", layout.size - head_size)
    heads = [state["shared"] for state in log.server]
    assert all(h.shape == (head_size,) for h in heads) and not np.array_equal(heads[0], heads[-1])
    # Bytes: the head both ways (plus the 8-byte weight up): ~1 % of the model.
    for r in range(3):
        for row in sampled_rows(log, r):
            assert (row["bytes_up"], row["bytes_down"]) == (head_size * 4 + 8, head_size * 4)
    assert all(h["num_evaluated"] == 10 for h in result.history)
