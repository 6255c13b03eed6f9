"""Stacked client training equals the sequential loop: unequal client sizes, extra losses, momentum, BatchNorm,
dropout; and what cannot be stacked is said so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfed import RunConfig, run
from rayfed.config import TrainConfig
from rayfed.execution.devices import stacks_on
from rayfed.models import build_model
from rayfed.train.dropout import dropout_mask
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob
from rayfed.train.lanes import packed_lanes
from rayfed.train.loop import LocalLoop
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.train.stacked_layers import stack_blocker
from tests.conftest import client_job, tiny_overrides

NO_TEST = (torch.empty(0), torch.empty(0, dtype=torch.long))
SIZES = (13, 25, 7, 40)  # 7 < batch: with drop_last that client takes no step


def _jobs(
    flat: FlatModel,
    *,
    lr=0.05,
    momentum=0.0,
    weight_decay=0.0,
    drop_last=True,
    epochs=1,
    channels=1,
    sizes=SIZES,
    arch="cnn4",
) -> list[ClientJob]:
    rng = torch.Generator().manual_seed(0)
    jobs = []
    for cid, n in enumerate(sizes):
        x, y = torch.randn(n, channels, 16, 16, generator=rng), torch.randint(0, 4, (n,), generator=rng)
        train = TrainConfig(
            lr=lr, local_epochs=epochs, batch_size=10, momentum=momentum, weight_decay=weight_decay, drop_last=drop_last
        )
        jobs.append(
            client_job(flat, x, y, train=train, test=NO_TEST, architecture=arch, client_id=cid, generator=100 + cid)
        )
    return jobs


def _loop() -> LocalLoop:
    return LocalLoop(StepGraphs(torch.device("cpu"), enabled=False), (0.5,), (0.5,))


def _prox(out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
    return 0.25 * (torch.cat([p.reshape(-1) for p in params]) - constants["start"]).pow(2).sum()


@pytest.mark.parametrize(
    ("phase", "options"),
    [
        (Phase(epochs=1), {}),
        (Phase(epochs=1, loss=_prox), {}),
        (Phase(epochs=2), {"momentum": 0.9, "weight_decay": 0.01, "epochs": 2}),
        (Phase(epochs=1, loss=_prox), {"drop_last": False}),
    ],
)
@pytest.mark.parametrize("pack", [False, True])
def test_stacked_training_matches_sequential(phase: Phase, options: dict, pack: bool) -> None:
    # Prepare: one model, four clients with different starting points and data sizes.
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn4", (1, 16, 16), 4))
    starts = torch.stack([flat.vector.detach() + 0.01 * torch.randn(flat.size) for _ in SIZES])
    loop = _loop()
    # Execute: sequential, one client at a time ...
    sequential, seq_stats = [], []
    for job, start in zip(_jobs(flat, **options), starts):
        flat.load(start)
        seq_stats.append(loop.train_one(job, [phase]))
        sequential.append(flat.vector.detach().clone())
    # ... and stacked, from the same starts with fresh generators.
    stacked = loop.train_stack(_jobs(flat, **options), starts, [[phase]] * len(SIZES), pack=pack)
    # Assert: the same models and losses (packed, the two shortest clients share a lane)
    assert packed_lanes(stacked.steps).packed
    torch.testing.assert_close(stacked.states, torch.stack(sequential), rtol=1e-4, atol=2e-5)
    assert stacked.steps == [steps for _, steps in seq_stats]
    assert stacked.steps[2] == (0 if options.get("drop_last", True) else options.get("epochs", 1))
    for loss, n, (seq_loss, _) in zip(stacked.losses.tolist(), stacked.steps, seq_stats):
        if n:
            assert loss == pytest.approx(float(seq_loss), rel=1e-4)


@pytest.mark.parametrize("pack", [False, True])
def test_batchnorm_models_stack_with_per_client_running_statistics(pack: bool) -> None:
    # Prepare: resnet20 (BatchNorm in every block), clients of unequal sizes and starting points, a few steps at a
    # small lr. On random data its training is sensitive to float rounding: the sequential loop itself moves a
    # model by up to 7e-5 between 1 and 2 torch threads here, so that is the tolerance (batch statistics taken
    # over all clients together instead of each client's own are off by 4e-3).
    torch.manual_seed(0)
    flat = FlatModel(build_model("resnet20", (3, 16, 16), 4))
    sizes = (20, 10, 30)
    starts = torch.stack([flat.vector.detach() + 0.01 * torch.randn(flat.size) for _ in sizes])
    buffers = torch.stack([flat.buffers + 0.1 * i for i in range(len(sizes))])  # each client its own statistics
    loop = _loop()
    # Execute: sequential, one client at a time ...
    sequential = []
    for job, start, own in zip(_jobs(flat, channels=3, sizes=sizes, lr=0.005), starts, buffers):
        flat.load(start)
        flat.buffers.copy_(own)
        loop.train_one(job, [Phase(epochs=1)])
        sequential.append(flat.state())
    # ... and stacked.
    jobs = _jobs(flat, channels=3, sizes=sizes, lr=0.005)
    trained = loop.train_stack(jobs, torch.cat([starts, buffers], dim=1), [[Phase(epochs=1)]] * 3, pack=pack)
    # Assert: the same parameters and running statistics, client by client (packed, the two shortest share a lane).
    assert packed_lanes(trained.steps).packed
    assert not stack_blocker(flat.module, drop_last=True)
    torch.testing.assert_close(trained.states, torch.stack(sequential), rtol=1e-4, atol=2e-4)
    assert trained.steps == [2, 1, 3]


def test_dropout_draws_each_clients_own_masks_alone_or_stacked() -> None:
    # Prepare: FedProto's network, with Dropout2d and a dropout before its output layer.
    torch.manual_seed(0)
    flat = FlatModel(build_model("fedproto_cnn20", (1, 28, 28), 4))
    starts = torch.stack([flat.vector.detach() for _ in range(3)])
    jobs = [
        client_job(
            flat,
            torch.randn(30, 1, 28, 28, generator=torch.Generator().manual_seed(c)),
            torch.randint(0, 4, (30,), generator=torch.Generator().manual_seed(c)),
            train=TrainConfig(lr=0.05, batch_size=10),
            test=NO_TEST,
            architecture="fedproto_cnn20",
            client_id=c,
            generator=7,
        )
        for c in range(3)
    ]
    loop = _loop()
    # Execute: the clients alone, and stacked (all three draw the same batches: the same generator seed).
    alone = []
    for job, start in zip(jobs, starts):
        flat.load(start)
        job.generator.manual_seed(7)
        loop.train_one(job, [Phase(epochs=1)])
        alone.append(flat.vector.detach().clone())
    for job in jobs:
        job.generator.manual_seed(7)
    stacked = loop.train_stack(jobs, starts, [[Phase(epochs=1)]] * 3)
    # Assert: equal alone and stacked; clients with the same batches differ only through their own masks.
    torch.testing.assert_close(stacked.states, torch.stack(alone), rtol=1e-4, atol=2e-5)
    assert not torch.allclose(alone[0], alone[1])
    # A mask is a client's: the same alone as in any stack, about 1 - p of it kept, kept entries scaled by 1/(1 - p).
    seeds = torch.tensor([11, 12, 13])
    masks = dropout_mask(seeds, torch.tensor(4), 1, (50, 8), 0.25)
    torch.testing.assert_close(masks[1], dropout_mask(seeds[1:2], torch.tensor(4), 1, (50, 8), 0.25)[0])
    assert masks.unique().tolist() == pytest.approx([0.0, 1 / 0.75])
    assert abs(float((masks > 0).float().mean()) - 0.75) < 0.05


def test_what_cannot_be_stacked_says_why() -> None:
    resnet = build_model("resnet20", (3, 16, 16), 4)
    assert "drop_last" in stack_blocker(resnet, drop_last=False)  # padding would enter the BatchNorm statistics
    assert not stack_blocker(resnet, drop_last=True)
    assert not stack_blocker(build_model("fedproto_cnn18", (1, 28, 28), 10), drop_last=True)  # client masks
    alpha = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.AlphaDropout(0.5), torch.nn.Linear(4, 2))
    assert "AlphaDropout" in stack_blocker(alpha, drop_last=True)


def test_auto_stacks_on_cuda_only() -> None:
    assert stacks_on("auto", "cuda") and not stacks_on("auto", "cpu")
    assert stacks_on("on", "cpu") and not stacks_on("off", "cuda")


def test_vectorized_run_matches_sequential_run(tmp_path) -> None:
    # engine.eval_local too: a stack's clients are each evaluated after training, as one at a time.
    on, off = (
        run(
            RunConfig().override(
                tiny_overrides(tmp_path / mode, **{"engine.vectorize": mode, "engine.eval_local": True})
            )
        )
        for mode in ("on", "off")
    )
    np.testing.assert_allclose(on.accuracies, off.accuracies, atol=0.02)
    np.testing.assert_allclose([r["train_loss"] for r in on.history], [r["train_loss"] for r in off.history], rtol=1e-3)
    local_on, local_off = ([r["local_accuracy"] for r in result.history] for result in (on, off))
    assert all(0.0 < acc <= 1.0 for acc in local_on)
    np.testing.assert_allclose(local_on, local_off, atol=0.02)
