"""The default local-SGD loop with every step replayed from a CUDA graph, one client at a time.

:class:`ReplayedSGD` trains as :func:`~rayfed.train.sgd.local_sgd` does (same batches, same
cross-entropy, same SGD update) for a client half that adds no loss term, but writes each batch
into a workspace whose storage never moves and runs the step over it through
:class:`~rayfed.train.graphs.StepGraphs`: captured once per model and batch shape on a GPU and
replayed, run as it is on a CPU. The learning rate is a tensor of the workspace, so one captured
step serves every round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob, TrainStats
from rayfed.train.sgd import step_batches, unit

__all__ = ["ReplayedSGD"]


@dataclass
class _Workspace:
    """One model's step state: the batch it reads, and what it accumulates."""

    x: torch.Tensor
    y: torch.Tensor
    lr: torch.Tensor
    loss_sum: torch.Tensor
    momentum: torch.Tensor | None


class ReplayedSGD:
    """Local SGD over a worker's models, each step from a captured graph where ``graphs`` captures."""

    def __init__(self, graphs: StepGraphs) -> None:
        self.graphs = graphs
        self._spaces: dict[Hashable, _Workspace] = {}
        self._totals: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def train(self, job: ClientJob) -> TrainStats:
        """Train ``job.model`` in place as :func:`~rayfed.train.sgd.local_sgd` (without an extra loss) does."""
        flat, train = job.flat, job.train
        flat.module.train()
        lr, loss_sum, momentum = self._state(flat, bool(train.momentum))
        with torch.no_grad():
            lr.fill_(job.lr)
            loss_sum.zero_()
            if momentum is not None:
                momentum.zero_()
        steps = 0
        for block in step_batches(job):
            space = self._space(flat, job, block.shape[1])
            step = self._step(flat, space, job)
            mutable = [flat.vector, flat.buffers, loss_sum, *([] if momentum is None else [momentum])]
            for x, y in zip(job.x_train[block], job.y_train[block]):
                space.x.copy_(x)
                space.y.copy_(y)
                self.graphs.run((id(flat), tuple(space.x.shape)), step, mutable)
                steps += 1
        return TrainStats(loss=loss_sum / steps if steps else math.nan, steps=steps)

    def _state(self, flat: FlatModel, momentum: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The learning rate, loss sum and momentum buffer of ``flat``'s steps, shared by its batch shapes (a
        run's clients all train with or all without momentum)."""
        if id(flat) not in self._totals:
            device = flat.vector.device
            self._totals[id(flat)] = (torch.empty((), device=device), torch.empty((), device=device),
                                      torch.empty_like(flat.vector) if momentum else None)
        return self._totals[id(flat)]

    def _space(self, flat: FlatModel, job: ClientJob, batch: int) -> _Workspace:
        key = (id(flat), batch, tuple(job.x_train.shape[1:]), job.x_train.dtype)
        if key not in self._spaces:
            lr, loss_sum, momentum = self._state(flat, bool(job.train.momentum))
            self._spaces[key] = _Workspace(job.x_train.new_empty(batch, *job.x_train.shape[1:]),
                                           job.y_train.new_empty(batch), lr, loss_sum, momentum)
        return self._spaces[key]

    @staticmethod
    def _step(flat: FlatModel, space: _Workspace, job: ClientJob) -> Callable[[], None]:
        """One SGD step of ``flat`` on the batch in ``space``: ``sgd_step`` with the learning rate a tensor."""
        model, train, one = flat.module, job.train, unit(flat.vector.device)

        def step() -> None:
            flat.zero_grad()
            loss = F.cross_entropy(model(space.x), space.y)
            loss.backward(one)
            with torch.no_grad():
                grad = flat.grad
                if train.weight_decay:
                    grad = grad.add(flat.vector, alpha=train.weight_decay)
                if space.momentum is not None:
                    space.momentum.mul_(train.momentum).add_(grad)
                    grad = space.momentum
                flat.vector.addcmul_(grad, space.lr, value=-1.0)
                space.loss_sum.add_(loss.detach())

        return step
