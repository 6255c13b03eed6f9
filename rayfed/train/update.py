"""The optimisers' updates, written once for one client's parameters and for a stack of them.

Every path that trains (one client at a time, a stack of clients, a step replayed from a CUDA graph)
updates parameters through these functions, which take their tensors as pieces (``torch._foreach`` ops): one
client's parameters tensor by tensor, each beside the gradient backward has just made for it (adding that
gradient into a flat buffer first would cost a pass over the model a step), or a stack's as one flat block.
The learning rate and Adam's per-step scalars are 0-d tensors, so a captured step reads the values of the
round and step it replays; the arithmetic is ``torch.optim``'s, operation for operation, so the same gradients
give the same parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
import torch

__all__ = ["OptimizerState", "sgd_update", "adam_update", "adam_scalars"]


@dataclass
class OptimizerState:
    """An optimiser's buffers for one tensor it updates (or a stack of them): SGD's momentum, Adam's moments."""

    momentum: torch.Tensor | None = None
    exp_avg: torch.Tensor | None = None
    exp_avg_sq: torch.Tensor | None = None

    @classmethod
    def zeros(cls, kind: Literal["momentum", "adam", "none"], like: torch.Tensor) -> OptimizerState:
        """A new optimiser's buffers for ``like``: zero, as torch's SGD and Adam start them."""
        if kind == "adam":
            return cls(exp_avg=torch.zeros_like(like), exp_avg_sq=torch.zeros_like(like))
        return cls(momentum=torch.zeros_like(like)) if kind == "momentum" else cls()

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.momentum, self.exp_avg, self.exp_avg_sq) if t is not None]

    def copy(self) -> OptimizerState:
        return OptimizerState(
            *(None if t is None else t.clone() for t in (self.momentum, self.exp_avg, self.exp_avg_sq))
        )

    def refill(self, other: OptimizerState) -> None:
        """Copy ``other``'s values into the buffers held (a captured step reads them)."""
        for f in fields(self):
            held, value = getattr(self, f.name), getattr(other, f.name)
            if held is not None and value is not None and held.shape == value.shape:
                held.copy_(value)
            else:
                setattr(self, f.name, None if value is None else value.clone())


def sgd_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    lr: torch.Tensor,
    *,
    momentum: float,
    weight_decay: float,
    buffers: list[torch.Tensor] | None,
) -> None:
    """One step of ``torch.optim.SGD`` (dampening 0, no Nesterov) on ``params`` in place.

    ``params``, ``grads`` and the momentum ``buffers`` are pieces of one another's shapes: one client's parameters
    tensor by tensor, or a stack's as one flat tensor. With weight decay g <- g + wd·w; with momentum b <- m·b + g
    and w <- w − lr·b, else w <- w − lr·g. A zero buffer gives b = g at the first step, as torch's SGD does.
    ``lr`` is a 0-d tensor.
    """
    if weight_decay:
        grads = list(torch._foreach_add(grads, params, alpha=weight_decay))
    if momentum:
        if buffers is None:
            raise ValueError("momentum > 0 needs a momentum buffer")
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, grads)
        grads = buffers
    torch._foreach_addcmul_(params, grads, [lr] * len(params), value=-1.0)


def adam_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    betas: tuple[float, float],
    eps: float,
    scalars: torch.Tensor,
) -> None:
    """One step of ``torch.optim.Adam`` (no weight decay, no amsgrad) on ``params`` in place, pieces as in
    :func:`sgd_update`.

    ``scalars`` holds the step's (√(1 − β2^t), −lr / (1 − β1^t)) (:func:`adam_scalars`): m <- β1·m + (1 − β1)·g,
    v <- β2·v + (1 − β2)·g², w <- w − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε). A parameter whose
    gradient is zero does not move while its moments are zero (as torch's Adam leaves one without a
    gradient).
    """
    beta1, beta2 = betas
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denoms, scalars[0])
    torch._foreach_add_(denoms, eps)
    steps = torch._foreach_mul(exp_avgs, scalars[1])
    torch._foreach_div_(steps, denoms)
    torch._foreach_add_(params, steps)


def adam_scalars(lr: float, betas: tuple[float, float], steps: int) -> np.ndarray:
    """(steps, 2) float32: each step t's √(1 − β2^t) and −lr / (1 − β1^t), computed in double as torch's Adam does."""
    beta1, beta2 = betas
    out = np.empty((steps, 2), dtype=np.float32)
    for t in range(1, steps + 1):
        out[t - 1] = (math.sqrt(1 - beta2**t), -lr / (1 - beta1**t))
    return out
