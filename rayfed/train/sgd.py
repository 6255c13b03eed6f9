"""Local SGD, the loop the whole simulator spends its time in.

No DataLoader: batches are index slices of tensors already on the device, and the SGD
update is one fused operation on the flat parameter vector (:mod:`rayfed.train.flat`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob, TrainStats

__all__ = ["ExtraLoss", "epoch_steps", "minibatches", "local_sgd", "sgd_step"]

ExtraLoss = Callable[[ClientJob, torch.Tensor], "torch.Tensor | None"]


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
    steps = epoch_steps(n, batch, train.drop_last if drop_last is None else drop_last)
    for _ in range(train.local_epochs if epochs is None else epochs):
        order = torch.randperm(n, generator=job.generator).to(job.device)
        for start in range(0, steps * batch, batch):
            yield order[start : start + batch]


def epoch_steps(n: int, batch: int, drop_last: bool) -> int:
    """Mini-batches of one pass over ``n`` samples: n // batch with ``drop_last``, else ⌈n / batch⌉.

    >>> epoch_steps(25, 10, True), epoch_steps(25, 10, False), epoch_steps(5, 10, True)
    (2, 3, 0)
    """
    return n // batch if drop_last else -(-n // batch)


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

