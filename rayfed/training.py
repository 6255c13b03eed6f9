"""One virtual client's local work: its data, its model, the SGD loop and evaluation.

A :class:`ClientJob` is what a worker hands to an algorithm for one client in one
round: the client's id and data, the worker's model for the client's architecture
(as a :class:`~rayfed.flat.FlatModel`), the round's optimiser settings and the
client's persistent state, if its algorithm keeps any.

:func:`local_sgd` is the lean training step the whole simulator spends its time in:
no DataLoader, batches are index slices of tensors already on the device, and the
SGD update is one fused operation on the flat parameter vector.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.flat import FlatModel
from rayfed.scratch import Scratch

if TYPE_CHECKING:  # config imports the algorithms' params, which import this module
    from rayfed.config import TrainConfig

__all__ = [
    "eval_batch_size",
    "ClientJob", "TrainStats", "EvalStats", "minibatches", "local_sgd", "sgd_step", "evaluate_model",
    "features_before_output", "seed_global_generators",
]


def eval_batch_size(device: torch.device) -> int:
    """Samples per forward when evaluating (no gradients are kept): 1024 on a GPU, which wants large
    batches; 128 on a CPU, where a larger batch's activations fall out of the caches and the same
    forward passes take up to 2x longer (benchmarks/README.md, "Evaluation batch on CPU")."""
    return 1024 if device.type == "cuda" else 128


@dataclass
class ClientJob:
    """Everything one client's local update or evaluation needs, built by the worker."""

    client_id: int
    round: int
    flat: FlatModel
    architecture: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    label_counts: np.ndarray
    """(K,) class counts over the client's whole partition, before the train/test split."""
    train_label_counts: np.ndarray
    """(K,) class counts over the client's training split."""
    train: TrainConfig
    """The run's local-training settings (epochs, batch size, momentum, ...), passed whole."""
    generator: torch.Generator
    """Seeded from (run seed, round, client id): the same client gets the same batches on any worker."""
    state: dict[str, np.ndarray] | None = None
    """Persistent per-client state (e.g. FedClassAvg's backbone); algorithms may replace it."""
    scratch: Scratch = field(default_factory=Scratch)
    """Per-job values an algorithm passes between its hooks, under typed keys (e.g. FedProx's anchor)."""

    @property
    def lr(self) -> float:
        """This round's learning rate, after ``train.lr_decay``."""
        return self.train.lr_at(max(self.round, 0))

    @property
    def model(self) -> torch.nn.Module:
        return self.flat.module

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])

    @property
    def device(self) -> torch.device:
        return self.flat.vector.device


@dataclass(frozen=True)
class TrainStats:
    """What local training reports: mean cross-entropy over the steps taken and their number."""

    loss: float
    steps: int


@dataclass(frozen=True)
class EvalStats:
    correct: int
    loss_sum: float
    count: int

    @property
    def mean_loss(self) -> float:
        """The mean cross-entropy over the samples; NaN without samples."""
        return self.loss_sum / self.count if self.count else math.nan


ExtraLoss = Callable[[ClientJob, torch.Tensor], "torch.Tensor | None"]


def seed_global_generators(seed: int, device: torch.device) -> None:
    """Seed the global generators that layers such as dropout draw from on ``device``: the CPU
    one, and on a GPU the CUDA ones.

    ``torch.manual_seed`` would also queue a seeding call for every accelerator backend not yet
    initialised, formatting a stack trace for each: about 0.5 ms per client on a CUDA build
    without a GPU. The CPU generator receives the same seed either way.
    """
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)


def sgd_step(
    flat: FlatModel, lr: float, *, momentum: float = 0.0, weight_decay: float = 0.0, buffer: torch.Tensor | None = None
) -> None:
    """One SGD update on the flat parameter vector, as ``torch.optim.SGD`` (dampening 0, no Nesterov).

    With weight decay, g <- g + wd * w; with momentum, b <- m * b + g and w <- w - lr * b.
    A zero-initialised buffer gives b = g at the first step, as torch's SGD does.
    """
    grad = flat.grad
    if weight_decay:
        grad = grad.add(flat.vector, alpha=weight_decay)
    if momentum:
        if buffer is None:
            raise ValueError("momentum > 0 needs a momentum buffer")
        buffer.mul_(momentum).add_(grad)
        grad = buffer
    flat.vector.add_(grad, alpha=-lr)


