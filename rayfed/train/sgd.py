"""Local SGD, the loop the whole simulator spends its time in.

No DataLoader: a client's batches are drawn once (:func:`step_batches`: one permutation per
epoch, moved to the device in one transfer) and gathered from its data, which is already on the
device, one block of steps at a time; the SGD update is one fused operation on the flat parameter
vector (:mod:`rayfed.train.flat`). Nothing in the step loop reads a value back to the host: the
losses stay on the device and the worker reads them once per call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob, TrainStats

if TYPE_CHECKING:
    from rayfed.config import TrainConfig

__all__ = [
    "ExtraLoss", "minibatches", "epoch_orders", "epoch_steps", "steps_per_epoch", "step_batches", "local_sgd",
    "sgd_step", "mean_loss", "unit",
]

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
    stop = n - n % batch if (train.drop_last if drop_last is None else drop_last) else n
    for _ in range(train.local_epochs if epochs is None else epochs):
        order = torch.randperm(n, generator=job.generator).to(job.device)
        for start in range(0, stop, batch):
            yield order[start : start + batch]


def epoch_orders(job: ClientJob) -> list[torch.Tensor]:
    """One permutation of the client's training samples per local epoch, drawn from ``job.generator`` on the
    CPU whatever the device, so a client trains on the same batches everywhere."""
    return [torch.randperm(job.num_train, generator=job.generator) for _ in range(job.train.local_epochs)]


def epoch_steps(train: TrainConfig, num_train: int) -> tuple[int, int]:
    """(samples in an epoch's full batches, samples in its short last batch: 0 with ``drop_last``)."""
    stop = num_train - num_train % train.batch_size if train.drop_last else num_train
    return stop - stop % train.batch_size, stop % train.batch_size


def steps_per_epoch(n: int, batch: int, drop_last: bool) -> int:
    """Mini-batches of one pass over ``n`` samples: n // batch with ``drop_last``, else ⌈n / batch⌉.

    >>> steps_per_epoch(25, 10, True), steps_per_epoch(25, 10, False), steps_per_epoch(5, 10, True)
    (2, 3, 0)
    """
    return n // batch if drop_last else -(-n // batch)


def step_batches(job: ClientJob) -> list[torch.Tensor]:
    """Every step's sample indices, as :func:`minibatches` draws them, in blocks of equal-size batches:
    each block is a (steps, batch) index tensor on the job's device, reached in one transfer.

    With ``drop_last`` (or sizes that divide evenly) all epochs form one block; otherwise each epoch
    ends with a block of its one short batch.
    """
    orders, batch = epoch_orders(job), job.train.batch_size
    full, short = epoch_steps(job.train, job.num_train)
    if not short:
        steps = torch.cat([order[:full] for order in orders]) if len(orders) > 1 else orders[0][:full]
        return [steps.to(job.device).view(-1, batch)] if full else []
    pieces = [part for order in orders for part in (order[:full], order[full : full + short])]
    shapes = [(-1, batch), (1, short)] * len(orders)
    on_device = torch.cat(pieces).to(job.device).split([len(piece) for piece in pieces])
    return [block.view(shape) for block, shape in zip(on_device, shapes) if block.numel()]


_UNITS: dict[torch.device, torch.Tensor] = {}


def unit(device: torch.device) -> torch.Tensor:
    """The scalar 1 on ``device``, made once: the gradient a loss's backward starts from (``backward()``
    would make a new one every step)."""
    if device not in _UNITS:
        _UNITS[device] = torch.ones((), device=device)
    return _UNITS[device]


def mean_loss(losses: list[torch.Tensor]) -> torch.Tensor | float:
    """The mean of the steps' losses, as a tensor on their device (NaN without a step: a float)."""
    if not losses:
        return float("nan")
    with torch.no_grad():
        return torch.stack(losses).mean()


def local_sgd(
    job: ClientJob,
    *,
    extra_loss: ExtraLoss | None = None,
    momentum_buffer: torch.Tensor | None = None,
) -> TrainStats:
    """Train ``job.model`` in place for ``train.local_epochs`` epochs of mini-batch SGD on cross-entropy.

    ``extra_loss(job, logits)`` adds an algorithm's term (WDR, a proximal term) to every
    mini-batch's loss. ``momentum_buffer`` (P floats) carries SGD momentum; pass a
    persistent one to keep momentum across rounds (FedAWA's clients do).
    With ``drop_last`` (the papers' loaders), a client with fewer samples than a batch
    takes no step, as in PFLlib. The reported loss is a tensor on the job's device.
    """
    model, flat = job.model, job.flat
    model.train()
    train = job.train
    if train.momentum and momentum_buffer is None:
        momentum_buffer = torch.zeros_like(flat.vector)
    lr, one = job.lr, unit(job.device)
    losses: list[torch.Tensor] = []
    for block in step_batches(job):
        for x, y in zip(job.x_train[block], job.y_train[block]):  # one gather per block of steps
            flat.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            extra = extra_loss(job, logits) if extra_loss is not None else None
            (loss if extra is None else loss + extra).backward(one)
            sgd_step(flat, lr, momentum=train.momentum, weight_decay=train.weight_decay, buffer=momentum_buffer)
            losses.append(loss)
    return TrainStats(loss=mean_loss(losses), steps=len(losses))
