"""FedBABU: only the body is trained and averaged, the head stays at its initialisation, and each
client fine-tunes the whole model on its training split before it is evaluated."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.algorithms.fedbabu import FedBabuClient, FedBabuParams, FedBabuServer
from rayfed.train.job import ClientJob
from tests.algorithms.body_head_cases import job, run_logged, sampled_rows, tiny_problem
from tests.conftest import train_client, train_phases

torch.set_num_threads(1)


def test_training_never_moves_the_head() -> None:
    # Prepare: several steps with momentum and weight decay, which would move a head that only had no gradient.
    flat, spec = tiny_problem()
    head = flat.layout.slice_of("fc")
    client = job(flat, 0, n=20, batch_size=5, local_epochs=2, momentum=0.9, weight_decay=0.01)
    start = flat.numpy()
    message = FedBabuServer(FedBabuParams(), spec, {"tiny": flat.state_numpy()}).broadcast()
    # Execute
    _, steps = train_client(FedBabuClient(FedBabuParams(), spec), message, client)
    # Assert
    np.testing.assert_array_equal(flat.numpy()[head], start[head])
    assert not np.array_equal(flat.numpy(), start) and steps == 8


def test_evaluation_fine_tunes_the_whole_model_from_global_body_and_initial_head() -> None:
    # Prepare: a server whose body has moved; one fine-tuning epoch of one full batch.
    flat, spec = tiny_problem()
    initial = flat.state_numpy()
    server = FedBabuServer(FedBabuParams(finetune_epochs=1), spec, {"tiny": initial})
    server.shared = server.shared + 0.5
    message = server.broadcast()
    half = FedBabuClient(FedBabuParams(finetune_epochs=1), spec)

    def evaluation_job() -> ClientJob:  # a worker builds a fresh job (its own generator) for each evaluation
        fresh = job(flat, 0, lr=0.1)
        fresh.state = {"untouched": np.ones(2, np.float32)}
        return fresh

    def prepare(client: ClientJob) -> None:  # as a worker loads the evaluation model and fine-tunes it
        flat.load_state(half.evaluation(message, client))
        train_phases(client, half.fine_tuning(message, client))

    client = evaluation_job()
    body, head = flat.layout.slice_of("body"), flat.layout.slice_of("fc")
    # Execute: the global model, then the personalised one (twice).
    flat.load_state(half.global_model(message, client))
    global_model = flat.numpy()
    flat.zero_grad()
    F.cross_entropy(flat.module(client.x_train), client.y_train).backward()
    expected = global_model - 0.1 * flat.grad.numpy()
    prepare(client)
    first = flat.numpy()
    prepare(evaluation_job())
    # Assert: global = averaged body + h_0; personalised = one SGD step on everything from it, reproducibly.
    np.testing.assert_allclose(global_model[body], server.shared)
    np.testing.assert_array_equal(global_model[head], initial[head])
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(flat.numpy(), first)
    assert set(client.state) == {"untouched"} and half.shared_body(message, [client]) is None
    assert half.bytes_down(message, client) == (body.stop - body.start) * 4
    # Without fine-tuning, no phase: the evaluated model is the global model.
    assert FedBabuClient(FedBabuParams(finetune_epochs=0), spec).fine_tuning(message, client) == []


def test_fine_tuning_personalises_and_only_the_body_travels(tmp_path) -> None:
    # Prepare / Execute: half the clients per round; one fine-tuning epoch before each evaluation.
    tuned, log = run_logged(tmp_path / "tuned", "fedbabu", {"finetune_epochs": 1}, **{"engine.join_ratio": 0.5})
    as_is, _ = run_logged(tmp_path / "as_is", "fedbabu", {"finetune_epochs": 0}, **{"train.rounds": 1})
    layout = log.spec.layouts["cnn4"]
    body_size = layout.slice_of("fc").start
    # Assert: only the body is kept by the server and sent, both ways.
    assert all(state["shared"].shape == (body_size,) for state in log.server)
    for r in range(2):
        for row in sampled_rows(log, r):
            assert (row["bytes_up"], row["bytes_down"]) == (body_size * 4 + 8, body_size * 4)
    # Fine-tuning on each client's train split (2 classes each) personalises far beyond the global model ...
    for record in tuned.history:
        assert record["num_evaluated"] == 10 and not math.isnan(record["global_accuracy"])
        assert record["acc_mean"] >= record["global_accuracy"] + 0.2
    # ... and without it the evaluated model is the global model.
    assert as_is.history[0]["accuracy"] == as_is.history[0]["global_accuracy"]
