"""Stacked client training equals the sequential loop: unequal client sizes, extra losses, momentum, BatchNorm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfed import RunConfig, run
from rayfed.algorithms import resolve
from rayfed.config import TrainConfig
from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.stacked import StackedTraining, can_stack, resolve_vectorize
from tests.conftest import tiny_overrides

SIZES = (13, 25, 7, 40)  # 7 < batch: with drop_last that client takes no step


def _jobs(flat: FlatModel, *, lr=0.05, momentum=0.0, weight_decay=0.0, drop_last=True, epochs=1, channels=1,
          sizes=SIZES) -> list[ClientJob]:
    rng = torch.Generator().manual_seed(0)
    jobs = []
    for cid, n in enumerate(sizes):
        jobs.append(
            ClientJob(
                client_id=cid, round=0, flat=flat, architecture="cnn4",
                x_train=torch.randn(n, channels, 16, 16, generator=rng),
                y_train=torch.randint(0, 4, (n,), generator=rng),
                x_test=torch.empty(0), y_test=torch.empty(0, dtype=torch.long),
                label_counts=np.ones(4), train_label_counts=np.ones(4),
                train=TrainConfig(lr=lr, local_epochs=epochs, batch_size=10, momentum=momentum,
                                  weight_decay=weight_decay, drop_last=drop_last),
                lr=lr, generator=torch.Generator().manual_seed(100 + cid),
            )
        )
    return jobs


def _client_half(name: str, **params):
    config = RunConfig().override({"algorithm.name": name, **{f"algorithm.params.{k}": v for k, v in params.items()}})
    return resolve(config.algorithm).make_client(None)  # type: ignore[arg-type]  # these halves never read the spec


@pytest.mark.parametrize(
    ("algorithm", "params", "options"),
    [
        ("fedavg", {}, {}),
        ("fedprox", {"mu": 0.5}, {}),
        ("fedavg", {}, {"momentum": 0.9, "weight_decay": 0.01, "epochs": 2}),
        ("fedprox", {"mu": 0.1}, {"drop_last": False}),
    ],
)
def test_stacked_training_matches_sequential(algorithm: str, params: dict, options: dict) -> None:
    # Prepare: one model, four clients with different starting points and data sizes.
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn4", (1, 16, 16), 4))
    half = _client_half(algorithm, **params)
    starts = torch.stack([flat.vector.detach() + 0.01 * torch.randn(flat.size) for _ in SIZES])
    # Execute: sequential, one client at a time ...
    sequential, seq_stats = [], []
    for job, start in zip(_jobs(flat, **options), starts):
        flat.load(start)
        seq_stats.append(half.train(job))
        sequential.append(flat.vector.detach().clone())
    # ... and stacked, from the same starts with fresh generators.
    jobs = _jobs(flat, **options)
    constants = []
    for job, start in zip(jobs, starts):
        flat.load(start)
        constants.append(half.loss_constants(job))
    stacked, losses, steps = StackedTraining(flat).train(jobs, starts, half, constants)
    # Assert
    assert can_stack(flat, half, jobs[0].train)
    torch.testing.assert_close(stacked, torch.stack(sequential), rtol=1e-4, atol=2e-5)
    assert steps == [s.steps for s in seq_stats]
    assert steps[2] == (0 if options.get("drop_last", True) else options.get("epochs", 1))
    for loss, n, seq in zip(losses.tolist(), steps, seq_stats):
        if n:
            assert loss == pytest.approx(float(seq.loss), rel=1e-4)


def test_batchnorm_models_stack_with_per_client_running_statistics() -> None:
    # Prepare: resnet20 (BatchNorm in every block), clients of unequal sizes and starting points, a few steps at a
    # small lr. On random data its training is sensitive to float rounding: the sequential loop itself moves a
    # model by up to 7e-5 between 1 and 2 torch threads here, so that is the tolerance (batch statistics taken
    # over all clients together instead of each client's own are off by 4e-3).
    torch.manual_seed(0)
    flat = FlatModel(build_model("resnet20", (3, 16, 16), 4))
    half = _client_half("fedavg")
    sizes = (20, 10, 30)
    starts = torch.stack([flat.vector.detach() + 0.01 * torch.randn(flat.size) for _ in sizes])
    buffers = torch.stack([flat.buffers + 0.1 * i for i in range(len(sizes))])  # each client its own statistics
    # Execute: sequential, one client at a time ...
    sequential, seq_buffers = [], []
    for job, start, own in zip(_jobs(flat, channels=3, sizes=sizes, lr=0.005), starts, buffers):
        flat.load(start)
        flat.buffers.copy_(own)
        half.train(job)
        sequential.append(flat.vector.detach().clone())
        seq_buffers.append(flat.buffers.clone())
    # ... and stacked.
    jobs = _jobs(flat, channels=3, sizes=sizes, lr=0.005)
    trained, _, steps = StackedTraining(flat).train(jobs, torch.cat([starts, buffers], dim=1), half, [{}] * 3)
    # Assert: the same parameters and running statistics, client by client.
    assert can_stack(flat, half, jobs[0].train)
    torch.testing.assert_close(trained[:, : flat.size], torch.stack(sequential), rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(trained[:, flat.size :], torch.stack(seq_buffers), rtol=1e-4, atol=1e-4)
    assert steps == [2, 1, 3]


def test_what_cannot_be_stacked_trains_one_client_at_a_time() -> None:
    resnet = FlatModel(build_model("resnet20", (3, 16, 16), 4))
    cnn = FlatModel(build_model("fedproto_cnn18", (1, 28, 28), 10))  # dropout: each client draws its own masks
    assert not can_stack(resnet, _client_half("fedavg"), TrainConfig(drop_last=False))  # padding in BN statistics
    assert can_stack(resnet, _client_half("fedavg"), TrainConfig(drop_last=True))
    assert not can_stack(cnn, _client_half("fedavg"), TrainConfig())
    assert not can_stack(FlatModel(build_model("cnn4", (1, 16, 16), 4)), _client_half("fedclassavg"), TrainConfig())


def test_auto_stacks_on_cuda_only() -> None:
    assert resolve_vectorize("auto", torch.device("cuda")) and not resolve_vectorize("auto", torch.device("cpu"))
    assert resolve_vectorize("on", torch.device("cpu")) and not resolve_vectorize("off", torch.device("cuda"))


def test_vectorized_run_matches_sequential_run(tmp_path) -> None:
    # engine.eval_local too: a stack's clients are each evaluated after training, as one at a time.
    on, off = (run(RunConfig().override(tiny_overrides(tmp_path / mode, **{"engine.vectorize": mode,
                                                                             "engine.eval_local": True})))
               for mode in ("on", "off"))
    np.testing.assert_allclose(on.accuracies, off.accuracies, atol=0.02)
    np.testing.assert_allclose([r["train_loss"] for r in on.history], [r["train_loss"] for r in off.history], rtol=1e-3)
    local_on, local_off = ([r["local_accuracy"] for r in result.history] for result in (on, off))
    assert all(0.0 < acc <= 1.0 for acc in local_on)
    np.testing.assert_allclose(local_on, local_off, atol=0.02)
