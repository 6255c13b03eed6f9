"""FedRep: per round, τ_h epochs on the head (body frozen), then τ_b epochs on the body (head frozen);
the body is averaged, heads stay local."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rayfed import ConfigError, RunConfig
from rayfed.algorithms.common.body_head import PartialModels, part_phase, split_body_head
from rayfed.algorithms.fedrep import FedRepClient, FedRepParams, FedRepServer
from rayfed.config import TrainConfig
from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from tests.algorithms.body_head_cases import (
    assert_local_parts_kept,
    full_batch_gradient,
    job,
    run_logged,
    sampled_rows,
    tiny_problem,
)
from tests.conftest import client_job, train_client, train_phases

torch.set_num_threads(1)


def _message(flat: FlatModel, spec: ProblemSpec) -> PartialModels:
    """The first round's message: the body and head of the model in ``flat``, which a new client starts from."""
    return FedRepServer(FedRepParams(), spec, {"tiny": flat.state_numpy()}).broadcast()


def _samples_through(module: torch.nn.Module) -> list[int]:
    """A counter of the samples ``module``'s forward sees from now on (one entry per call)."""
    seen: list[int] = []
    module.register_forward_hook(lambda _m, inputs, _out: seen.append(int(inputs[0].shape[0])))
    return seen


def test_head_step_then_body_step_at_the_new_head() -> None:
    # Prepare: one full batch, so each epoch is one step; τ_h = τ_b = 1.
    flat, spec = tiny_problem()
    body, head = flat.layout.slice_of("body"), flat.layout.slice_of("fc")
    client = job(flat, 0, lr=0.1)
    start = flat.numpy()
    expected = start.copy()
    expected[head] -= 0.1 * full_batch_gradient(flat, client, start)[head]  # Alg. 1 line 6, body frozen
    expected[body] -= 0.1 * full_batch_gradient(flat, client, expected)[body]  # line 7, at the new head
    flat.load(start)
    # Execute
    _, steps = train_client(
        FedRepClient(FedRepParams(head_epochs=1, body_epochs=1), spec), _message(flat, spec), client
    )
    # Assert
    np.testing.assert_allclose(flat.numpy(), expected, rtol=1e-5, atol=1e-7)
    assert steps == 2


@pytest.mark.parametrize(("head_epochs", "body_epochs", "moved"), [(3, 0, "fc"), (0, 2, "body")])
def test_each_phase_moves_only_its_part(head_epochs: int, body_epochs: int, moved: str) -> None:
    flat, spec = tiny_problem()
    client = job(flat, 1, n=20, batch_size=5, momentum=0.9, weight_decay=0.01)
    start, message = flat.numpy(), _message(flat, spec)
    half = FedRepClient(FedRepParams(head_epochs=head_epochs, body_epochs=body_epochs), spec)
    assert len(half.phases(message, client)) == 1  # the part of 0 epochs is left out
    _, steps = train_client(half, message, client)
    frozen = flat.layout.slice_of("body" if moved == "fc" else "fc")
    np.testing.assert_array_equal(flat.numpy()[frozen], start[frozen])
    assert not np.array_equal(flat.numpy()[flat.layout.slice_of(moved)], start[flat.layout.slice_of(moved)])
    assert steps == 4 * (head_epochs + body_epochs)


def _cnn4_client(flat: FlatModel, n: int = 37) -> ClientJob:
    """A cnn4 client with 37 samples: with batch 10 and drop_last off, 4 steps per epoch, the last of 7."""
    data = torch.Generator().manual_seed(5)
    return client_job(
        flat,
        torch.randn(n, 1, 16, 16, generator=data),
        torch.randint(0, 4, (n,), generator=data),
        train=TrainConfig(lr=0.05, batch_size=10, momentum=0.9, weight_decay=0.01, drop_last=False),
        test=(torch.empty(0), torch.empty(0, dtype=torch.long)),
        architecture="cnn4",
        generator=7,
    )


