"""Evaluating a model on a client's test split, and reading its penultimate features."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "EvalStats", "eval_batch_size", "evaluate_model", "mean_cross_entropy", "correct_predictions",
    "features_before_output",
]


def eval_batch_size(device: torch.device) -> int:
    """Samples per forward when evaluating (no gradients are kept): 1024 on a GPU, which wants large
    batches; 128 on a CPU, where a larger batch's activations fall out of the caches and the same
    forward passes take up to 2x longer (benchmarks/README.md, "Evaluation batch on CPU")."""
    return 1024 if device.type == "cuda" else 128



@dataclass(frozen=True)
class EvalStats:
    correct: int
    loss_sum: float
    count: int

    @property
    def mean_loss(self) -> float:
        """The mean cross-entropy over the samples; NaN without samples."""
        return self.loss_sum / self.count if self.count else math.nan



@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None
) -> EvalStats:
    """Correct predictions and summed cross-entropy of ``model`` on ``(x, y)``, ``batch_size`` samples
    per forward (default :func:`eval_batch_size` of their device)."""
    model.eval()
    batch_size = batch_size or eval_batch_size(x.device)
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    loss_sum = torch.zeros((), device=x.device)
    for start in range(0, int(y.shape[0]), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        correct += (logits.argmax(dim=1) == target).sum()
        loss_sum += F.cross_entropy(logits, target, reduction="sum")
    return EvalStats(correct=int(correct), loss_sum=float(loss_sum), count=int(y.shape[0]))


@torch.no_grad()
def mean_cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of ``model`` (in eval mode) on ``(x, y)``, as a 0-d tensor on their device:
    nothing is read back, so a worker can read a whole call's values at once."""
    model.eval()
    batch_size = eval_batch_size(x.device)
    loss_sum = torch.zeros((), device=x.device)
    for start in range(0, int(y.shape[0]), batch_size):
        stop = start + batch_size
        loss_sum += F.cross_entropy(model(x[start:stop]), y[start:stop], reduction="sum")
    return loss_sum / max(int(y.shape[0]), 1)


@torch.no_grad()
def correct_predictions(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many of ``(x, y)`` ``model`` (in eval mode) predicts right, as a 0-d tensor on their device."""
    model.eval()
    batch_size = eval_batch_size(x.device)
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    for start in range(0, int(y.shape[0]), batch_size):
        stop = start + batch_size
        correct += (model(x[start:stop]).argmax(dim=1) == y[start:stop]).sum()
    return correct


@torch.no_grad()
def features_before_output(
    model: torch.nn.Module, output_layer: str, x: torch.Tensor
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, features)`` per batch of ``x``: what ``model`` feeds its layer ``output_layer``
    (the penultimate features), read by a hook during an ordinary forward in eval mode."""
    model.eval()
    captured: list[torch.Tensor] = []
    hook = model.get_submodule(output_layer).register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    batch_size = eval_batch_size(x.device)
    try:
        for start in range(0, int(x.shape[0]), batch_size):
            model(x[start : start + batch_size])
            yield start, captured.pop()
    finally:
        hook.remove()
