"""Which samples a client trains on at every step of a phase, drawn on the host as a hand-written loop draws them.

A phase of ``epochs`` passes over ``n`` samples in batches of ``batch``: each pass draws one permutation
from the client's generator when it starts, and cuts it into batches; with ``drop_last`` a short last
batch is skipped (the papers' loaders: a client with fewer samples than a batch takes no step, as in
PFLlib), else it is a step of its own. A phase with random views (FedClassAvg's augmentations) draws each
batch's views from the same generator right after the batch is cut, so the generator's stream is the
one a loop that augments as it goes would use. Everything is drawn on the CPU, so a client trains on the
same batches on any device, in any stack, on any worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from rayfed.data.augment import AUGMENT_DRAWS, AugmentConfig, draw_augment
from rayfed.train.host import host_values

__all__ = ["ClientBatches", "draw_batches", "steps_per_epoch"]


N = TypeVar("N", int, np.ndarray)


def steps_per_epoch(n: N, batch: int, drop_last: bool) -> N:
    """Mini-batches of one pass over ``n`` samples (a count, or an array of counts): n // batch with ``drop_last``,
    else ⌈n / batch⌉.

    >>> steps_per_epoch(25, 10, True), steps_per_epoch(25, 10, False), steps_per_epoch(5, 10, True)
    (2, 3, 0)
    """
    return n // batch if drop_last else -(-n // batch)


@dataclass(frozen=True)
class ClientBatches:
    """One client's batches in one phase."""

    index: np.ndarray
    """(steps, batch) int64 indices into the phase's samples; a short step's unused places hold 0."""
    sizes: np.ndarray
    """(steps,) how many of a step's places are samples (``batch`` but for a short last batch)."""
    draws: np.ndarray | None
    """(steps, views, batch, :data:`~rayfed.data.augment.AUGMENT_DRAWS`) each sample's view draws; None
    without augmentation."""

    @property
    def steps(self) -> int:
        return len(self.sizes)

    @property
    def padded(self) -> bool:
        """Whether some step is short (a stack then weighs its padding 0)."""
        return bool(len(self.sizes)) and int(self.sizes.min()) < self.index.shape[1]

    def first(self, steps: int) -> ClientBatches:
        """The first ``steps`` of these batches (all of them when there are no more)."""
        if steps >= self.steps:
            return self
        draws = None if self.draws is None else self.draws[:steps]
        return ClientBatches(self.index[:steps], self.sizes[:steps], draws)

    def weight(self) -> np.ndarray:
        """(steps, batch) float32: 1 for a sample, 0 for an unused place."""
        return (np.arange(self.index.shape[1])[None, :] < self.sizes[:, None]).astype(np.float32)


def draw_batches(
    clients: Sequence[tuple[torch.Generator, int]],
    *,
    epochs: int,
    batch: int,
    drop_last: bool,
    views: int = 1,
    augment: AugmentConfig | None = None,
    image_size: tuple[int, ...] = (0, 0),
) -> list[ClientBatches]:
    """The batches of ``epochs`` shuffled passes over each client's ``n`` samples, drawn from its generator; with
    ``augment``, each batch's ``views`` random views of its images of ``image_size`` (height, width). Without
    augmentation the permutations of all clients come to numpy at once."""
    per_epoch = [steps_per_epoch(n, batch, drop_last) for _, n in clients]
    if augment is None:
        orders = [torch.randperm(n, generator=generator) for generator, n in clients for _ in range(epochs)]
        host = host_values(torch.cat(orders)) if orders else np.zeros(0, np.int64)
        out, cursor = [], 0
        for (_, n), steps in zip(clients, per_epoch):
            batches = _empty(epochs * steps, batch, views, augment)
            for epoch in range(epochs):
                _cut(batches, host[cursor : cursor + n], epoch * steps, steps, batch)
                cursor += n
            out.append(batches)
        return out
    out = []
    for (generator, n), steps in zip(clients, per_epoch):
        batches = _empty(epochs * steps, batch, views, augment)
        for epoch in range(epochs):
            first = epoch * steps
            _cut(batches, host_values(torch.randperm(n, generator=generator)), first, steps, batch)
            assert batches.draws is not None
            height, width = image_size[-2:]
            for s in range(first, first + steps):  # the views of each batch, drawn right after it, in order
                size = int(batches.sizes[s])
                for v in range(views):
                    batches.draws[s, v, :size] = host_values(draw_augment(size, height, width, generator, augment))
        out.append(batches)
    return out


def _empty(steps: int, batch: int, views: int, augment: AugmentConfig | None) -> ClientBatches:
    draws = np.zeros((steps, views, batch, AUGMENT_DRAWS)) if augment is not None else None
    return ClientBatches(np.zeros((steps, batch), dtype=np.int64), np.full(steps, batch, dtype=np.int64), draws)


def _cut(batches: ClientBatches, order: np.ndarray, first: int, steps: int, batch: int) -> None:
    """One epoch's permutation ``order`` as its ``steps`` batches, from step ``first`` on (a short last one at
    the end, when ``steps`` holds one)."""
    full = len(order) // batch
    batches.index[first : first + full] = order[: full * batch].reshape(full, batch)
    if steps > full:
        batches.index[first + full, : len(order) - full * batch] = order[full * batch :]
        batches.sizes[first + full] = len(order) - full * batch
