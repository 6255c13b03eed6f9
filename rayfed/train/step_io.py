"""What a training step reads and writes, and how it reaches the step: rebound, or copied into fixed storage.

A step (:mod:`rayfed.train.sequential`, :mod:`rayfed.train.stacked`) is a function of no arguments that
reads its batch, constants, carry and counters from a :class:`StepIO`. Run eagerly, each step's values are
simply rebound (a view of the block of batches, no copy). Replayed from a CUDA graph, the captured step
reads fixed storage, so each value is copied into the tensor the graph was captured on
(:class:`~rayfed.train.graphs.StepGraphs`): the same step function serves both.

It also holds the hooks' per-client functions: called directly on one client's tensors, or, for a stack,
under ``torch.func.vmap`` over the clients (:func:`per_client`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["StepIO", "per_client"]


class StepIO:
    """Named tensors a step reads; ``static`` ones keep their storage (a captured step reads them)."""

    def __init__(self, static: bool) -> None:
        self.static = static
        self.values: dict[str, Any] = {}

    def put(self, name: str, value: Any) -> None:
        """Make ``value`` what the step reads as ``name``: bound as it is, or copied into the fixed tensor
        (allocated like it at the first put)."""
        if not self.static or value is None or not isinstance(value, torch.Tensor):
            self.values[name] = value
            return
        held = self.values.get(name)
        if held is None:
            self.values[name] = value.clone()
        else:
            held.copy_(value)

    def put_all(self, prefix: str, values: dict[str, torch.Tensor]) -> None:
        for key, value in values.items():
            self.put(f"{prefix}{key}", value)

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        """The values put under ``prefix`` (a constants or carry dict), by their own names."""
        return {name[len(prefix) :]: value for name, value in self.values.items() if name.startswith(prefix)}

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def tensors(self, prefix: str = "") -> list[torch.Tensor]:
        return [v for k, v in self.values.items() if k.startswith(prefix) and isinstance(v, torch.Tensor)]


def per_client(fn: Callable[..., Any], in_dims: tuple[Any, ...], stacked: bool) -> Callable[..., Any]:
    """``fn`` of one client's tensors, applied to a stack of clients (``in_dims`` as ``torch.func.vmap`` takes
    them) when ``stacked``, else called as it is."""
    return torch.func.vmap(fn, in_dims=in_dims) if stacked else fn
