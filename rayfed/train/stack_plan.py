"""What a stack of clients trains on, step by step, and its stack of parameters in the layout a step reads.

* :class:`StackPlan`: every client's batches, the clients ordered by their step counts, longest first,
  so the clients still training are always a prefix of the stack;
* :func:`parameter_major` / :func:`client_major`: the clients' flat vectors (C, P), one per client,
  and the parameter-major stack a step trains (every client's copy of parameter 0, then of
  parameter 1, ...: :meth:`ParamLayout.stacked_views`), in which the C kernels of a convolution
  are one grouped kernel without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.sgd import epoch_steps

__all__ = ["StackPlan", "parameter_major", "client_major", "first_models"]


@dataclass(frozen=True)
class StackPlan:
    """Which samples every client of a stack trains on at every step, the clients ordered longest first."""

    order: list[int]
    """The jobs' positions, by their step counts, longest first: the clients still training are a prefix."""
    back: torch.Tensor
    """For each job, its row in the stack."""
    steps: list[int]
    """Each job's step count."""
    active: list[int]
    """At every stacked step, how many clients (a prefix of the stack) take a step."""
    index: torch.Tensor
    """(steps, batch, clients) sample indices into the clients' data laid end to end, in stack order."""
    weight: torch.Tensor | None
    """(steps, batch, clients) 1 for a sample, 0 for padding; None when every batch is full."""
    batch: int

    @classmethod
    def of(cls, jobs: Sequence[ClientJob], orders: Sequence[list[torch.Tensor]], device: torch.device) -> StackPlan:
        """The plan of ``jobs`` from their epoch permutations, built on the host and moved to ``device``."""
        train = jobs[0].train
        batch = train.batch_size
        host = torch.cat([order for client in orders for order in client]).numpy()  # every permutation, read once
        per_epoch, steps, cursor = [], [], 0
        for job, client_orders in zip(jobs, orders):
            full, short = epoch_steps(train, job.num_train)
            epochs = []
            for _ in client_orders:
                epochs.append((host[cursor : cursor + full], host[cursor + full : cursor + full + short]))
                cursor += job.num_train
            per_epoch.append(epochs)
            steps.append(len(client_orders) * (full // batch + (1 if short else 0)))
        order = sorted(range(len(jobs)), key=lambda c: -steps[c])
        longest = steps[order[0]] if order else 0
        index = np.zeros((longest, batch, len(jobs)), dtype=np.int64)
        weight = np.zeros((longest, batch, len(jobs)), dtype=np.float32)
        offset = 0
        sizes = {c: jobs[c].num_train for c in order}
        for column, c in enumerate(order):
            s = 0
            for whole, tail in per_epoch[c]:
                rows = len(whole) // batch
                index[s : s + rows, :, column] = whole.reshape(rows, batch) + offset
                weight[s : s + rows, :, column] = 1.0
                s += rows
                if len(tail):
                    index[s, : len(tail), column] = tail + offset
                    weight[s, : len(tail), column] = 1.0
                    s += 1
            offset += sizes[c]
        padded = any(len(tail) for epochs in per_epoch for _, tail in epochs)
        back = np.empty(len(jobs), dtype=np.int64)
        back[order] = np.arange(len(jobs))
        active = [sum(1 for c in order if steps[c] > s) for s in range(longest)]
        return cls(order, torch.from_numpy(back), steps, active, torch.from_numpy(index).to(device),
                   torch.from_numpy(weight).to(device) if padded else None, batch)

    def step_counts(self, device: torch.device) -> torch.Tensor:
        """Each job's step count (at least 1, to divide by), on ``device``."""
        return torch.tensor([max(n, 1) for n in self.steps], dtype=torch.float32, device=device)


def parameter_major(stack: torch.Tensor, layout: ParamLayout) -> torch.Tensor:
    """The (C, P) client-major ``stack`` of flat vectors as one parameter-major vector
    (:meth:`ParamLayout.stacked_views`)."""
    out = stack.new_empty(stack.numel())
    for target, values in zip(layout.stacked_views(out, len(stack)), layout.views(stack)):
        target.copy_(values)
    return out


def client_major(stack: torch.Tensor, layout: ParamLayout, width: int) -> torch.Tensor:
    """The inverse of :func:`parameter_major` for ``width`` models: their (width, P) flat vectors."""
    out = stack.new_empty(width, layout.size)
    for target, values in zip(layout.views(out), layout.stacked_views(stack, width)):
        target.copy_(values)
    return out


def first_models(stack: torch.Tensor, layout: ParamLayout, width: int, keep: int) -> torch.Tensor:
    """The parameter-major stack of the first ``keep`` of its ``width`` models."""
    return torch.cat([view[:keep].reshape(-1) for view in layout.stacked_views(stack, width)])
