"""Dropout whose masks belong to the client: the same masks whether it trains alone or in a stack.

``nn.Dropout`` draws its masks from torch's global generator, one draw over the whole activation. A
stack of C clients shares that activation (client c's channels at c·channels), so one draw would give
each client masks that depend on the stack. Here a mask element is a hash of (the client's seed, the
phase, the layer, the step, the element's index in the client's own activation): a counter-based
stream, the same for the client alone and in any stack, drawn on the device with no generator, so a
CUDA graph replays it. Within a step and layer the elements are independent Bernoulli(1 − p) draws;
kept elements are scaled by 1 / (1 − p), as ``nn.Dropout`` scales them.

:func:`client_dropout` drives every dropout layer of a module this way while training runs;
``nn.Dropout`` drops elements, ``nn.Dropout2d`` whole channels of a sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["SEEDED_DROPOUT", "client_dropout", "dropout_mask", "signed_seed"]

SEEDED_DROPOUT = (nn.Dropout, nn.Dropout2d)
"""The dropout layers with client masks; a model with another kind cannot train stacked."""

_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def signed_seed(seed: int) -> int:
    """A client's generator seed as an int64 (seeds are up to 64 bits)."""
    return _signed(seed)


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors (multiplication wraps modulo 2^64)."""
    x = (x ^ _shift(x, 30)) * _signed(_MIX1)
    x = (x ^ _shift(x, 27)) * _signed(_MIX2)
    return x ^ _shift(x, 31)


def dropout_mask(
    seeds: torch.Tensor,
    step: torch.Tensor,
    layer: int,
    shape: tuple[int, ...],
    p: float,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """(clients, *shape) masks, ``1 / (1 − p)`` where an element is kept and 0 where it is dropped: client c's
    mask of the step ``step`` (a 0-d int64 tensor, or one per client) for an activation of ``shape`` at the
    ``layer``-th dropout. ``rows`` (shape[0],) numbers the activation's rows (default 0, 1, ...): a row keeps its
    mask whatever else is in its batch.

    >>> seeds = torch.tensor([5, 7])
    >>> m = dropout_mask(seeds, torch.tensor(0), 0, (1000,), 0.5)
    >>> alone = dropout_mask(seeds[1:], torch.tensor(0), 0, (1000,), 0.5)[0]
    >>> m.shape, bool(((m == 0) | (m == 2)).all()), torch.equal(m[1], alone)
    (torch.Size([2, 1000]), True, True)
    """
    per_row = 1
    for size in shape[1:]:
        per_row *= size
    index = torch.arange(shape[0] * per_row, device=seeds.device, dtype=torch.int64)
    if rows is not None:  # the element's index in the numbered rows
        index = (rows.view(-1, 1) * per_row + torch.arange(per_row, device=seeds.device)).reshape(-1)
    key = _mix(seeds * _signed(_GOLDEN) + _signed((layer + 1) * _MIX1)) + step * _signed(_MIX2)
    bits = _mix(key.view(-1, 1) + index * _signed(_GOLDEN))
    uniform = _shift(bits, 40).to(torch.float32) * (1.0 / (1 << 24))
    return ((uniform >= p).to(torch.float32) * (1.0 / (1.0 - p))).view(-1, *shape)


def _seeded(layer: nn.Module, index: int, current: Mapping[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    channelwise = isinstance(layer, nn.Dropout2d)
    p = float(layer.p)  # type: ignore[arg-type]

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not layer.training or p == 0.0:
            return x
        seeds, width = current["seeds"], current["width"]
        per_client = (x.shape[0], x.shape[1] // width, *x.shape[2:])  # clients stacked along dimension 1
        drawn = per_client[:2] if channelwise else per_client
        mask = dropout_mask(seeds, current["step"], index, drawn, p, _row_numbers(x.shape[0], current))
        mask = mask.movedim(0, 1).reshape(x.shape[0], x.shape[1], *drawn[2:])
        if channelwise:
            mask = mask.view(*mask.shape, *([1] * (x.dim() - 2)))
        return x * mask

    return forward


def _row_numbers(rows: int, current: Mapping[str, Any]) -> torch.Tensor | None:
    """The rows of ``views`` views of a batch, numbered as in a full batch of ``batch`` samples (view v's sample j is
    row v·batch + j), so a short batch keeps a full one's masks; None when the batch is full."""
    views, batch = current.get("views", 1), current.get("batch", rows)
    size = rows // views
    if size == batch:
        return None
    index = torch.arange(rows, device=current["seeds"].device)
    return (index // size) * batch + index % size


@contextmanager
def client_dropout(module: nn.Module) -> Iterator[dict[str, Any]]:
    """Drive ``module``'s dropout layers with client masks while the block runs. The caller fills the mapping
    yielded: ``seeds`` (the clients' int64 seeds, in stack order), ``width`` (how many of them train),
    ``step`` (a 0-d int64 tensor, the step within the phase; one per client in a packed stack), and ``views`` and
    ``batch`` (the phase's views of its batches of ``batch`` samples); the phase's index goes into the seeds."""
    current: dict[str, Any] = {}
    layers = [layer for layer in module.modules() if isinstance(layer, SEEDED_DROPOUT)]
    for index, layer in enumerate(layers):
        layer.forward = _seeded(layer, index, current)  # type: ignore[method-assign,assignment]
    try:
        yield current
    finally:
        for layer in layers:
            del layer.forward