def test_head_epochs_on_features_computed_once_equal_the_frozen_body_steps() -> None:
    # Prepare: cnn4 (no BatchNorm, no dropout), 3 head epochs with momentum and weight decay.
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn4", (1, 16, 16), 4))
    spec = ProblemSpec(
        1,
        4,
        (1, 16, 16),
        {"cnn4": flat.layout},
        {"cnn4": ("conv1", "conv2", "last_feat", "fc")},
        {"cnn4": "fc"},
        default_architecture="cnn4",
    )
    split, start = split_body_head(spec, "cnn4", 1), flat.numpy()
    message = FedRepServer(FedRepParams(head_epochs=3, body_epochs=1), spec, {"cnn4": flat.state_numpy()}).broadcast()
    (head_phase, _) = FedRepClient(FedRepParams(head_epochs=3, body_epochs=1), spec).phases(message, _cnn4_client(flat))
    assert head_phase.trains == (split.head_params.start, split.head_params.stop) and head_phase.epochs == 3
    through_body = _samples_through(flat.module.conv1)
    # Execute: every step through the whole model with the body frozen (a loop that knows no output layer), then
    # FedRep's head phase in a worker's loop, which knows it.
    reference = train_phases(_cnn4_client(flat), [head_phase])
    expected, reference_samples = flat.numpy(), sum(through_body)
    flat.load(start)
    through_body.clear()
    stats = train_phases(_cnn4_client(flat), [head_phase], output_layers={"cnn4": "fc"})
    # Assert: the features path is taken (the body sees each sample once, not once per epoch); the same steps and
    # loss; the body untouched; the head equal up to float rounding.
    assert (reference_samples, sum(through_body)) == (3 * 37, 37)
    assert (stats[1], float(stats[0])) == (reference[1], pytest.approx(float(reference[0]), rel=1e-5))
    np.testing.assert_array_equal(flat.numpy()[split.body_params], start[split.body_params])
    np.testing.assert_allclose(flat.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(flat.numpy()[split.head_params], start[split.head_params])


def test_a_body_with_batchnorm_trains_its_head_through_the_whole_model() -> None:
    # Prepare: BatchNorm uses batch statistics in training mode, so features depend on the batch.
    flat, spec = tiny_problem(batchnorm=True)
    split, start = split_body_head(spec, "tiny", 1), flat.state_numpy()
    phase = part_phase(split.head_params, 2)
    reference = train_phases(job(flat, 2, n=20, batch_size=5), [phase])
    expected = flat.state_numpy()
    flat.load_state(start)
    through_body = _samples_through(flat.module.body)
    # Execute: in a worker's loop, which knows the output layer
    stats = train_phases(job(flat, 2, n=20, batch_size=5), [phase], output_layers={"tiny": "fc"})
    # Assert: no features path (the body sees every step's batch); exactly the part phase's steps, running
    # statistics included.
    assert sum(through_body) == 2 * 20
    np.testing.assert_array_equal(flat.state_numpy(), expected)
    assert stats[1] == reference[1] and float(stats[0]) == float(reference[0])


def test_epochs_are_checked() -> None:
    with pytest.raises(ConfigError, match=re.escape("algorithm.params.head_epochs must be an integer >= 0")):
        RunConfig().override({"algorithm.name": "fedrep", "algorithm.params.head_epochs": -1})
    # No epoch at all would train nothing: refused, naming the field.
    with pytest.raises(ConfigError, match=re.escape("algorithm.params.body_epochs must be >= 1 while head_epochs=0")):
        RunConfig().override(
            {"algorithm.name": "fedrep", "algorithm.params.head_epochs": 0, "algorithm.params.body_epochs": 0}
        )


def test_heads_stay_local_body_is_shared_and_only_the_body_travels(tmp_path) -> None:
    # Prepare / Execute: 10 clients, half of them per round, 3 rounds, τ_h = 2.
    result, log = run_logged(
        tmp_path / "run", "fedrep", {"head_epochs": 2}, **{"engine.join_ratio": 0.5, "train.rounds": 3}
    )
    layout = log.spec.layouts["cnn4"]
    head = layout.slice_of("fc")
    body_size = layout.size - (head.stop - head.start)
    # Assert: heads differ between clients and persist while a client sits out; one shared body.
    assert_local_parts_kept(log, "local", head.stop - head.start)
    bodies = [state["shared"] for state in log.server]
    assert all(b.shape == (body_size,) for b in bodies) and not np.array_equal(bodies[0], bodies[-1])
    for r in range(3):
        for row in sampled_rows(log, r):
            assert (row["bytes_up"], row["bytes_down"]) == (body_size * 4 + 8, body_size * 4)
            assert row["steps"] == 3 * (row["num_train"] // 10)  # 2 head epochs + 1 body epoch, drop_last
    assert all(h["num_evaluated"] == 10 for h in result.history)
