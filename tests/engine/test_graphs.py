"""Steps replayed from CUDA graphs train as the eager loop does: the workspace code on any device, the
capture and replay where there is a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfed import RunConfig
from rayfed.algorithms import resolve
from rayfed.config import TrainConfig
from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob
from rayfed.train.replayed import ReplayedSGD
from rayfed.train.sgd import local_sgd
from rayfed.train.stacked import StackedTraining

SIZES = (40, 25, 30)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="capturing a CUDA graph needs a CUDA GPU")


def _jobs(flat: FlatModel, device: torch.device, **train: object) -> list[ClientJob]:
    rng = torch.Generator().manual_seed(0)
    settings = TrainConfig(**{"lr": 0.05, "batch_size": 10, **train})
    return [
        ClientJob(
            client_id=cid, round=0, flat=flat, architecture="cnn4",
            x_train=torch.randn(n, 1, 16, 16, generator=rng).to(device),
            y_train=torch.randint(0, 4, (n,), generator=rng).to(device),
            x_test=torch.empty(0, device=device), y_test=torch.empty(0, dtype=torch.long, device=device),
            label_counts=np.ones(4), train_label_counts=np.ones(4), train=settings, lr=settings.lr,
            generator=torch.Generator().manual_seed(100 + cid),
        )
        for cid, n in enumerate(SIZES)
    ]


def _eager(flat: FlatModel, start: torch.Tensor, device: torch.device, **train: object) -> list[torch.Tensor]:
    out = []
    for job in _jobs(flat, device, **train):
        flat.load(start)
        local_sgd(job)
        out.append(flat.vector.detach().clone())
    return out


@pytest.mark.parametrize("train", [{}, {"momentum": 0.9, "weight_decay": 0.01, "drop_last": False}])
def test_workspace_steps_train_as_the_eager_loop(train: dict) -> None:
    # Prepare
    torch.manual_seed(0)
    device = torch.device("cpu")
    flat = FlatModel(build_model("cnn4", (1, 16, 16), 4))
    start = flat.vector.detach().clone()
    expected = _eager(flat, start, device, **train)
    # Execute: the same clients through the workspace step, twice (the workspace is reused)
    replayed = ReplayedSGD(StepGraphs(device))
    for _ in range(2):
        got, losses = [], []
        for job in _jobs(flat, device, **train):
            flat.load(start)
            losses.append(replayed.train(job))
            got.append(flat.vector.detach().clone())
    # Assert: the same models, and nothing read back in the loop (the losses are tensors)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(isinstance(stats.loss, torch.Tensor) for stats in losses)
    assert not replayed.graphs.enabled  # a CPU runs the step as it is


@cuda
def test_replayed_steps_on_a_gpu_train_as_eager_ones() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda")
    flat = FlatModel(build_model("cnn4", (1, 16, 16), 4).to(device))
    start = flat.vector.detach().clone()
    expected = _eager(flat, start, device, momentum=0.9)
    replayed = ReplayedSGD(StepGraphs(device))
    got = []
    for job in _jobs(flat, device, momentum=0.9):
        flat.load(start)
        replayed.train(job)
        got.append(flat.vector.detach().clone())
    assert replayed.graphs._graphs and all(g is not None for g in replayed.graphs._graphs.values())
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@cuda
def test_stacked_steps_replayed_on_a_gpu_equal_eager_stacked_steps() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda")
    flat = FlatModel(build_model("resnet20", (1, 16, 16), 4).to(device))
    starts = torch.stack([flat.state() for _ in SIZES])
    half = resolve(RunConfig().algorithm).make_client(None)  # type: ignore[arg-type]  # FedAvg's reads no spec
    eager, _, _ = StackedTraining(flat).train(_jobs(flat, device, lr=0.005), starts, half, [{}] * len(SIZES))
    graphs = StepGraphs(device)
    stacked = StackedTraining(flat, graphs)
    for _ in range(2):  # the second call replays the steps captured in the first
        replayed, _, _ = stacked.train(_jobs(flat, device, lr=0.005), starts, half, [{}] * len(SIZES))
    assert graphs._graphs and all(g is not None for g in graphs._graphs.values())
    torch.testing.assert_close(replayed, eager, rtol=1e-4, atol=1e-5)
