"""What a stack of clients trains on, step by step: :class:`StackPlan`.

Every client's batches (:class:`~rayfed.train.batches.ClientBatches`), the clients ordered by their step counts,
longest first, so the clients still training are always a prefix of the stack; everything a step reads of it
reaches the device in one transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rayfed.train.batches import ClientBatches
from rayfed.train.host import to_device

__all__ = ["StackPlan"]


@dataclass(frozen=True)
class StackPlan:
    """Which samples every client of a stack trains on at every step, the clients ordered longest first."""

    order: list[int]
    """The clients' positions, by their step counts, longest first: the clients still training are a prefix."""
    steps: list[int]
    """Each client's step count, in the clients' order."""
    active: list[int]
    """At every stacked step, how many clients (a prefix of the stack) take a step."""
    batch: int
    index: torch.Tensor
    """(steps, batch, clients) sample indices into the clients' samples laid end to end, in stack order."""
    weight: torch.Tensor | None
    """(steps, batch, clients) 1 for a sample, 0 for padding; None when every batch is full."""
    draws: torch.Tensor | None
    """(steps, views, batch, clients, draws) each sample's view draws; None without augmentation."""
    back: torch.Tensor
    """For each client, its row in the stack."""
    order_index: torch.Tensor
    """:attr:`order` on the device: for each row of the stack, its client (the inverse of :attr:`back`)."""
    extra: list[torch.Tensor]
    """The host arrays :meth:`of` was asked to bring along, on the device."""

    @classmethod
    def of(
        cls,
        batches: Sequence[ClientBatches],
        sizes: Sequence[int],
        device: torch.device,
        extra: Sequence[np.ndarray] = (),
    ) -> StackPlan:
        """The plan of clients with ``batches`` over ``sizes`` samples each; ``extra`` host arrays ride along in
        the same transfer."""
        steps = [b.steps for b in batches]
        order = sorted(range(len(batches)), key=lambda c: -steps[c])
        longest, batch = (steps[order[0]] if order else 0), batches[0].index.shape[1]
        index = np.zeros((longest, batch, len(batches)), dtype=np.int64)
        weight = np.zeros((longest, batch, len(batches)), dtype=np.float32)
        draws = None
        if batches[0].draws is not None:
            views, width = batches[0].draws.shape[1], batches[0].draws.shape[3]
            draws = np.zeros((longest, views, batch, len(batches), width))
        offset = 0
        for column, c in enumerate(order):
            own = batches[c]
            index[: own.steps, :, column] = own.index + offset
            weight[: own.steps, :, column] = own.weight()
            if draws is not None and own.draws is not None:
                draws[: own.steps, :, :, column] = own.draws
            offset += sizes[c]
        padded = any(b.padded for b in batches)
        back = np.empty(len(batches), dtype=np.int64)
        back[order] = np.arange(len(batches))
        active = [sum(1 for c in order if steps[c] > s) for s in range(longest)]
        optional = [a for a in (weight if padded else None, draws) if a is not None]
        moved = to_device([index, back, np.asarray(order, np.int64), *optional, *extra], device)
        moved_index, moved_back, moved_order = moved[:3]
        moved_weight = moved[3] if padded else None
        moved_draws = moved[3 + padded] if draws is not None else None
        return cls(
            order,
            steps,
            active,
            batch,
            moved_index,
            moved_weight,
            moved_draws,
            moved_back,
            moved_order,
            moved[len(moved) - len(extra) :],
        )