def minibatches(
    job: ClientJob,
    *,
    epochs: int | None = None,
    size: int | None = None,
    drop_last: bool | None = None,
    batch_size: int | None = None,
) -> Iterator[torch.Tensor]:
    """The index tensors (on the job's device) of ``epochs`` shuffled passes over ``size`` samples.

    Defaults: ``train.local_epochs`` passes over the client's training split, ``train.batch_size``
    samples per batch (``batch_size``), and ``train.drop_last`` (the papers' loaders: a last
    partial batch is skipped, so a client with fewer samples than a batch takes no step, as in
    PFLlib). Each pass draws one
    ``randperm`` from ``job.generator`` when it starts, so draws an algorithm makes from the same
    generator between batches (FedClassAvg's augmentations) interleave as in a hand-written loop.
    """
    train = job.train
    n = job.num_train if size is None else size
    batch = train.batch_size if batch_size is None else batch_size
    stop = n - n % batch if (train.drop_last if drop_last is None else drop_last) else n
    for _ in range(train.local_epochs if epochs is None else epochs):
        order = torch.randperm(n, generator=job.generator).to(job.device)
        for start in range(0, stop, batch):
            yield order[start : start + batch]


def local_sgd(
    job: ClientJob,
    *,
    extra_loss: ExtraLoss | None = None,
    momentum_buffer: torch.Tensor | None = None,
) -> TrainStats:
    """Train ``job.model`` in place for ``job.epochs`` epochs of mini-batch SGD on cross-entropy.

    ``extra_loss(job, logits)`` adds an algorithm's term (WDR, a proximal term) to every
    mini-batch's loss. ``momentum_buffer`` (P floats) carries SGD momentum; pass a
    persistent one to keep momentum across rounds (FedAWA's clients do).
    With ``drop_last`` (the papers' loaders), a client with fewer samples than a batch
    takes no step, as in PFLlib.
    """
    model, flat = job.model, job.flat
    model.train()
    train = job.train
    if train.momentum and momentum_buffer is None:
        momentum_buffer = torch.zeros_like(flat.vector)
    lr = job.lr
    loss_sum = torch.zeros((), device=job.device)
    steps = 0
    for idx in minibatches(job):
        flat.zero_grad()
        logits = model(job.x_train[idx])
        loss = F.cross_entropy(logits, job.y_train[idx])
        extra = extra_loss(job, logits) if extra_loss is not None else None
        (loss if extra is None else loss + extra).backward()
        sgd_step(flat, lr, momentum=train.momentum, weight_decay=train.weight_decay, buffer=momentum_buffer)
        loss_sum += loss.detach()
        steps += 1
    return TrainStats(loss=float(loss_sum) / steps if steps else float("nan"), steps=steps)


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None
) -> EvalStats:
    """Correct predictions and summed cross-entropy of ``model`` on ``(x, y)``, ``batch_size`` samples
    per forward (default :func:`eval_batch_size` of their device)."""
    model.eval()
    batch_size = batch_size or eval_batch_size(x.device)
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    loss_sum = torch.zeros((), device=x.device)
    for start in range(0, int(y.shape[0]), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        correct += (logits.argmax(dim=1) == target).sum()
        loss_sum += F.cross_entropy(logits, target, reduction="sum")
    return EvalStats(correct=int(correct), loss_sum=float(loss_sum), count=int(y.shape[0]))


@torch.no_grad()
def features_before_output(
    model: torch.nn.Module, output_layer: str, x: torch.Tensor
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, features)`` per batch of ``x``: what ``model`` feeds its layer ``output_layer``
    (the penultimate features), read by a hook during an ordinary forward in eval mode."""
    model.eval()
    captured: list[torch.Tensor] = []
    hook = model.get_submodule(output_layer).register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    batch_size = eval_batch_size(x.device)
    try:
        for start in range(0, int(x.shape[0]), batch_size):
            model(x[start : start + batch_size])
            yield start, captured.pop()
    finally:
        hook.remove()
