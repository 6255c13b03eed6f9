"""The body/head split shared by FedPer, FedRep, FedBABU and LG-FedAvg: block slicing (one source with
cwFedAvg), state slices with buffers, training one part with the other frozen, shared-body evaluation."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rayfed import ConfigError, RunConfig
from rayfed.algorithms import ClientHalf, RoundContext
from rayfed.algorithms.common.architecture import trailing_blocks
from rayfed.algorithms.common.body_head import BodyHeadParams, part_phase, split_body_head
from rayfed.algorithms.cwfedavg_params import CwFedAvgParams, model_parts
from rayfed.data import load_dataset, make_partition
from rayfed.engine.problem_build import build_problem
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.server import Server
from rayfed.util.errors import MethodError
from tests.algorithms.body_head_cases import job, tiny_problem
from tests.conftest import train_phases

torch.set_num_threads(1)


def _synthetic(algorithm: str, params: dict[str, object], num_clients: int = 8):  # noqa: ANN202
    config = RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 800},
            "data.num_clients": num_clients,
            "algorithm.name": algorithm,
            "algorithm.params": params,
            "engine.backend": "local",
        }
    )
    dataset = load_dataset("synthetic", None, options=config.data.options)
    partition = make_partition(dataset.labels, dataset.num_classes, config.data)
    spec, initial = build_problem(config, dataset)
    return config, dataset, partition, spec, initial


# --- block slicing and the split ----------------------------------------------------------------


def test_trailing_blocks_is_the_slice_cwfedavg_uses() -> None:
    # Prepare: the 4-block CNN (conv1, conv2, last_feat, fc).
    _, _, _, spec, _ = _synthetic("fedavg", {})
    layout, blocks = spec.layouts["cnn4"], spec.blocks["cnn4"]
    # Execute / Assert: the last m blocks, the whole model for 0 or all, and cwFedAvg's class-wise part.
    assert trailing_blocks(layout, blocks, 2) == layout.slice_of(("last_feat", "fc"))
    assert trailing_blocks(layout, blocks, 0) == trailing_blocks(layout, blocks, 4) == slice(0, layout.size)
    for m in range(5):
        assert model_parts(spec, "cnn4", CwFedAvgParams(classwise_blocks=m)).classwise == trailing_blocks(
            layout, blocks, m
        )
    assert split_body_head(spec, "cnn4", 2).head_params == layout.slice_of(("last_feat", "fc"))


def test_split_puts_buffers_with_their_block_and_round_trips() -> None:
    # Prepare: BatchNorm in the body.
    flat, spec = tiny_problem(batchnorm=True)
    p, b = flat.layout.size, flat.buffer_layout.size
    # Execute
    split = split_body_head(spec, "tiny", 1)
    # Assert: body = body parameters + all buffers; head = fc's weight and bias only.
    assert split.head == (flat.layout.slice_of("fc"),) and split.head_is_output_layer
    assert split.body == (slice(0, flat.layout.slice_of("fc").start), slice(p, p + b))
    state = np.arange(split.state_size, dtype=np.float32)
    rebuilt = np.full_like(state, -1)
    for part in ("body", "head"):
        split.scatter(rebuilt, split.part(part), split.gather(state, split.part(part)))
    np.testing.assert_array_equal(rebuilt, state)
    assert split.size(split.body) + split.size(split.head) == p + b


def test_head_blocks_must_leave_a_body_and_a_head() -> None:
    _, spec = tiny_problem()
    with pytest.raises(ConfigError, match=r"algorithm\.params\.head_blocks must be between 1 and 1 .*body, fc"):
        split_body_head(spec, "tiny", 2)
    with pytest.raises(ConfigError, match=re.escape("algorithm.params.head_blocks must be an integer >= 1")):
        BodyHeadParams(head_blocks=0)
    for name in ("fedper", "fedrep", "fedbabu", "lgfedavg"):
        with pytest.raises(ConfigError, match=r"algorithm\.params\.head_blocks"):
            RunConfig().override({"algorithm.name": name, "algorithm.params.head_blocks": -1})


# --- training one part --------------------------------------------------------------------------


@pytest.mark.parametrize("part_name", ["head", "body"])
def test_a_part_phase_takes_the_sgd_step_on_that_part_only(part_name: str) -> None:
    # Prepare: one full batch, so one epoch is one step; weight decay and momentum on.
    flat, spec = tiny_problem()
    split = split_body_head(spec, "tiny", 1)
    part = split.head_params if part_name == "head" else split.body_params
    client = job(flat, 0, lr=0.1, weight_decay=0.01, momentum=0.9)
    start = flat.numpy()
    flat.zero_grad()
    F.cross_entropy(flat.module(client.x_train), client.y_train).backward()
    grad = flat.grad.numpy().copy()
    # Execute
    _, steps = train_phases(client, [part_phase(part, 1)])
    # Assert: w ← w − lr (g + wd·w) on the part; the rest bit-identical; gradients required again.
    expected = start.copy()
    expected[part] = start[part] - 0.1 * (grad[part] + 0.01 * start[part])
    np.testing.assert_allclose(flat.numpy(), expected, rtol=1e-5, atol=1e-7)
    outside = np.ones(flat.size, bool)
    outside[part] = False
    np.testing.assert_array_equal(flat.numpy()[outside], start[outside])
    assert steps == 1 and all(p.requires_grad for p in flat.params)
    # A part phase of no epoch is refused before it trains (a method leaves such a phase out).
    with pytest.raises(MethodError, match=r"Phase\.epochs=0 must be a whole number >= 1"):
        train_phases(client, [part_phase(part, 0)])
    np.testing.assert_allclose(flat.numpy(), expected, rtol=1e-5, atol=1e-7)


# --- shared-body evaluation ---------------------------------------------------------------------


def _one_by_one(half: ClientHalf) -> ClientHalf:  # type: ignore[type-arg]
    """The same client half, whose clients are evaluated one by one."""

    class OneByOne(type(half)):  # type: ignore[misc]
        def shared_body(self, message, jobs):  # noqa: ANN001, ANN201
            return None

    return OneByOne(half.params, half.spec)


@pytest.mark.parametrize(
    ("algorithm", "params", "shared"),
    [
        ("fedper", {}, True),
        ("fedrep", {"head_epochs": 1}, True),
        ("fedper", {"head_blocks": 2}, False),
        ("lgfedavg", {}, False),
    ],
)
def test_shared_body_evaluation_equals_a_forward_per_client(algorithm, params, shared) -> None:  # noqa: ANN001
    """Averaged body + each client's own output layer: one body forward and batched heads give the
    per-client forwards' accuracies exactly, and their losses to float tolerance."""
    # Prepare: one round of training, clients' heads persisted as the engine would.
    config, dataset, partition, spec, initial = _synthetic(algorithm, params)
    runner, server = ClientRunner(config, spec, dataset, partition), Server(config, spec, initial)
    ids = list(range(8))
    ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(6))
    trained = runner.train(server.broadcast(), ctx, ids[:6])
    server.aggregate(ctx, trained.contribution)
    message = server.broadcast()
    plain = ClientRunner(config, spec, dataset, partition)
    plain.client_half = _one_by_one(runner.client_half)
    # Execute
    jobs = [runner.job(cid, ctx, trained.states.get(cid), evaluation=True) for cid in ids]
    plan = runner.client_half.shared_body(message, jobs)
    batched = runner.evaluate(message, ctx, ids, trained.states)
    one_by_one = plain.evaluate(message, ctx, ids, trained.states)
    # Assert: clients 6 and 7 never trained and use the initial head.
    assert (plan is not None) == shared
    assert [(r.client_id, r.num_test, r.correct) for r in batched] == [
        (r.client_id, r.num_test, r.correct) for r in one_by_one
    ]
    np.testing.assert_allclose([r.loss_sum for r in batched], [r.loss_sum for r in one_by_one], rtol=1e-5)
    assert len({r.correct for r in batched}) > 1
