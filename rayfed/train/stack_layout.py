"""The layouts a stack of clients' parameters takes, and the conversions between them.

* client-major: the clients' flat vectors (C, P), one row per client (what a worker holds and uploads);
* parameter-major: one vector of every client's copy of parameter 0, then of parameter 1, ...
  (:meth:`~rayfed.train.layout.ParamLayout.stacked_views`): the stack a stacked step trains, in which the C kernels
  of a convolution are one grouped kernel without a copy (:func:`parameter_major`, :func:`client_major`,
  :func:`first_models`);
* logical: each client's parameters in their logical order, channels-last kernels as (O, I, H, W)
  (:func:`logical_rows`), what a phase's loss reads;
* a part of a layout, as a vector of its own (:func:`sub_layout`): the range a phase trains.
"""

from __future__ import annotations

import torch

from rayfed.train.layout import ParamLayout

__all__ = ["parameter_major", "client_major", "first_models", "logical_rows", "sub_layout"]


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


def logical_rows(rows: torch.Tensor, layout: ParamLayout) -> torch.Tensor:
    """(C, P) flat vectors (channels-last kernels) as their parameters in logical order, one row per client:
    what ``flatten_logically`` makes of one client's parameter tensors."""
    return torch.cat([view.reshape(len(rows), -1) for view in layout.views(rows[:, : layout.size])], dim=1)


def sub_layout(layout: ParamLayout, lo: int, hi: int) -> ParamLayout:
    """The layout of the parameters in [lo, hi) of ``layout``'s vector, as a vector of their own."""
    first, last = layout.offsets.index(lo), layout.offsets.index(hi)
    return ParamLayout(
        layout.names[first:last],
        layout.shapes[first:last],
        tuple(o - lo for o in layout.offsets[first : last + 1]),
        layout.channels_last[first:last] if layout.channels_last else (),
    )
